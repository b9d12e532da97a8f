// What both variants of the grouped expert products share, compiled in front of each
// (moe/experts.cu, moe/experts_mma.cu): the activation codes of the host's enum, the activation,
// the input rows of an expert's pass, and which passes a block takes.

#define MOE_ACT_SWIGLU 0
#define MOE_ACT_RELU2 1

// The activation of an expert's up (and gate) outputs: silu(gate) * up, or relu(up)^2 (the
// CPU's mul_silu_inplace and relu2_inplace).
__device__ __forceinline__ float expert_activation(int activation, float up, float gate) {
    if (activation == MOE_ACT_SWIGLU) return mul(up, silu(gate));
    float r = fmaxf(up, 0.0f);
    return mul(r, r);
}

// The input rows of the pass at sorted row `base` of an expert whose rows end at `end` (the
// prelude's DenseRows says how the stagings read them): each row's token's row of `in`
// [tokens, width], from the pair the sort placed there (the up products).
struct TokenRows {
    const float* in;
    const int* sorted_pairs;
    int width, base, end, top_k;
    __device__ __forceinline__ int key(int r) const {
        return base + r < end ? sorted_pairs[base + r] : -1;
    }
    __device__ __forceinline__ const float* at(int pair) const {
        return pair < 0 ? nullptr : in + (u64)(pair / top_k) * width;
    }
};

// The same pass's rows of `in` [pairs, width] in sorted order (the down products, over the up
// products' activations).
struct SortedRows {
    const float* in;
    int width, base, end;
    __device__ __forceinline__ int key(int r) const { return base + r < end ? base + r : -1; }
    __device__ __forceinline__ const float* at(int row) const {
        return row < 0 ? nullptr : in + (u64)row * width;
    }
};

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
