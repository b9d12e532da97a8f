// What both variants of the grouped expert products share, compiled in front of each
// (moe/experts.cu, moe/experts_mma.cu): the activation codes of the host's enum, the activation,
// and the input row of a row of an expert's pass.

#define MOE_ACT_SWIGLU 0
#define MOE_ACT_RELU2 1

// The activation of an expert's up (and gate) outputs: silu(gate) * up, or relu(up)^2 (the
// CPU's mul_silu_inplace and relu2_inplace).
__device__ __forceinline__ float expert_activation(int activation, float up, float gate) {
    if (activation == MOE_ACT_SWIGLU) return mul(up, silu(gate));
    float r = fmaxf(up, 0.0f);
    return mul(r, r);
}

// The input row of row r of the pass at sorted row `base` (null past the expert's last row,
// `end`): RowOf maps (sorted row, pair) to a row of `in`.
template <typename RowOf>
__device__ __forceinline__ const float* expert_pass_row(
    const float* in, int width, const int* sorted_pairs, int base, int end, RowOf row_of, int r) {
    const int row = base + r;
    return row < end ? in + (u64)row_of(row, sorted_pairs[row]) * width : nullptr;
}
