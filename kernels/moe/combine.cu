// A token's MoE output: its experts' rows weighted in rank order, then the shared expert's output
// added, out = ((0 + w0 * e0) + w1 * e1 + ...) + shared, as the CPU block sums them.
//
// Grid: (ceil(hidden / blockDim.x), num_tokens).
extern "C" __global__ void moe_combine(
    const float* __restrict__ expert_out,    // device [max_sorted_rows, hidden]
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
