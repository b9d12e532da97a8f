// A token's MoE output: its experts' rows weighted in rank order, then the shared expert's output
// added, out = ((0 + w0 * e0) + w1 * e1 + ...) + shared, as the CPU block sums them.
//
// Grid: (ceil(hidden / blockDim.x), num_tokens).
extern "C" __global__ void moe_combine(
    const float* __restrict__ expert_out,    // device [num_pairs, hidden]
    const int* __restrict__ pair_rows,       // device [num_tokens * top_k]
    const float* __restrict__ topk_weights,  // device [num_tokens, top_k]
    const float* __restrict__ shared,        // device [num_tokens, hidden] or null
    float* __restrict__ out,                 // device [num_tokens, hidden]
    int top_k,
    int hidden) {
    const int t = blockIdx.y;
    const int h = blockIdx.x * blockDim.x + threadIdx.x;
    if (h >= hidden) return;
    float o = 0.0f;
    for (int j = 0; j < top_k; ++j) {
        u64 pair = (u64)t * top_k + j;
        o = add(o, mul(topk_weights[pair], expert_out[(u64)pair_rows[pair] * hidden + h]));
    }
    if (shared) o = add(o, shared[(u64)t * hidden + h]);
    out[(u64)t * hidden + h] = o;
}

// Expert parallelism over GPUs that read each other's memory: copies the rows of the other
// ranks' experts from their buffers into this rank's, so that the combine reads every row one GPU
// would have computed. Rank q holds experts q * num_local .. (q + 1) * num_local, so its rows are
// the run expert_starts[q * num_local] .. expert_starts[(q + 1) * num_local] of the sorted layout,
// the same on every rank. A plain copy: the rows keep their bits.
//
// Grid: (num_pairs); a block per row. Rows past the step's, and this rank's own, return.
extern "C" __global__ void moe_gather_peer_rows(
    float* __restrict__ expert_out,         // device [num_pairs, hidden]: this rank's
    const u64* __restrict__ peer_rows,      // device [world_size]: each rank's expert_out
    const int* __restrict__ expert_starts,  // device [world_size * num_local + 1]
    int num_local,
    int rank,
    int world_size,
    int hidden) {
    const int row = blockIdx.x;
    int owner = 0;
    while (owner < world_size && row >= expert_starts[(owner + 1) * num_local]) ++owner;
    if (owner == world_size || owner == rank) return;
    const float* src = reinterpret_cast<const float*>(peer_rows[owner]) + (u64)row * hidden;
    float* dst = expert_out + (u64)row * hidden;
    for (int h = threadIdx.x; h < hidden; h += blockDim.x) dst[h] = src[h];
}
