// Deterministic counting sort of the step's (token, rank) pairs by expert, the order of the CPU
// MoE block: experts ascending, and within an expert its pairs in pair order (pair = token *
// top_k + rank).
//
// Outputs: sorted_pairs[row] (the pair of each row, a row per pair), pair_rows[pair]
// (where the pair's output row sits, for the combine) and expert_starts[e] (expert e's first row;
// expert_starts[num_experts] is the number of pairs), which the grouped expert products walk.
//
// One block of MOE_SORT_THREADS threads. Thread e counts and then places expert e's pairs
// (e, e + blockDim, ... for more experts than threads), scanning the ids in pair order from
// shared memory in chunks: no atomics, so the order is fixed by the data alone.

#define MOE_SORT_THREADS 1024
#define MOE_SORT_CHUNK 4096

extern "C" __global__ void __launch_bounds__(MOE_SORT_THREADS) moe_sort_pairs(
    const int* __restrict__ topk_ids,    // device [num_pairs]
    int* __restrict__ sorted_pairs,      // device [num_pairs]
    int* __restrict__ pair_rows,         // device [num_pairs]
    int* __restrict__ expert_counts,     // device [num_experts] (scratch)
    int* __restrict__ expert_starts,     // device [num_experts + 1]
    int num_pairs,
    int num_experts) {
    __shared__ int chunk[MOE_SORT_CHUNK];
    const int tid = threadIdx.x;
    for (int e = tid; e < num_experts; e += blockDim.x) expert_counts[e] = 0;
    __syncthreads();
    // Pass 1: counts.
    for (int c0 = 0; c0 < num_pairs; c0 += MOE_SORT_CHUNK) {
        int len = min(MOE_SORT_CHUNK, num_pairs - c0);
        __syncthreads();
        for (int i = tid; i < len; i += blockDim.x) chunk[i] = topk_ids[c0 + i];
        __syncthreads();
        for (int e = tid; e < num_experts; e += blockDim.x) {
            int n = 0;
            for (int i = 0; i < len; ++i) n += chunk[i] == e;
            expert_counts[e] += n;
        }
    }
    __syncthreads();
    // Starts: a serial prefix sum (experts are few).
    if (tid == 0) {
        int at = 0;
        for (int e = 0; e < num_experts; ++e) {
            expert_starts[e] = at;
            at += expert_counts[e];
        }
        expert_starts[num_experts] = at;
    }
    __syncthreads();
    // Pass 2: places, each expert's pairs in pair order.
    for (int e = tid; e < num_experts; e += blockDim.x) expert_counts[e] = expert_starts[e];
    for (int c0 = 0; c0 < num_pairs; c0 += MOE_SORT_CHUNK) {
        int len = min(MOE_SORT_CHUNK, num_pairs - c0);
        __syncthreads();
        for (int i = tid; i < len; i += blockDim.x) chunk[i] = topk_ids[c0 + i];
        __syncthreads();
        for (int e = tid; e < num_experts; e += blockDim.x) {
            int at = expert_counts[e];
            for (int i = 0; i < len; ++i) {
                if (chunk[i] != e) continue;
                sorted_pairs[at] = c0 + i;
                pair_rows[c0 + i] = at;
                ++at;
            }
            expert_counts[e] = at;
        }
    }
}
