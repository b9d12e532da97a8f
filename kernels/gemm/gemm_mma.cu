// Matrix products in bf16 precision on tensor cores (`--matmul-precision bf16`): out[m, n] =
// bf16(x[m, :]) . w[n, :] with bf16 weights [n, k] and f32 accumulation (gemm/mma_tile.cuh has
// the arithmetic and why a row's bits never depend on the batch).
//
// Block: MMA_WARPS warps side by side along n, each MMA_COLS output columns by MMA_ROW_GROUPS
// groups of MMA_ROWS input rows. Grid: (ceil(m / (MMA_ROW_GROUPS * MMA_ROWS)),
// ceil(n / (MMA_WARPS * MMA_COLS))), row blocks fastest so that the blocks reading the same
// weights run together (gemm.cu).

extern "C" __global__ void __launch_bounds__(128) gemm_bf16w_mma(
    const float* __restrict__ x,   // device [m, k]
    const bf16_t* __restrict__ w,  // device [n, k]
    float* __restrict__ out,       // device [m, n]
    int m_rows, int n_cols, int k) {
    const int lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
    const int n0 = (blockIdx.y * MMA_WARPS + threadIdx.x / 32) * MMA_COLS;
    const int m0 = blockIdx.x * MMA_ROW_GROUPS * MMA_ROWS;
    // The whole warp leaves together: the instruction needs every lane.
    if (n0 >= n_cols) return;
    const bf16_t* w_lo[1] = {n0 + g < n_cols ? w + (u64)(n0 + g) * k : nullptr};
    const bf16_t* w_hi[1] = {n0 + g + 8 < n_cols ? w + (u64)(n0 + g + 8) * k : nullptr};
    const float* xs[MMA_ROW_GROUPS];
    bool has[MMA_ROW_GROUPS];
    for (int r = 0; r < MMA_ROW_GROUPS; ++r) {
        const int row = m0 + r * MMA_ROWS + g;
        xs[r] = row < m_rows ? x + (u64)row * k : nullptr;
        has[r] = m0 + r * MMA_ROWS < m_rows;
    }
    float acc[1][MMA_ROW_GROUPS][4];
    mma_tile(w_lo, w_hi, xs, has, k, mma_vec_ok(x, w, k), acc);
#pragma unroll
    for (int r = 0; r < MMA_ROW_GROUPS; ++r) {
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const int row = m0 + r * MMA_ROWS + 2 * t + (i & 1);
            const int col = n0 + g + 8 * (i >> 1);
            if (row < m_rows && col < n_cols) out[(u64)row * n_cols + col] = acc[0][r][i];
        }
    }
}

// The staged variants, for products of more than MMA_ROWS rows (a batch's LM head, prefill). The
// thin kernel above reads every input element once per warp, that is once per MMA_COLS output
// columns, in f32: at 32 rows that is four times the bytes of the weights it streams, out of L2.
// Here a block's warps share its groups of input rows, which the block rounds to bf16 and stages
// in shared memory (mma_tile_staged), so an input element leaves L2 once per block of columns.
//
// `gemm_bf16w_mma_staged` keeps the thin kernel's block (MMA_WARPS warps, MMA_ROW_GROUPS groups),
// hence its grid and parallelism, with a quarter of its input reads. `gemm_bf16w_mma_staged_wide`
// has MMA_STAGE_WARPS warps over MMA_STAGE_GROUPS groups, reading an input element once per 128
// columns and a weight once per 64 rows, for products wide enough to fill the device with such
// blocks (a batch's LM head).
//
// Bits: a warp gives each output the same instructions on the same fragments in the same order as
// the thin kernel (steps in ascending k, the rounding and the zeros past k and past the rows
// alike), so all three kernels give the same bits and a row's bits never depend on the batch.
//
// Block: WARPS warps side by side along n, each MMA_COLS columns by every group of the block.
// Grid: (ceil(m / (GROUPS * MMA_ROWS)), ceil(n / (WARPS * MMA_COLS))).

#define MMA_STAGE_WARPS 8
#define MMA_STAGE_GROUPS 8

// The staged product of the block's WARPS * MMA_COLS columns by GROUPS * MMA_ROWS rows; `chunks`
// holds two chunks of GROUPS * MMA_ROWS * MMA_STAGE_STRIDE elements, 16-byte aligned.
template <int WARPS, int GROUPS, bool PREFETCH>
__device__ __forceinline__ void gemm_mma_staged_body(
    const float* x, const bf16_t* w, float* out, int m_rows, int n_cols, int k, bf16_t* chunks) {
    const int lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
    const int n0 = (blockIdx.y * WARPS + threadIdx.x / 32) * MMA_COLS;
    const int m0 = blockIdx.x * GROUPS * MMA_ROWS;
    // A warp past n still stages its share and meets the others at every barrier.
    const bool live = n0 < n_cols;
    const bf16_t* w_lo[1] = {live && n0 + g < n_cols ? w + (u64)(n0 + g) * k : nullptr};
    const bf16_t* w_hi[1] = {live && n0 + g + 8 < n_cols ? w + (u64)(n0 + g + 8) * k : nullptr};
    bool has[GROUPS];
    for (int r = 0; r < GROUPS; ++r) has[r] = m0 + r * MMA_ROWS < m_rows;
    float acc[1][GROUPS][4];
    int buf = 0;
    const DenseRows rows{x, m0, m_rows, k};
    mma_tile_staged<WARPS * 32, PREFETCH>(
        w_lo, w_hi, rows, has, k, mma_vec_ok(x, w, k), live, chunks, buf, acc);
    if (!live) return;
#pragma unroll
    for (int r = 0; r < GROUPS; ++r) {
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const int row = m0 + r * MMA_ROWS + 2 * t + (i & 1);
            const int col = n0 + g + 8 * (i >> 1);
            if (row < m_rows && col < n_cols) out[(u64)row * n_cols + col] = acc[0][r][i];
        }
    }
}

extern "C" __global__ void __launch_bounds__(MMA_WARPS * 32) gemm_bf16w_mma_staged(
    const float* __restrict__ x,   // device [m, k]
    const bf16_t* __restrict__ w,  // device [n, k]
    float* __restrict__ out,       // device [m, n]
    int m_rows, int n_cols, int k) {
    // Two chunks; u32x4 for the 16-byte alignment of the fragments' loads.
    __shared__ u32x4 chunks[2 * MMA_ROW_GROUPS * MMA_ROWS * MMA_STAGE_STRIDE * 2 / 16];
    gemm_mma_staged_body<MMA_WARPS, MMA_ROW_GROUPS, true>(
        x, w, out, m_rows, n_cols, k, reinterpret_cast<bf16_t*>(chunks));
}

extern "C" __global__ void __launch_bounds__(MMA_STAGE_WARPS * 32) gemm_bf16w_mma_staged_wide(
    const float* __restrict__ x,   // device [m, k]
    const bf16_t* __restrict__ w,  // device [n, k]
    float* __restrict__ out,       // device [m, n]
    int m_rows, int n_cols, int k) {
    __shared__ u32x4 chunks[2 * MMA_STAGE_GROUPS * MMA_ROWS * MMA_STAGE_STRIDE * 2 / 16];
    gemm_mma_staged_body<MMA_STAGE_WARPS, MMA_STAGE_GROUPS, false>(
        x, w, out, m_rows, n_cols, k, reinterpret_cast<bf16_t*>(chunks));
}
