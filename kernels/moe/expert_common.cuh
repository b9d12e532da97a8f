// What both variants of the grouped expert products share, compiled in front of each
// (moe/experts.cu, moe/experts_mma.cu): the activation codes of the host's enum, the activation,
// the input row of a row of an expert's pass, and which passes a block takes.

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

// The passes of this block: its expert is first_local + blockIdx.y, and blockIdx.x is column
// tile col_tile's split s of `splits`, which takes the passes of pass_rows rows starting at
// sorted rows first, first + stride, ... before `end`. Splitting is invisible in the outputs: a
// row's bits depend on its token and expert only.
struct ExpertPasses {
    int col_tile, first, stride, end;
};

__device__ __forceinline__ ExpertPasses expert_passes(
    const int* expert_starts, int first_local, int splits, int pass_rows) {
    const int e = first_local + blockIdx.y, s = blockIdx.x % splits;
    return ExpertPasses{(int)blockIdx.x / splits, expert_starts[e] + s * pass_rows,
                        splits * pass_rows, expert_starts[e + 1]};
}
