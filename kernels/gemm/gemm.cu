// Matrix products out[m, n] = x[m, :] . w[n, :] (a linear layer without bias; w is [n, k] as Hugging
// Face stores it), weights bf16 or f32, activations and accumulation f32.
//
// Every output is one half-warp's dot product in the CPU's order (gemm/dot_tile.cuh), so a row's
// outputs are bit for bit those of cpu::linear whatever the batch.
//
// Block: 128 threads = GEMM_HALF_WARPS half-warps side by side along n. Grid:
// (ceil(m / GEMM_RM), ceil(n / (GEMM_HALF_WARPS * GEMM_RN))): the row tiles vary fastest, so the
// blocks that read the same weights are scheduled together and the weights come from HBM about
// once, then from L2 (with the column tiles first, every row tile streamed all of them again).

template <typename W>
__device__ __forceinline__ void gemm_body(
    const float* __restrict__ x, const W* __restrict__ w, float* __restrict__ out,
    int m_rows, int n_cols, int k) {
    int half_warp = threadIdx.x / DOT_LANES;
    int lane = threadIdx.x % DOT_LANES;
    int n0 = (blockIdx.y * GEMM_HALF_WARPS + half_warp) * GEMM_RN;
    int m0 = blockIdx.x * GEMM_RM;
    const float* xs[GEMM_RM];
    const W* ws[GEMM_RN];
    for (int m = 0; m < GEMM_RM; ++m) xs[m] = m0 + m < m_rows ? x + (u64)(m0 + m) * k : nullptr;
    for (int n = 0; n < GEMM_RN; ++n) ws[n] = n0 + n < n_cols ? w + (u64)(n0 + n) * k : nullptr;
    float acc[GEMM_RM][GEMM_RN];
    dot_tile(xs, ws, k, lane, acc);
    for (int m = 0; m < GEMM_RM; ++m) {
        for (int n = 0; n < GEMM_RN; ++n) {
            float v = fold16(acc[m][n]);
            if (lane == 0 && xs[m] && ws[n]) out[(u64)(m0 + m) * n_cols + n0 + n] = v;
        }
    }
}

extern "C" __global__ void __launch_bounds__(128) gemm_bf16w_f32(
    const float* __restrict__ x,   // device [m, k]
    const bf16_t* __restrict__ w,  // device [n, k]
    float* __restrict__ out,       // device [m, n]
    int m, int n, int k) {
    gemm_body(x, w, out, m, n, k);
}

extern "C" __global__ void __launch_bounds__(128) gemm_f32w_f32(
    const float* __restrict__ x,  // device [m, k]
    const float* __restrict__ w,  // device [n, k]
    float* __restrict__ out,      // device [m, n]
    int m, int n, int k) {
    gemm_body(x, w, out, m, n, k);
}
