// Grouped expert products over the sorted (token, rank) rows of moe_sort_pairs, in the CPU's
// arithmetic. Each output is a half-warp's dot product in the CPU's order (gemm/dot_tile.cuh), so
// an expert row is bit for bit what cpu::linear_rows gives for that token and expert, whatever
// else is routed and however the rows fall into passes.
//
// A block takes one of this rank's experts and GEMM_HALF_WARPS * GEMM_RN of its output columns,
// and walks the expert's sorted rows (expert_starts[e] .. expert_starts[e + 1]) in passes of
// EXPERT_UP_ROWS or EXPERT_DOWN_ROWS rows, each pass's inputs staged in shared memory for the
// block's half-warps (dot_tile_staged): the expert's weights are read once per pass. `splits`
// blocks share an expert's columns, block s taking passes s, s + splits, ... (expert_passes in
// expert_common.cuh), so that an expert with many rows is not walked by one block alone.
//
// The grid covers every expert of the rank whatever the routing (an expert without rows returns
// at once), which keeps the launch graph-capturable; under expert parallelism a rank holds experts
// first_local .. first_local + num_local (weights stacked from its first expert), and the other
// ranks' rows are left as they are, to be filled by the exchange between ranks.
// Block: 128 threads. Grid: (ceil(cols / (GEMM_HALF_WARPS * GEMM_RN)) * splits, num_local), the
// splits of a column tile side by side in x (scheduled together, they share its weights in L2).

// Rows a pass takes: fewer in the up product, whose up and gate sums are both held.
#define EXPERT_UP_ROWS 8
#define EXPERT_DOWN_ROWS 16

// act[row, i] = silu(x . gate[e, i]) * (x . up[e, i]) (SwiGLU) or relu(x . up[e, i])^2, for the
// token of each sorted row; the CPU's mul_silu_inplace and relu2_inplace. W: bf16_t or float.
template <typename W>
__device__ __forceinline__ void expert_up(
    const float* __restrict__ x,             // device [num_tokens, hidden]
    const W* __restrict__ w_up,              // device [num_local, inter, hidden]
    const W* __restrict__ w_gate,            // device [num_local, inter, hidden] (SwiGLU) or null
    const int* __restrict__ sorted_pairs,    // device [num_pairs]
    const int* __restrict__ expert_starts,   // device [num_experts + 1]
    float* __restrict__ act,                 // device [num_pairs, inter]
    int top_k,
    int hidden,
    int inter,
    int activation,
    int first_local,
    int splits,
    float* chunks) {
    const ExpertPasses p = expert_passes(expert_starts, first_local, splits, EXPERT_UP_ROWS);
    // The whole block leaves together: its threads meet at the staging's barriers.
    if (p.first >= p.end) return;
    const int end = p.end;
    const int lane = threadIdx.x % DOT_LANES;
    const int n0 = (p.col_tile * GEMM_HALF_WARPS + threadIdx.x / DOT_LANES) * GEMM_RN;
    const u64 expert = blockIdx.y;
    const W* ups[GEMM_RN];
    const W* gates[GEMM_RN];
    for (int n = 0; n < GEMM_RN; ++n) {
        const bool in = n0 + n < inter;
        const u64 at = (expert * inter + n0 + n) * hidden;
        ups[n] = in ? w_up + at : nullptr;
        gates[n] = in && w_gate ? w_gate + at : nullptr;
    }
    const bool vec = hidden % 4 == 0 && (u64)x % 16 == 0;
    const bool gated = activation == MOE_ACT_SWIGLU;
    int buf = 0;
    for (int base = p.first; base < end; base += p.stride) {
        const TokenRows rows{x, sorted_pairs, hidden, base, end, top_k};
        float up[EXPERT_UP_ROWS][GEMM_RN], gate[EXPERT_UP_ROWS][GEMM_RN];
        // The gate stages the pass's rows again (from L2): one staging for both, with both sets
        // of weights in flight, took 168 registers and spilled (146 this way).
        dot_tile_staged(rows, ups, hidden, vec, lane, chunks, buf, up);
        if (gated) dot_tile_staged(rows, gates, hidden, vec, lane, chunks, buf, gate);
        // Unrolled, so that up and gate stay in registers (an index the compiler cannot resolve
        // puts an array in local memory; tests/cuda_kernels_compile.rs checks that none is there).
#pragma unroll
        for (int r = 0; r < EXPERT_UP_ROWS; ++r) {
#pragma unroll
            for (int n = 0; n < GEMM_RN; ++n) {
                const float u = fold16(up[r][n]);
                const float g = gated ? fold16(gate[r][n]) : 0.0f;
                const int row = base + r;
                if (lane != 0 || row >= end || !ups[n]) continue;
                act[(u64)row * inter + n0 + n] = expert_activation(activation, u, g);
            }
        }
    }
}

extern "C" __global__ void __launch_bounds__(128) moe_expert_up(
    const float* x, const bf16_t* w_up, const bf16_t* w_gate, const int* sorted_pairs,
    const int* expert_starts, float* act, int top_k, int hidden, int inter, int activation,
    int first_local, int splits) {
    __shared__ f32x4 chunks[2 * EXPERT_UP_ROWS * DOT_STAGE_K / 4];
    expert_up(x, w_up, w_gate, sorted_pairs, expert_starts, act, top_k, hidden, inter,
              activation, first_local, splits, reinterpret_cast<float*>(chunks));
}

extern "C" __global__ void __launch_bounds__(128) moe_expert_up_f32w(
    const float* x, const float* w_up, const float* w_gate, const int* sorted_pairs,
    const int* expert_starts, float* act, int top_k, int hidden, int inter, int activation,
    int first_local, int splits) {
    __shared__ f32x4 chunks[2 * EXPERT_UP_ROWS * DOT_STAGE_K / 4];
    expert_up(x, w_up, w_gate, sorted_pairs, expert_starts, act, top_k, hidden, inter,
              activation, first_local, splits, reinterpret_cast<float*>(chunks));
}

// out[row, h] = act[row, :] . down[e, h, :] for every sorted row. W: bf16_t or float.
template <typename W>
__device__ __forceinline__ void expert_down(
    const float* __restrict__ act,           // device [num_pairs, inter]
    const W* __restrict__ w_down,            // device [num_local, hidden, inter]
    const int* __restrict__ expert_starts,   // device [num_experts + 1]
    float* __restrict__ out,                 // device [num_pairs, hidden]
    int hidden,
    int inter,
    int first_local,
    int splits,
    float* chunks) {
    const ExpertPasses p = expert_passes(expert_starts, first_local, splits, EXPERT_DOWN_ROWS);
    if (p.first >= p.end) return;
    const int end = p.end;
    const int lane = threadIdx.x % DOT_LANES;
    const int n0 = (p.col_tile * GEMM_HALF_WARPS + threadIdx.x / DOT_LANES) * GEMM_RN;
    const u64 expert = blockIdx.y;
    const W* ws[GEMM_RN];
    for (int n = 0; n < GEMM_RN; ++n)
        ws[n] = n0 + n < hidden ? w_down + (expert * hidden + n0 + n) * inter : nullptr;
    const bool vec = inter % 4 == 0 && (u64)act % 16 == 0;
    int buf = 0;
    for (int base = p.first; base < end; base += p.stride) {
        const SortedRows rows{act, inter, base, end};
        float acc[EXPERT_DOWN_ROWS][GEMM_RN];
        dot_tile_staged(rows, ws, inter, vec, lane, chunks, buf, acc);
#pragma unroll
        for (int r = 0; r < EXPERT_DOWN_ROWS; ++r) {
#pragma unroll
            for (int n = 0; n < GEMM_RN; ++n) {
                const float v = fold16(acc[r][n]);
                const int row = base + r;
                if (lane != 0 || row >= end || !ws[n]) continue;
                out[(u64)row * hidden + n0 + n] = v;
            }
        }
    }
}

extern "C" __global__ void __launch_bounds__(128) moe_expert_down(
    const float* act, const bf16_t* w_down, const int* expert_starts,
    float* out, int hidden, int inter, int first_local, int splits) {
    __shared__ f32x4 chunks[2 * EXPERT_DOWN_ROWS * DOT_STAGE_K / 4];
    expert_down(act, w_down, expert_starts, out, hidden, inter, first_local, splits,
                reinterpret_cast<float*>(chunks));
}

extern "C" __global__ void __launch_bounds__(128) moe_expert_down_f32w(
    const float* act, const float* w_down, const int* expert_starts,
    float* out, int hidden, int inter, int first_local, int splits) {
    __shared__ f32x4 chunks[2 * EXPERT_DOWN_ROWS * DOT_STAGE_K / 4];
    expert_down(act, w_down, expert_starts, out, hidden, inter, first_local, splits,
                reinterpret_cast<float*>(chunks));
}

// The row variants, for decode-sized steps (at most one row per expert on average: a few tokens).
// There a staged pass holds one or two rows, and a block walks k in chunks, each a round trip to
// memory behind a barrier; here a block takes one sorted row and GEMM_HALF_WARPS of its output
// columns, a half-warp one column, with several stripes of each weight row requested ahead
// (dot_rows), as the one-row dense product does. Each output is still cpu::dot's, so a row's bits
// are the staged kernels' and do not depend on which of the two a step takes.
//
// Block: 128 threads. Grid: (num_pairs, ceil(cols / GEMM_HALF_WARPS)): a function of the step's
// size only, so a decode graph's launch holds whatever the routing.

// Stripes requested ahead: up reads hidden-wide rows (two of them with a gate), down
// inter-wide ones (fewer stripes; with f32 weights ptxas spilled at 16).
#define EXPERT_UP_ROW_UNROLL 16
#define EXPERT_DOWN_ROW_UNROLL 8

// Where a block of a row kernel stands: its sorted row p (blockIdx.x), the rank's local index e
// of the expert the row belongs to (expert_starts[e'] <= p < expert_starts[e' + 1] for the
// global e'; -1 for another rank's expert), found by the block's threads together, and the
// half-warp's lane and output column. Every thread of the block must call it.
struct ExpertRowBlock {
    int p, e, lane, col;
};

__device__ __forceinline__ ExpertRowBlock expert_row_block(
    const int* __restrict__ expert_starts, int first_local, int num_local, int* slot) {
    const int p = blockIdx.x;
    if (threadIdx.x == 0) *slot = -1;
    __syncthreads();
    for (int e = threadIdx.x; e < num_local; e += blockDim.x) {
        const int global = first_local + e;
        if (expert_starts[global] <= p && p < expert_starts[global + 1]) *slot = e;
    }
    __syncthreads();
    return ExpertRowBlock{p, *slot, (int)threadIdx.x % DOT_LANES,
                          (int)(blockIdx.y * GEMM_HALF_WARPS + threadIdx.x / DOT_LANES)};
}

template <typename W>
__device__ __forceinline__ void expert_up_row(
    const float* __restrict__ x, const W* __restrict__ w_up, const W* __restrict__ w_gate,
    const int* __restrict__ sorted_pairs, const int* __restrict__ expert_starts,
    float* __restrict__ act, int top_k, int hidden, int inter, int activation, int first_local,
    int num_local) {
    __shared__ int expert_slot;
    const ExpertRowBlock b = expert_row_block(expert_starts, first_local, num_local, &expert_slot);
    if (b.e < 0) return;
    const int p = b.p, e = b.e, lane = b.lane, col = b.col;
    // A half-warp past the columns reads the last one (fold16 needs every lane), storing nothing.
    const u64 at = ((u64)e * inter + min(col, inter - 1)) * hidden;
    const float* xr = x + (u64)(sorted_pairs[p] / top_k) * hidden;
    float u, g = 0.0f;
    if (activation == MOE_ACT_SWIGLU) {
        const W* ws[2] = {w_up + at, w_gate + at};
        float acc[2];
        dot_rows<EXPERT_UP_ROW_UNROLL>(xr, ws, hidden, lane, acc);
        u = fold16(acc[0]);
        g = fold16(acc[1]);
    } else {
        const W* ws[1] = {w_up + at};
        float acc[1];
        dot_rows<EXPERT_UP_ROW_UNROLL>(xr, ws, hidden, lane, acc);
        u = fold16(acc[0]);
    }
    if (lane == 0 && col < inter) act[(u64)p * inter + col] = expert_activation(activation, u, g);
}

extern "C" __global__ void __launch_bounds__(128) moe_expert_up_row(
    const float* x, const bf16_t* w_up, const bf16_t* w_gate, const int* sorted_pairs,
    const int* expert_starts, float* act, int top_k, int hidden, int inter, int activation,
    int first_local, int num_local) {
    expert_up_row(x, w_up, w_gate, sorted_pairs, expert_starts, act, top_k, hidden, inter,
                  activation, first_local, num_local);
}

extern "C" __global__ void __launch_bounds__(128) moe_expert_up_row_f32w(
    const float* x, const float* w_up, const float* w_gate, const int* sorted_pairs,
    const int* expert_starts, float* act, int top_k, int hidden, int inter, int activation,
    int first_local, int num_local) {
    expert_up_row(x, w_up, w_gate, sorted_pairs, expert_starts, act, top_k, hidden, inter,
                  activation, first_local, num_local);
}

template <typename W>
__device__ __forceinline__ void expert_down_row(
    const float* __restrict__ act, const W* __restrict__ w_down,
    const int* __restrict__ expert_starts, float* __restrict__ out, int hidden, int inter,
    int first_local, int num_local) {
    __shared__ int expert_slot;
    const ExpertRowBlock b = expert_row_block(expert_starts, first_local, num_local, &expert_slot);
    if (b.e < 0) return;
    const int p = b.p, e = b.e, lane = b.lane, col = b.col;
    const W* ws[1] = {w_down + ((u64)e * hidden + min(col, hidden - 1)) * inter};
    float acc[1];
    dot_rows<EXPERT_DOWN_ROW_UNROLL>(act + (u64)p * inter, ws, inter, lane, acc);
    const float v = fold16(acc[0]);
    if (lane == 0 && col < hidden) out[(u64)p * hidden + col] = v;
}

extern "C" __global__ void __launch_bounds__(128) moe_expert_down_row(
    const float* act, const bf16_t* w_down, const int* expert_starts, float* out, int hidden,
    int inter, int first_local, int num_local) {
    expert_down_row(act, w_down, expert_starts, out, hidden, inter, first_local, num_local);
}

extern "C" __global__ void __launch_bounds__(128) moe_expert_down_row_f32w(
    const float* act, const float* w_down, const int* expert_starts, float* out, int hidden,
    int inter, int first_local, int num_local) {
    expert_down_row(act, w_down, expert_starts, out, hidden, inter, first_local, num_local);
}
