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
// in shared memory MMA_STAGE_K elements of k at a time (two buffers: while the warps multiply one
// chunk, nobody writes it), so an input element leaves L2 once per block of columns.
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
#define MMA_STAGE_K (MMA_UNROLL * MMA_K)
// Row stride of a staged chunk in bf16 elements: 320 bytes, 64 modulo 128, so the eight lanes of
// a 16-byte load phase (groups g and g + 1, t = 0..3) hit 32 distinct banks.
#define MMA_STAGE_STRIDE (MMA_STAGE_K + 32)

// Rounds the block's `rows` rows from m0 of x at [c0, c0 + MMA_STAGE_K) to bf16 pairs in `dst`
// (zero past m and past k): four elements a thread at a time, consecutive threads along a row, so
// a warp reads 512 contiguous bytes.
__device__ __forceinline__ void stage_rows(
    const float* x, int m0, int rows, int m_rows, int c0, int k, bool vec, bf16_t* dst) {
    constexpr int QUADS = MMA_STAGE_K / 4;
    for (int q = threadIdx.x; q < rows * QUADS; q += blockDim.x) {
        const int r = q / QUADS, c = (q % QUADS) * 4;
        const int row = m0 + r, col = c0 + c;
        float e[4];
        if (row < m_rows && vec && col + 4 <= k) {
            const f32x4 v = *reinterpret_cast<const f32x4*>(x + (u64)row * k + col);
            e[0] = v.x, e[1] = v.y, e[2] = v.z, e[3] = v.w;
        } else {
            for (int j = 0; j < 4; ++j)
                e[j] = row < m_rows && col + j < k ? x[(u64)row * k + col + j] : 0.0f;
        }
        u32* d = reinterpret_cast<u32*>(dst + r * MMA_STAGE_STRIDE + c);
        d[0] = pack_bf16x2(e[0], e[1]);
        d[1] = pack_bf16x2(e[2], e[3]);
    }
}

// Step s of a staged chunk: the lane's input fragment of each group that takes part, from shared
// memory, and the step's two instructions onto its sums (mma_step's fragments and order).
template <int GROUPS>
__device__ __forceinline__ void mma_step_staged(
    const u32 (&lo)[4], const u32 (&hi)[4], const bf16_t* chunk, int s, const bool (&has)[GROUPS],
    float (&acc)[GROUPS][4]) {
    const int lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
    const u32 a0[4] = {lo[0], hi[0], lo[1], hi[1]};
    const u32 a1[4] = {lo[2], hi[2], lo[3], hi[3]};
#pragma unroll
    for (int r = 0; r < GROUPS; ++r) {
        if (!has[r]) continue;
        const u32x4 v = *reinterpret_cast<const u32x4*>(
            chunk + (r * MMA_ROWS + g) * MMA_STAGE_STRIDE + s * MMA_K + 8 * t);
        const u32 b0[2] = {v.x, v.y};
        const u32 b1[2] = {v.z, v.w};
        mma_bf16_16816(acc[r], a0, b0, acc[r]);
        mma_bf16_16816(acc[r], a1, b1, acc[r]);
    }
}

// The staged product of the block's WARPS * MMA_COLS columns by GROUPS * MMA_ROWS rows; `chunks`
// holds two chunks of GROUPS * MMA_ROWS * MMA_STAGE_STRIDE elements, 16-byte aligned.
template <int WARPS, int GROUPS>
__device__ __forceinline__ void gemm_mma_staged_body(
    const float* x, const bf16_t* w, float* out, int m_rows, int n_cols, int k, bf16_t* chunks) {
    constexpr int CHUNK = GROUPS * MMA_ROWS * MMA_STAGE_STRIDE;
    const int lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
    const int n0 = (blockIdx.y * WARPS + threadIdx.x / 32) * MMA_COLS;
    const int m0 = blockIdx.x * GROUPS * MMA_ROWS;
    // A warp past n still stages its share and meets the others at every barrier.
    const bool live = n0 < n_cols;
    const bf16_t* w_lo[1] = {live && n0 + g < n_cols ? w + (u64)(n0 + g) * k : nullptr};
    const bf16_t* w_hi[1] = {live && n0 + g + 8 < n_cols ? w + (u64)(n0 + g + 8) * k : nullptr};
    bool has[GROUPS];
    float acc[GROUPS][4];
#pragma unroll
    for (int r = 0; r < GROUPS; ++r) {
        has[r] = m0 + r * MMA_ROWS < m_rows;
#pragma unroll
        for (int i = 0; i < 4; ++i) acc[r][i] = 0.0f;
    }
    const bool vec = mma_vec_ok(x, w, k);
    for (int c0 = 0, buf = 0; c0 < k; c0 += MMA_STAGE_K, buf ^= 1) {
        // The chunk's weights are requested first, so they are in flight while the block stages.
        u32 lo[MMA_UNROLL][1][4], hi[MMA_UNROLL][1][4];
#pragma unroll
        for (int u = 0; u < MMA_UNROLL; ++u)
            load_step_weights(w_lo, w_hi, c0 + u * MMA_K + 8 * t, k, vec, lo[u], hi[u]);
        bf16_t* chunk = chunks + buf * CHUNK;
        stage_rows(x, m0, GROUPS * MMA_ROWS, m_rows, c0, k, vec, chunk);
        // Also orders these writes after every warp's reads of the chunk before last, which used
        // this buffer: each warp passed the previous barrier after them.
        __syncthreads();
        if (!live) continue;
#pragma unroll
        for (int u = 0; u < MMA_UNROLL; ++u) {
            // The thin kernel has no step at or past k.
            if (c0 + u * MMA_K < k) mma_step_staged(lo[u][0], hi[u][0], chunk, u, has, acc);
        }
    }
    if (!live) return;
#pragma unroll
    for (int r = 0; r < GROUPS; ++r) {
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const int row = m0 + r * MMA_ROWS + 2 * t + (i & 1);
            const int col = n0 + g + 8 * (i >> 1);
            if (row < m_rows && col < n_cols) out[(u64)row * n_cols + col] = acc[r][i];
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
    gemm_mma_staged_body<MMA_WARPS, MMA_ROW_GROUPS>(
        x, w, out, m_rows, n_cols, k, reinterpret_cast<bf16_t*>(chunks));
}

extern "C" __global__ void __launch_bounds__(MMA_STAGE_WARPS * 32) gemm_bf16w_mma_staged_wide(
    const float* __restrict__ x,   // device [m, k]
    const bf16_t* __restrict__ w,  // device [n, k]
    float* __restrict__ out,       // device [m, n]
    int m_rows, int n_cols, int k) {
    __shared__ u32x4 chunks[2 * MMA_STAGE_GROUPS * MMA_ROWS * MMA_STAGE_STRIDE * 2 / 16];
    gemm_mma_staged_body<MMA_STAGE_WARPS, MMA_STAGE_GROUPS>(
        x, w, out, m_rows, n_cols, k, reinterpret_cast<bf16_t*>(chunks));
}
