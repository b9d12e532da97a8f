// Grouped expert products over the sorted (token, rank) rows of moe_sort_pairs: a tile of
// MOE_TILE_ROWS rows belongs to one expert, whose weight rows every row of the tile shares. Each
// output is a half-warp's dot product in the CPU's order (gemm/dot_tile.cuh), so an expert row is
// bit for bit what cpu::linear_rows gives for that token and expert, whatever else is routed.
//
// Launched for the worst case (grid.y = max tiles, known on the host without reading the device);
// tiles at or past num_tiles[0] return at once, which keeps the launch graph-capturable.
//
// Under expert parallelism a rank holds experts first_local .. first_local + num_local (weights
// stacked from its first expert); tiles of the other ranks' experts return at once and their rows
// are left as they are, to be filled by the exchange between ranks.
// Block: 128 threads. Grid: (max_tiles, ceil(cols / (GEMM_HALF_WARPS * GEMM_RN))): tiles fastest,
// so an expert's tiles, which are adjacent, read its weights together (gemm.cu).

// The tile's input rows: row r of the sorted layout reads input row row_of(r); padding is null.
template <typename RowOf>
__device__ __forceinline__ bool tile_rows(
    const float* in, int width, const int* sorted_pairs, int tile, RowOf row_of,
    const float* (&xs)[GEMM_RM]) {
    bool any = false;
    for (int m = 0; m < GEMM_RM; ++m) {
        int pair = sorted_pairs[tile * MOE_TILE_ROWS + m];
        xs[m] = pair >= 0 ? in + (u64)row_of(tile * MOE_TILE_ROWS + m, pair) * width : nullptr;
        any |= pair >= 0;
    }
    return any;
}

// act[row, i] = silu(x . gate[e, i]) * (x . up[e, i]) (SwiGLU) or relu(x . up[e, i])^2, for the
// token of each sorted row; the CPU's mul_silu_inplace and relu2_inplace. W: bf16_t or float.
template <typename W>
__device__ __forceinline__ void expert_up(
    const float* __restrict__ x,             // device [num_tokens, hidden]
    const W* __restrict__ w_up,              // device [num_local, inter, hidden]
    const W* __restrict__ w_gate,            // device [num_local, inter, hidden] (SwiGLU) or null
    const int* __restrict__ sorted_pairs,    // device [max_sorted_rows]
    const int* __restrict__ tile_experts,    // device [max_tiles]
    const int* __restrict__ num_tiles,       // device [1]
    float* __restrict__ act,                 // device [max_sorted_rows, inter]
    int top_k,
    int hidden,
    int inter,
    int activation,
    int first_local,
    int num_local) {
    const int tile = blockIdx.x;
    if (tile >= num_tiles[0]) return;
    const int local = local_expert(tile_experts, tile, first_local, num_local);
    if (local < 0) return;
    const int lane = threadIdx.x % DOT_LANES;
    const int n0 = (blockIdx.y * GEMM_HALF_WARPS + threadIdx.x / DOT_LANES) * GEMM_RN;
    const u64 expert = local;
    const float* xs[GEMM_RM];
    tile_rows(x, hidden, sorted_pairs, tile, [=](int, int pair) { return pair / top_k; }, xs);
    const W* ups[GEMM_RN];
    const W* gates[GEMM_RN];
    for (int n = 0; n < GEMM_RN; ++n) {
        bool in = n0 + n < inter;
        u64 at = (expert * inter + n0 + n) * hidden;
        ups[n] = in ? w_up + at : nullptr;
        gates[n] = in && w_gate ? w_gate + at : nullptr;
    }
    float up[GEMM_RM][GEMM_RN], gate[GEMM_RM][GEMM_RN];
    dot_tile(xs, ups, hidden, lane, up);
    if (activation == MOE_ACT_SWIGLU) dot_tile(xs, gates, hidden, lane, gate);
    // Unrolled, so that up and gate stay in registers (an index the compiler cannot resolve puts
    // an array in local memory; tests/cuda_kernels_compile.rs checks that none is there).
#pragma unroll
    for (int m = 0; m < GEMM_RM; ++m) {
#pragma unroll
        for (int n = 0; n < GEMM_RN; ++n) {
            float u = fold16(up[m][n]);
            float g = activation == MOE_ACT_SWIGLU ? fold16(gate[m][n]) : 0.0f;
            if (lane != 0 || !xs[m] || !ups[n]) continue;
            act[(u64)(tile * MOE_TILE_ROWS + m) * inter + n0 + n] = expert_activation(activation, u, g);
        }
    }
}

extern "C" __global__ void __launch_bounds__(128) moe_expert_up(
    const float* x, const bf16_t* w_up, const bf16_t* w_gate, const int* sorted_pairs,
    const int* tile_experts, const int* num_tiles, float* act, int top_k, int hidden, int inter,
    int activation, int first_local, int num_local) {
    expert_up(x, w_up, w_gate, sorted_pairs, tile_experts, num_tiles, act, top_k, hidden, inter,
              activation, first_local, num_local);
}

extern "C" __global__ void __launch_bounds__(128) moe_expert_up_f32w(
    const float* x, const float* w_up, const float* w_gate, const int* sorted_pairs,
    const int* tile_experts, const int* num_tiles, float* act, int top_k, int hidden, int inter,
    int activation, int first_local, int num_local) {
    expert_up(x, w_up, w_gate, sorted_pairs, tile_experts, num_tiles, act, top_k, hidden, inter,
              activation, first_local, num_local);
}

// out[row, h] = act[row, :] . down[e, h, :] for every sorted row. W: bf16_t or float.
template <typename W>
__device__ __forceinline__ void expert_down(
    const float* __restrict__ act,           // device [max_sorted_rows, inter]
    const W* __restrict__ w_down,            // device [num_local, hidden, inter]
    const int* __restrict__ sorted_pairs,    // device [max_sorted_rows]
    const int* __restrict__ tile_experts,    // device [max_tiles]
    const int* __restrict__ num_tiles,       // device [1]
    float* __restrict__ out,                 // device [max_sorted_rows, hidden]
    int hidden,
    int inter,
    int first_local,
    int num_local) {
    const int tile = blockIdx.x;
    if (tile >= num_tiles[0]) return;
    const int local = local_expert(tile_experts, tile, first_local, num_local);
    if (local < 0) return;
    const int lane = threadIdx.x % DOT_LANES;
    const int n0 = (blockIdx.y * GEMM_HALF_WARPS + threadIdx.x / DOT_LANES) * GEMM_RN;
    const u64 expert = local;
    const float* xs[GEMM_RM];
    tile_rows(act, inter, sorted_pairs, tile, [=](int row, int) { return row; }, xs);
    const W* ws[GEMM_RN];
    for (int n = 0; n < GEMM_RN; ++n)
        ws[n] = n0 + n < hidden ? w_down + (expert * hidden + n0 + n) * inter : nullptr;
    float acc[GEMM_RM][GEMM_RN];
    dot_tile(xs, ws, inter, lane, acc);
    for (int m = 0; m < GEMM_RM; ++m) {
        for (int n = 0; n < GEMM_RN; ++n) {
            float v = fold16(acc[m][n]);
            if (lane == 0 && xs[m] && ws[n]) out[(u64)(tile * MOE_TILE_ROWS + m) * hidden + n0 + n] = v;
        }
    }
}

extern "C" __global__ void __launch_bounds__(128) moe_expert_down(
    const float* act, const bf16_t* w_down, const int* sorted_pairs, const int* tile_experts,
    const int* num_tiles, float* out, int hidden, int inter, int first_local, int num_local) {
    expert_down(act, w_down, sorted_pairs, tile_experts, num_tiles, out, hidden, inter,
                first_local, num_local);
}

extern "C" __global__ void __launch_bounds__(128) moe_expert_down_f32w(
    const float* act, const float* w_down, const int* sorted_pairs, const int* tile_experts,
    const int* num_tiles, float* out, int hidden, int inter, int first_local, int num_local) {
    expert_down(act, w_down, sorted_pairs, tile_experts, num_tiles, out, hidden, inter,
                first_local, num_local);
}
