// The product tile shared by the dense and the grouped (MoE) matrix products; compiled in front
// of both (the Rust source table lists it as a part of each).
//
// Reduction order: every output is computed by one half-warp, lane l accumulating the products of
// elements l, l + 16, l + 32, ... in ascending order (separately rounded multiply, then add), and
// the 16 lane sums fold by the CPU's pairwise tree (fold16). That is exactly cpu::dot's sequence
// of operations, so an output is bit for bit the CPU's and never depends on the number of rows,
// the tile it lands in, or the grid: there is no split-K.
//
// A half-warp computes GEMM_RM rows x GEMM_RN columns, reusing each loaded input element GEMM_RN
// times and each weight element GEMM_RM times. The loop loads DOT_UNROLL stripes of every row
// before it multiplies any of them, so a thread has that many loads in flight: a thin product
// (few blocks, one row) is bound by memory latency, not by its arithmetic. The products and sums
// still happen in ascending stripe order, so the bits are those of one stripe at a time.

#define GEMM_RM 4
#define GEMM_RN 4
#define GEMM_HALF_WARPS 8
#define DOT_UNROLL 8

// Accumulates the RM x RN lane sums of this lane's stripe of k for the given input and weight
// rows; absent rows (null) contribute nothing and their sums are never stored.
template <typename W>
__device__ __forceinline__ void dot_tile(
    const float* const (&xs)[GEMM_RM],
    const W* const (&ws)[GEMM_RN],
    int k,
    int lane,
    float (&acc)[GEMM_RM][GEMM_RN]) {
    for (int m = 0; m < GEMM_RM; ++m)
        for (int n = 0; n < GEMM_RN; ++n) acc[m][n] = 0.0f;
    int c = lane;
    for (; c + (DOT_UNROLL - 1) * DOT_LANES < k; c += DOT_UNROLL * DOT_LANES) {
        float wv[DOT_UNROLL][GEMM_RN], xv[DOT_UNROLL][GEMM_RM];
#pragma unroll
        for (int u = 0; u < DOT_UNROLL; ++u) {
            for (int n = 0; n < GEMM_RN; ++n)
                wv[u][n] = ws[n] ? load_weight(ws[n] + c + u * DOT_LANES) : 0.0f;
            for (int m = 0; m < GEMM_RM; ++m) xv[u][m] = xs[m] ? xs[m][c + u * DOT_LANES] : 0.0f;
        }
#pragma unroll
        for (int u = 0; u < DOT_UNROLL; ++u)
            for (int m = 0; m < GEMM_RM; ++m)
                for (int n = 0; n < GEMM_RN; ++n) acc[m][n] = add(acc[m][n], mul(xv[u][m], wv[u][n]));
    }
    // The last stripes, one at a time.
    for (; c < k; c += DOT_LANES) {
        float wv[GEMM_RN];
        for (int n = 0; n < GEMM_RN; ++n) wv[n] = ws[n] ? load_weight(ws[n] + c) : 0.0f;
        for (int m = 0; m < GEMM_RM; ++m) {
            float xv = xs[m] ? xs[m][c] : 0.0f;
            for (int n = 0; n < GEMM_RN; ++n) acc[m][n] = add(acc[m][n], mul(xv, wv[n]));
        }
    }
}

// The lane sums of one input row `xr` against NW weight rows (`ws`, never null), for the products
// of one row a half-warp (the one-row dense product, the expert rows of a decode step): UNROLL
// stripes of every weight row and of the input requested before any is multiplied, then the
// stripes summed in ascending order, as dot_tile sums them.
template <int UNROLL, int NW, typename W>
__device__ __forceinline__ void dot_rows(
    const float* __restrict__ xr, const W* const (&ws)[NW], int k, int lane, float (&acc)[NW]) {
#pragma unroll
    for (int n = 0; n < NW; ++n) acc[n] = 0.0f;
    int c = lane;
    for (; c + (UNROLL - 1) * DOT_LANES < k; c += UNROLL * DOT_LANES) {
        float wv[UNROLL][NW], xv[UNROLL];
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) {
#pragma unroll
            for (int n = 0; n < NW; ++n) wv[u][n] = load_weight(ws[n] + c + u * DOT_LANES);
            xv[u] = xr[c + u * DOT_LANES];
        }
#pragma unroll
        for (int u = 0; u < UNROLL; ++u)
#pragma unroll
            for (int n = 0; n < NW; ++n) acc[n] = add(acc[n], mul(xv[u], wv[u][n]));
    }
    // The last stripes, one at a time.
    for (; c < k; c += DOT_LANES) {
        const float xv = xr[c];
#pragma unroll
        for (int n = 0; n < NW; ++n) acc[n] = add(acc[n], mul(xv, load_weight(ws[n] + c)));
    }
}

// Staging: a block whose half-warps share ROWS input rows copies them into shared memory once,
// DOT_STAGE_K elements of k at a time, and every half-warp keeps the sums of all ROWS rows for
// its GEMM_RN columns, its weights loaded once per chunk: an input element leaves L2 once per
// block of columns, a weight once per ROWS rows. Lane l still accumulates elements l, l + 16, ...
// in ascending order (multiply, round, add, round), none past k, so once folded (fold16) every
// output is cpu::dot's, as dot_tile's are.
#define DOT_STAGE_K (DOT_UNROLL * DOT_LANES)

// Threads of every block that stages f32 rows (GEMM_HALF_WARPS half-warps).
#define DOT_STAGE_THREADS (GEMM_HALF_WARPS * DOT_LANES)

// Copies ROWS rows at [c0, c0 + DOT_STAGE_K) into `dst` (zero past k, and for an absent row),
// four elements a thread at a time, consecutive threads along a row, each thread the same quads
// of every chunk, all of them requested before the first store (load_row_quads).
template <int ROWS, typename Rows>
__device__ __forceinline__ void stage_f32_rows(const Rows& rows, int c0, int k, bool vec, float* dst) {
    constexpr int QUADS = DOT_STAGE_K / 4, STRIDE = DOT_STAGE_THREADS / QUADS, ITER = ROWS / STRIDE;
    static_assert(DOT_STAGE_THREADS % QUADS == 0 && ROWS % STRIDE == 0, "whole rows per round");
    const int c = (threadIdx.x % QUADS) * 4, r0 = threadIdx.x / QUADS;
    f32x4 v[ITER];
    load_row_quads<ITER, STRIDE>(rows, r0, c0 + c, k, vec, v);
#pragma unroll
    for (int i = 0; i < ITER; ++i)
        *reinterpret_cast<f32x4*>(dst + (r0 + i * STRIDE) * DOT_STAGE_K + c) = v[i];
}

// The lane's weights of the chunk at c0: DOT_UNROLL stripes of each of its GEMM_RN rows (zero past
// k and for a null row).
template <typename W>
__device__ __forceinline__ void load_chunk_weights_f32(
    const W* const (&ws)[GEMM_RN], int c0, int k, int lane, float (&wv)[DOT_UNROLL][GEMM_RN]) {
#pragma unroll
    for (int u = 0; u < DOT_UNROLL; ++u) {
        const int c = c0 + u * DOT_LANES + lane;
#pragma unroll
        for (int n = 0; n < GEMM_RN; ++n) wv[u][n] = ws[n] && c < k ? load_weight(ws[n] + c) : 0.0f;
    }
}

// One staged chunk at c0 with its weights loaded: the block stages its input rows into chunk
// `buf` (then flips it), meets at the barrier, and the lane adds the chunk's products.
template <int ROWS, typename Rows>
__device__ __forceinline__ void dot_chunk_staged(
    const Rows& rows, const float (&wv)[DOT_UNROLL][GEMM_RN], int c0, int k, bool vec, int lane,
    float* chunks, int& buf, float (&acc)[ROWS][GEMM_RN]) {
    float* chunk = chunks + buf * ROWS * DOT_STAGE_K;
    buf ^= 1;
    stage_f32_rows<ROWS>(rows, c0, k, vec, chunk);
    __syncthreads();
#pragma unroll
    for (int u = 0; u < DOT_UNROLL; ++u) {
        // The CPU adds nothing past k; a lane's elements ascend, so the rest are past it too.
        if (c0 + u * DOT_LANES + lane >= k) break;
#pragma unroll
        for (int r = 0; r < ROWS; ++r) {
            const float xv = chunk[r * DOT_STAGE_K + u * DOT_LANES + lane];
#pragma unroll
            for (int n = 0; n < GEMM_RN; ++n) acc[r][n] = add(acc[r][n], mul(xv, wv[u][n]));
        }
    }
}

// The lane sums of ROWS shared input rows (`rows`, as the prelude's DenseRows; `vec` says whether
// the present ones allow 16-byte loads) against this half-warp's GEMM_RN weight rows (null past the
// matrix), staged through `chunks` (two chunks of ROWS * DOT_STAGE_K floats, 16-byte aligned).
// Every thread of the block must call it with the same rows and k. `buf` is the chunk to fill
// first; it carries over from call to call, so that consecutive chunks always alternate (the
// barrier before a chunk is read then also orders the next write to that buffer after every read
// of it). The next chunk's weights are requested before the current chunk is staged (with one
// set, each chunk waited a round trip to memory of its own after the barrier).
template <int ROWS, typename W, typename Rows>
__device__ __forceinline__ void dot_tile_staged(
    const Rows& rows, const W* const (&ws)[GEMM_RN], int k, bool vec, int lane, float* chunks,
    int& buf, float (&acc)[ROWS][GEMM_RN]) {
#pragma unroll
    for (int r = 0; r < ROWS; ++r)
#pragma unroll
        for (int n = 0; n < GEMM_RN; ++n) acc[r][n] = 0.0f;
    float wa[DOT_UNROLL][GEMM_RN], wb[DOT_UNROLL][GEMM_RN];
    chunks_prefetched(
        k, DOT_STAGE_K, [&](int c0) { load_chunk_weights_f32(ws, c0, k, lane, wa); },
        [&](int c0) { load_chunk_weights_f32(ws, c0, k, lane, wb); },
        [&](int c0) { dot_chunk_staged<ROWS>(rows, wa, c0, k, vec, lane, chunks, buf, acc); },
        [&](int c0) { dot_chunk_staged<ROWS>(rows, wb, c0, k, vec, lane, chunks, buf, acc); });
}
