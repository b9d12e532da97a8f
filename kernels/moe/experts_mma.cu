// Grouped expert products in bf16 precision on tensor cores (`--matmul-precision bf16`), over
// the sorted rows of moe_sort_pairs as moe/experts.cu does them: a tile of MOE_TILE_ROWS rows of
// one expert is the B operand of the tile's instructions (its first MOE_TILE_ROWS of MMA_ROWS
// columns; the rest are zero), the expert's weights the A operand (gemm/mma_tile.cuh has the
// arithmetic). An expert row's bits depend on its token and expert only, whatever else is routed.
//
// Launched for the worst case like the f32 kernels; tiles at or past num_tiles[0], and tiles of
// the experts of other ranks, return at once.
// Block: MMA_WARPS warps, MMA_COLS output columns each. Grid: (ceil(cols / (MMA_WARPS *
// MMA_COLS)), max_tiles).

// This lane's input row of the tile (lane group g < MOE_TILE_ROWS), or null: padding rows and
// the groups past the tile.
template <typename RowOf>
__device__ __forceinline__ const float* mma_tile_row(
    const float* in, int width, const int* sorted_pairs, int tile, RowOf row_of) {
    const int g = (threadIdx.x % 32) / 4;
    if (g >= MOE_TILE_ROWS) return nullptr;
    const int row = tile * MOE_TILE_ROWS + g;
    const int pair = sorted_pairs[row];
    return pair >= 0 ? in + (u64)row_of(row, pair) * width : nullptr;
}

// The lane's two weight rows (g and g + 8 of the warp's columns) of an expert's [cols, k] matrix.
__device__ __forceinline__ void mma_weight_rows(
    const bf16_t* w, int n0, int cols, int k, const bf16_t*& lo, const bf16_t*& hi) {
    const int g = (threadIdx.x % 32) / 4;
    lo = n0 + g < cols ? w + (u64)(n0 + g) * k : nullptr;
    hi = n0 + g + 8 < cols ? w + (u64)(n0 + g + 8) * k : nullptr;
}

// The up projection (ws[0]) and, for SwiGLU, the gate (ws[1]) of the warp's columns of one tile,
// activated into `act`.
template <int NW>
__device__ __forceinline__ void expert_up_mma(
    const float* x, const bf16_t* const (&ws)[NW], const int* sorted_pairs, float* act,
    int tile, int n0, int top_k, int hidden, int inter, int activation) {
    const bf16_t *lo[NW], *hi[NW];
    for (int j = 0; j < NW; ++j) mma_weight_rows(ws[j], n0, inter, hidden, lo[j], hi[j]);
    const float* xs[1] = {
        mma_tile_row(x, hidden, sorted_pairs, tile, [=](int, int pair) { return pair / top_k; })};
    const bool has[1] = {true};
    float acc[NW][1][4];
    const bool vec = mma_vec_ok(x, ws[0], hidden) && (u64)ws[NW - 1] % 16 == 0;
    mma_tile(lo, hi, xs, has, hidden, vec, acc);
    const int lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
    for (int i = 0; i < 4; ++i) {
        const int r = 2 * t + (i & 1), col = n0 + g + 8 * (i >> 1);
        if (r >= MOE_TILE_ROWS || col >= inter) continue;
        const int row = tile * MOE_TILE_ROWS + r;
        if (sorted_pairs[row] < 0) continue;
        const float gate = NW > 1 ? acc[NW - 1][0][i] : 0.0f;
        act[(u64)row * inter + col] = expert_activation(activation, acc[0][0][i], gate);
    }
}

// act[row, i] = silu(bf16(x) . gate[e, i]) * (bf16(x) . up[e, i]) (SwiGLU) or relu(bf16(x) .
// up[e, i])^2 for the token of each sorted row.
extern "C" __global__ void __launch_bounds__(128) moe_expert_up_mma(
    const float* __restrict__ x,             // device [num_tokens, hidden]
    const bf16_t* __restrict__ w_up,         // device [num_local, inter, hidden]
    const bf16_t* __restrict__ w_gate,       // device [num_local, inter, hidden] (SwiGLU) or null
    const int* __restrict__ sorted_pairs,    // device [max_sorted_rows]
    const int* __restrict__ tile_experts,    // device [max_tiles]
    const int* __restrict__ num_tiles,       // device [1]
    float* __restrict__ act,                 // device [max_sorted_rows, inter]
    int top_k, int hidden, int inter, int activation, int first_local, int num_local) {
    const int tile = blockIdx.y;
    if (tile >= num_tiles[0]) return;
    const int local = local_expert(tile_experts, tile, first_local, num_local);
    const int n0 = (blockIdx.x * MMA_WARPS + threadIdx.x / 32) * MMA_COLS;
    if (local < 0 || n0 >= inter) return;
    const u64 at = (u64)local * inter * hidden;
    if (activation == MOE_ACT_SWIGLU) {
        const bf16_t* ws[2] = {w_up + at, w_gate + at};
        expert_up_mma(x, ws, sorted_pairs, act, tile, n0, top_k, hidden, inter, activation);
    } else {
        const bf16_t* ws[1] = {w_up + at};
        expert_up_mma(x, ws, sorted_pairs, act, tile, n0, top_k, hidden, inter, activation);
    }
}

// out[row, h] = bf16(act[row, :]) . down[e, h, :] for every sorted row.
extern "C" __global__ void __launch_bounds__(128) moe_expert_down_mma(
    const float* __restrict__ act,           // device [max_sorted_rows, inter]
    const bf16_t* __restrict__ w_down,       // device [num_local, hidden, inter]
    const int* __restrict__ sorted_pairs,    // device [max_sorted_rows]
    const int* __restrict__ tile_experts,    // device [max_tiles]
    const int* __restrict__ num_tiles,       // device [1]
    float* __restrict__ out,                 // device [max_sorted_rows, hidden]
    int hidden, int inter, int first_local, int num_local) {
    const int tile = blockIdx.y;
    if (tile >= num_tiles[0]) return;
    const int local = local_expert(tile_experts, tile, first_local, num_local);
    const int n0 = (blockIdx.x * MMA_WARPS + threadIdx.x / 32) * MMA_COLS;
    if (local < 0 || n0 >= hidden) return;
    const bf16_t *w_lo[1], *w_hi[1];
    mma_weight_rows(w_down + (u64)local * hidden * inter, n0, hidden, inter, w_lo[0], w_hi[0]);
    const float* xs[1] = {
        mma_tile_row(act, inter, sorted_pairs, tile, [=](int row, int) { return row; })};
    const bool has[1] = {true};
    float acc[1][1][4];
    mma_tile(w_lo, w_hi, xs, has, inter, mma_vec_ok(act, w_down, inter), acc);
    const int lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
    for (int i = 0; i < 4; ++i) {
        const int r = 2 * t + (i & 1), col = n0 + g + 8 * (i >> 1);
        if (r >= MOE_TILE_ROWS || col >= hidden) continue;
        const int row = tile * MOE_TILE_ROWS + r;
        if (sorted_pairs[row] >= 0) out[(u64)row * hidden + col] = acc[0][0][i];
    }
}
