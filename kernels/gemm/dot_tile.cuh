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
