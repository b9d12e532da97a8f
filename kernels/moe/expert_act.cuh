// The activation codes of the host's enum and the activation itself, compiled in front of both
// variants of the grouped expert products (moe/experts.cu, moe/experts_mma.cu).

#define MOE_ACT_SWIGLU 0
#define MOE_ACT_RELU2 1

// The activation of an expert's up (and gate) outputs: silu(gate) * up, or relu(up)^2 (the
// CPU's mul_silu_inplace and relu2_inplace).
__device__ __forceinline__ float expert_activation(int activation, float up, float gate) {
    if (activation == MOE_ACT_SWIGLU) return mul(up, silu(gate));
    float r = fmaxf(up, 0.0f);
    return mul(r, r);
}
