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

// The staged variant, for products of more than 8 rows. Above, a half-warp reads its own 4 input
// rows (f32, twice the bytes of its 4 weight rows) and a weight is read once per 4 rows, so at 64
// rows the LM head moves about fifty times its weights' bytes through L2. Here a block's
// GEMM_HALF_WARPS half-warps share GEMM_STAGE_ROWS input rows, which the block copies into shared
// memory GEMM_STAGE_K elements of k at a time (two buffers, one barrier a chunk), and each
// half-warp keeps the sums of all of them: an input element leaves L2 once per
// GEMM_HALF_WARPS * GEMM_RN columns, a weight once per GEMM_STAGE_ROWS rows.
//
// Bits: lane l still accumulates elements l, l + 16, ... in ascending order (multiply, round,
// add, round), none past k, and the lane sums fold by fold16: dot_tile's operations exactly, so
// the outputs are cpu::linear's, as above.
//
// Block: 128 threads, GEMM_HALF_WARPS half-warps along n. Grid: (ceil(m / GEMM_STAGE_ROWS),
// ceil(n / (GEMM_HALF_WARPS * GEMM_RN))).

#define GEMM_STAGE_ROWS 16
#define GEMM_STAGE_K (DOT_UNROLL * DOT_LANES)

// Copies the block's GEMM_STAGE_ROWS rows from m0 of x at [c0, c0 + GEMM_STAGE_K) into `dst`
// (zero past m and past k), consecutive threads along a row.
__device__ __forceinline__ void stage_f32_rows(
    const float* x, int m0, int m_rows, int c0, int k, bool vec, float* dst) {
    constexpr int QUADS = GEMM_STAGE_K / 4;
    for (int q = threadIdx.x; q < GEMM_STAGE_ROWS * QUADS; q += blockDim.x) {
        const int r = q / QUADS, c = (q % QUADS) * 4;
        const int row = m0 + r, col = c0 + c;
        f32x4 v;
        if (row < m_rows && vec && col + 4 <= k) {
            v = *reinterpret_cast<const f32x4*>(x + (u64)row * k + col);
        } else {
            const float* p = x + (u64)row * k + col;
            v.x = row < m_rows && col < k ? p[0] : 0.0f;
            v.y = row < m_rows && col + 1 < k ? p[1] : 0.0f;
            v.z = row < m_rows && col + 2 < k ? p[2] : 0.0f;
            v.w = row < m_rows && col + 3 < k ? p[3] : 0.0f;
        }
        *reinterpret_cast<f32x4*>(dst + r * GEMM_STAGE_K + c) = v;
    }
}

template <typename W>
__device__ __forceinline__ void gemm_staged_body(
    const float* __restrict__ x, const W* __restrict__ w, float* __restrict__ out,
    int m_rows, int n_cols, int k, float* chunks) {
    const int lane = threadIdx.x % DOT_LANES;
    const int n0 = (blockIdx.y * GEMM_HALF_WARPS + threadIdx.x / DOT_LANES) * GEMM_RN;
    const int m0 = blockIdx.x * GEMM_STAGE_ROWS;
    const W* ws[GEMM_RN];
    for (int n = 0; n < GEMM_RN; ++n) ws[n] = n0 + n < n_cols ? w + (u64)(n0 + n) * k : nullptr;
    float acc[GEMM_STAGE_ROWS][GEMM_RN];
#pragma unroll
    for (int r = 0; r < GEMM_STAGE_ROWS; ++r)
#pragma unroll
        for (int n = 0; n < GEMM_RN; ++n) acc[r][n] = 0.0f;
    const bool vec = k % 4 == 0 && (u64)x % 16 == 0;
    for (int c0 = 0, buf = 0; c0 < k; c0 += GEMM_STAGE_K, buf ^= 1) {
        // The chunk's weights are requested first, so they are in flight while the block stages.
        float wv[DOT_UNROLL][GEMM_RN];
#pragma unroll
        for (int u = 0; u < DOT_UNROLL; ++u) {
            const int c = c0 + u * DOT_LANES + lane;
#pragma unroll
            for (int n = 0; n < GEMM_RN; ++n)
                wv[u][n] = ws[n] && c < k ? load_weight(ws[n] + c) : 0.0f;
        }
        float* chunk = chunks + buf * GEMM_STAGE_ROWS * GEMM_STAGE_K;
        stage_f32_rows(x, m0, m_rows, c0, k, vec, chunk);
        // Also orders these writes after every thread's reads of the chunk before last, which
        // used this buffer: each passed the previous barrier after them.
        __syncthreads();
#pragma unroll
        for (int u = 0; u < DOT_UNROLL; ++u) {
            // The CPU adds nothing past k; a lane's elements ascend, so the rest are past it too.
            if (c0 + u * DOT_LANES + lane >= k) break;
#pragma unroll
            for (int r = 0; r < GEMM_STAGE_ROWS; ++r) {
                const float xv = chunk[r * GEMM_STAGE_K + u * DOT_LANES + lane];
#pragma unroll
                for (int n = 0; n < GEMM_RN; ++n) acc[r][n] = add(acc[r][n], mul(xv, wv[u][n]));
            }
        }
    }
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
    __shared__ f32x4 chunks[2 * GEMM_STAGE_ROWS * GEMM_STAGE_K / 4];
    gemm_staged_body(x, w, out, m, n, k, reinterpret_cast<float*>(chunks));
}

extern "C" __global__ void __launch_bounds__(128) gemm_f32w_f32_staged(
    const float* __restrict__ x,  // device [m, k]
    const float* __restrict__ w,  // device [n, k]
    float* __restrict__ out,      // device [m, n]
    int m, int n, int k) {
    __shared__ f32x4 chunks[2 * GEMM_STAGE_ROWS * GEMM_STAGE_K / 4];
    gemm_staged_body(x, w, out, m, n, k, reinterpret_cast<float*>(chunks));
}
