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

// The one-row variants, for a decode step of one sequence. There the thin kernel's half-warp
// walks k in rounds of DOT_UNROLL stripes, each a memory latency (eight rounds at k = 1024), and
// its four columns keep the product's blocks fewer than the SMs for most projections. Here a
// half-warp takes one column of one row and requests DOT_ROW_UNROLL stripes ahead, and a
// 1024-wide projection takes 128 blocks; the order of the sums is dot_tile's. (ptxas keeps about
// 13 of a lane's loads in flight rather than all 32, `benches/sass.py gemm/gemm.cu`: the gain is
// mostly the SMs used.)
//
// Block: 128 threads, GEMM_HALF_WARPS half-warps along n. Grid: (m, ceil(n / GEMM_HALF_WARPS)).

#define DOT_ROW_UNROLL 32

template <typename W>
__device__ __forceinline__ void gemm_row_body(
    const float* __restrict__ x, const W* __restrict__ w, float* __restrict__ out,
    int n_cols, int k) {
    const int lane = threadIdx.x % DOT_LANES;
    const int col = blockIdx.y * GEMM_HALF_WARPS + threadIdx.x / DOT_LANES;
    // A half-warp past n reads the last column (fold16 needs every lane) and stores nothing.
    const W* ws[1] = {w + (u64)min(col, n_cols - 1) * k};
    float acc[1];
    dot_rows<DOT_ROW_UNROLL>(x + (u64)blockIdx.x * k, ws, k, lane, acc);
    const float v = fold16(acc[0]);
    if (lane == 0 && col < n_cols) out[(u64)blockIdx.x * n_cols + col] = v;
}

extern "C" __global__ void __launch_bounds__(128) gemm_bf16w_f32_row(
    const float* __restrict__ x,   // device [m, k]
    const bf16_t* __restrict__ w,  // device [n, k]
    float* __restrict__ out,       // device [m, n]
    int m, int n, int k) {
    gemm_row_body(x, w, out, n, k);
}

extern "C" __global__ void __launch_bounds__(128) gemm_f32w_f32_row(
    const float* __restrict__ x,  // device [m, k]
    const float* __restrict__ w,  // device [n, k]
    float* __restrict__ out,      // device [m, n]
    int m, int n, int k) {
    gemm_row_body(x, w, out, n, k);
}

// The staged variants, for products of more than 8 rows. Above, a half-warp reads its own 4 input
// rows (f32, twice the bytes of its 4 weight rows) and a weight is read once per 4 rows, so at 64
// rows the LM head moves about fifty times its weights' bytes through L2. Here a block's
// GEMM_HALF_WARPS half-warps share GEMM_STAGE_ROWS input rows (dot_tile_staged): an input element
// leaves L2 once per GEMM_HALF_WARPS * GEMM_RN columns, a weight once per GEMM_STAGE_ROWS rows,
// and every output is still cpu::linear's.
//
// Block: 128 threads, GEMM_HALF_WARPS half-warps along n. Grid: (ceil(m / GEMM_STAGE_ROWS),
// ceil(n / (GEMM_HALF_WARPS * GEMM_RN))).

#define GEMM_STAGE_ROWS 16

template <typename W>
__device__ __forceinline__ void gemm_staged_body(
    const float* __restrict__ x, const W* __restrict__ w, float* __restrict__ out,
    int m_rows, int n_cols, int k, float* chunks) {
    const int lane = threadIdx.x % DOT_LANES;
    const int n0 = (blockIdx.y * GEMM_HALF_WARPS + threadIdx.x / DOT_LANES) * GEMM_RN;
    const int m0 = blockIdx.x * GEMM_STAGE_ROWS;
    const W* ws[GEMM_RN];
    for (int n = 0; n < GEMM_RN; ++n) ws[n] = n0 + n < n_cols ? w + (u64)(n0 + n) * k : nullptr;
    const DenseRows rows{x, m0, m_rows, k};
    float acc[GEMM_STAGE_ROWS][GEMM_RN];
    int buf = 0;
    dot_tile_staged(rows, ws, k, k % 4 == 0 && (u64)x % 16 == 0, lane, chunks, buf, acc);
#pragma unroll
    for (int r = 0; r < GEMM_STAGE_ROWS; ++r) {
#pragma unroll
        for (int n = 0; n < GEMM_RN; ++n) {
            const float v = fold16(acc[r][n]);
            if (lane == 0 && m0 + r < m_rows && ws[n]) out[(u64)(m0 + r) * n_cols + n0 + n] = v;
        }
    }
}

extern "C" __global__ void __launch_bounds__(128) gemm_bf16w_f32_staged(
    const float* __restrict__ x,   // device [m, k]
    const bf16_t* __restrict__ w,  // device [n, k]
    float* __restrict__ out,       // device [m, n]
    int m, int n, int k) {
    __shared__ f32x4 chunks[2 * GEMM_STAGE_ROWS * DOT_STAGE_K / 4];
    gemm_staged_body(x, w, out, m, n, k, reinterpret_cast<float*>(chunks));
}

extern "C" __global__ void __launch_bounds__(128) gemm_f32w_f32_staged(
    const float* __restrict__ x,  // device [m, k]
    const float* __restrict__ w,  // device [n, k]
    float* __restrict__ out,      // device [m, n]
    int m, int n, int k) {
    __shared__ f32x4 chunks[2 * GEMM_STAGE_ROWS * DOT_STAGE_K / 4];
    gemm_staged_body(x, w, out, m, n, k, reinterpret_cast<float*>(chunks));
}
