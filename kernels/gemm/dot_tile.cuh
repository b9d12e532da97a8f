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
// times and each weight element GEMM_RM times.

#define GEMM_RM 4
#define GEMM_RN 4
#define GEMM_HALF_WARPS 8

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
    for (int c = lane; c < k; c += DOT_LANES) {
        float wv[GEMM_RN];
        for (int n = 0; n < GEMM_RN; ++n) wv[n] = ws[n] ? load_weight(ws[n] + c) : 0.0f;
        for (int m = 0; m < GEMM_RM; ++m) {
            float xv = xs[m] ? xs[m][c] : 0.0f;
            for (int n = 0; n < GEMM_RN; ++n) acc[m][n] = add(acc[m][n], mul(xv, wv[n]));
        }
    }
}
