// What the grouped expert products share, compiled in front of both variants (moe/experts.cu,
// moe/experts_mma.cu): the sorted rows come in tiles of MOE_TILE_ROWS rows of one expert
// (moe/align.cu pads every expert to it), and the activation codes of the host's enum.

#define MOE_TILE_ROWS 4
#define MOE_ACT_SWIGLU 0
#define MOE_ACT_RELU2 1

// The activation of an expert's up (and gate) outputs: silu(gate) * up, or relu(up)^2 (the
// CPU's mul_silu_inplace and relu2_inplace).
__device__ __forceinline__ float expert_activation(int activation, float up, float gate) {
    if (activation == MOE_ACT_SWIGLU) return mul(up, silu(gate));
    float r = fmaxf(up, 0.0f);
    return mul(r, r);
}
