// Grouped expert products in bf16 precision on tensor cores (`--matmul-precision bf16`), over
// the sorted rows of moe_sort_pairs (gemm/mma_tile.cuh has the arithmetic).
//
// A block takes one of this rank's experts and MMA_WARPS * MMA_COLS of its output columns, and
// walks the expert's sorted rows (expert_starts[e] .. expert_starts[e + 1]) in passes of
// MMA_ROW_GROUPS * MMA_ROWS rows, each pass one mma_tile_staged: the expert's weights are read
// once per 32 rows, and the pass's input rows are gathered and rounded once into shared memory
// for the block's warps (not once per warp). `splits` blocks share an expert's columns, block s
// taking passes s, s + splits, ... (expert_passes in expert_common.cuh). An expert row's bits
// depend on its token and expert only (mma_tile's instructions and order), whatever else is
// routed and however the rows fall into passes and blocks.
//
// The grid covers every expert of the rank whatever the routing (an expert without rows returns
// at once), which keeps the launch graph-capturable; the other ranks' rows are left as they are.
// Block: MMA_WARPS warps. Grid: (ceil(cols / (MMA_WARPS * MMA_COLS)) * splits, num_local), the
// splits of a column tile side by side in x (scheduled together, they share its weights in L2).

// The lane's two weight rows (g and g + 8 of the warp's columns) of an expert's [cols, k] matrix.
__device__ __forceinline__ void mma_weight_rows(
    const bf16_t* w, int n0, int cols, int k, const bf16_t*& lo, const bf16_t*& hi) {
    const int g = (threadIdx.x % 32) / 4;
    lo = n0 + g < cols ? w + (u64)(n0 + g) * k : nullptr;
    hi = n0 + g + 8 < cols ? w + (u64)(n0 + g + 8) * k : nullptr;
}

// Rows a pass takes.
#define EXPERT_MMA_ROWS (MMA_ROW_GROUPS * MMA_ROWS)

// Which groups of the pass at `base` take part (the same on every lane).
__device__ __forceinline__ void pass_groups(int base, int end, bool (&has)[MMA_ROW_GROUPS]) {
    for (int r = 0; r < MMA_ROW_GROUPS; ++r) has[r] = base + r * MMA_ROWS < end;
}

// The two chunks a block stages its passes' rows in (mma_tile_staged).
#define EXPERT_CHUNKS (2 * MMA_ROW_GROUPS * MMA_ROWS * MMA_STAGE_STRIDE * 2 / 16)

// Calls store(row, col, r, i) for each of the lane's outputs of the pass at `base` (acc[..][r][i]
// of mma_tile) that is a row of the expert and a column of the matrix.
template <typename Store>
__device__ __forceinline__ void pass_outputs(int base, int end, int n0, int cols, Store store) {
    const int lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
#pragma unroll
    for (int r = 0; r < MMA_ROW_GROUPS; ++r) {
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const int row = base + r * MMA_ROWS + 2 * t + (i & 1), col = n0 + g + 8 * (i >> 1);
            if (row < end && col < cols) store(row, col, r, i);
        }
    }
}

// The up projection (ws[0]) and, for SwiGLU, the gate (ws[1]) of the block's columns for every
// row of its expert, activated into `act`. Every thread of the block calls it (the staging meets
// at barriers); a warp past `inter` only helps stage.
template <int NW>
__device__ __forceinline__ void expert_up_mma(
    const float* x, const bf16_t* const (&ws)[NW], const int* sorted_pairs, float* act,
    ExpertPasses rows, int n0, int top_k, int hidden, int inter, int activation, bf16_t* chunks) {
    const bf16_t *lo[NW], *hi[NW];
    for (int j = 0; j < NW; ++j) mma_weight_rows(ws[j], n0, inter, hidden, lo[j], hi[j]);
    const bool vec = mma_vec_ok(x, ws[0], hidden) && (u64)ws[NW - 1] % 16 == 0;
    const bool live = n0 < inter;
    int buf = 0;
    for (int base = rows.first; base < rows.end; base += rows.stride) {
        bool has[MMA_ROW_GROUPS];
        pass_groups(base, rows.end, has);
        const TokenRows pass{x, sorted_pairs, hidden, base, rows.end, top_k};
        float acc[NW][MMA_ROW_GROUPS][4];
        mma_tile_staged<MMA_WARPS * 32>(lo, hi, pass, has, hidden, vec, live, chunks, buf, acc);
        if (!live) continue;
        pass_outputs(base, rows.end, n0, inter, [&](int row, int col, int r, int i) {
            const float gate = NW > 1 ? acc[NW - 1][r][i] : 0.0f;
            act[(u64)row * inter + col] = expert_activation(activation, acc[0][r][i], gate);
        });
    }
}

// act[row, i] = silu(bf16(x) . gate[e, i]) * (bf16(x) . up[e, i]) (SwiGLU) or relu(bf16(x) .
// up[e, i])^2 for the token of each sorted row.
extern "C" __global__ void __launch_bounds__(128) moe_expert_up_mma(
    const float* __restrict__ x,             // device [num_tokens, hidden]
    const bf16_t* __restrict__ w_up,         // device [num_local, inter, hidden]
    const bf16_t* __restrict__ w_gate,       // device [num_local, inter, hidden] (SwiGLU) or null
    const int* __restrict__ sorted_pairs,    // device [num_pairs]
    const int* __restrict__ expert_starts,   // device [num_experts + 1]
    float* __restrict__ act,                 // device [num_pairs, inter]
    int top_k, int hidden, int inter, int activation, int first_local, int splits) {
    __shared__ u32x4 staged[EXPERT_CHUNKS];
    bf16_t* chunks = reinterpret_cast<bf16_t*>(staged);
    const ExpertPasses rows = expert_passes(expert_starts, first_local, splits, EXPERT_MMA_ROWS);
    const int n0 = (rows.col_tile * MMA_WARPS + threadIdx.x / 32) * MMA_COLS;
    // The whole block leaves together: its threads meet at the staging's barriers.
    if (rows.first >= rows.end) return;
    const u64 at = (u64)blockIdx.y * inter * hidden;
    if (activation == MOE_ACT_SWIGLU) {
        const bf16_t* ws[2] = {w_up + at, w_gate + at};
        expert_up_mma(x, ws, sorted_pairs, act, rows, n0, top_k, hidden, inter, activation, chunks);
    } else {
        const bf16_t* ws[1] = {w_up + at};
        expert_up_mma(x, ws, sorted_pairs, act, rows, n0, top_k, hidden, inter, activation, chunks);
    }
}

// out[row, h] = bf16(act[row, :]) . down[e, h, :] for every sorted row.
extern "C" __global__ void __launch_bounds__(128) moe_expert_down_mma(
    const float* __restrict__ act,           // device [num_pairs, inter]
    const bf16_t* __restrict__ w_down,       // device [num_local, hidden, inter]
    const int* __restrict__ expert_starts,   // device [num_experts + 1]
    float* __restrict__ out,                 // device [num_pairs, hidden]
    int hidden, int inter, int first_local, int splits) {
    __shared__ u32x4 staged[EXPERT_CHUNKS];
    bf16_t* chunks = reinterpret_cast<bf16_t*>(staged);
    const ExpertPasses rows = expert_passes(expert_starts, first_local, splits, EXPERT_MMA_ROWS);
    const int n0 = (rows.col_tile * MMA_WARPS + threadIdx.x / 32) * MMA_COLS;
    // The whole block leaves together; a warp past `hidden` only helps stage.
    if (rows.first >= rows.end) return;
    const bool live = n0 < hidden;
    const bf16_t* w = w_down + (u64)blockIdx.y * hidden * inter;
    const bf16_t *lo[1], *hi[1];
    mma_weight_rows(w, n0, hidden, inter, lo[0], hi[0]);
    const bool vec = mma_vec_ok(act, w, inter);
    int buf = 0;
    for (int base = rows.first; base < rows.end; base += rows.stride) {
        bool has[MMA_ROW_GROUPS];
        pass_groups(base, rows.end, has);
        const SortedRows pass{act, inter, base, rows.end};
        float acc[1][MMA_ROW_GROUPS][4];
        mma_tile_staged<MMA_WARPS * 32>(lo, hi, pass, has, inter, vec, live, chunks, buf, acc);
        if (!live) continue;
        pass_outputs(base, rows.end, n0, hidden, [&](int row, int col, int r, int i) {
            out[(u64)row * hidden + col] = acc[0][r][i];
        });
    }
}
