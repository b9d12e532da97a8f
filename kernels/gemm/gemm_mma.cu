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
