// Deterministic counting sort of the step's (token, rank) pairs by expert, the order of the CPU
// MoE block: experts ascending, and within an expert its pairs in pair order (pair = token *
// top_k + rank).
//
// Outputs: sorted_pairs[row] (the pair of each row, a row per pair), pair_rows[pair]
// (where the pair's output row sits, for the combine) and expert_starts[e] (expert e's first row;
// expert_starts[num_experts] is the number of pairs), which the grouped expert products walk.
//
// One block of MOE_SORT_THREADS threads walks the pairs in chunks of a pair per thread. In a
// chunk, each lane learns by shuffles how many earlier lanes of its warp hold its expert, and the
// warp's last lane holding an expert writes the warp's count of it. A pair's row is then its
// expert's start, plus the expert's pairs in earlier chunks, in earlier warps of its chunk and in
// earlier lanes of its warp. Two passes over the pairs: the first counts (hence the starts), the
// second places. No atomics, so the order is fixed by the data alone, and the work of a chunk is
// spread over every thread whatever the routing (a thread per expert scanning every pair was
// serial in long prefills).
//
// Dynamic shared memory: (MOE_SORT_WARPS + 1) * num_experts ints.

#define MOE_SORT_THREADS 256
#define MOE_SORT_WARPS (MOE_SORT_THREADS / 32)

// How many lanes of the warp before this one hold `e`; `last`: whether no lane after it does.
__device__ __forceinline__ int lanes_before(int e, bool& last) {
    const int lane = threadIdx.x % 32;
    int before = 0, after = 0;
    for (int l = 0; l < 32; ++l) {
        const int other = __shfl_sync(0xffffffffu, e, l);
        before += other == e && l < lane;
        after += other == e && l > lane;
    }
    last = after == 0;
    return before;
}

// The expert of this thread's pair of the chunk at c0 (-1 past the pairs, or for an id out of
// range, which no row takes), and in `before` the pairs of that expert in earlier lanes of the
// warp. Writes the warp's count of each expert it holds into warp_counts[warp][e], whose other
// entries must be zero.
__device__ __forceinline__ int chunk_expert(
    const int* ids, int c0, int num_pairs, int num_experts, int* warp_counts, int& before) {
    const int pair = c0 + (int)threadIdx.x;
    int e = pair < num_pairs ? ids[pair] : -1;
    if (e < 0 || e >= num_experts) e = -1;
    bool last;
    before = lanes_before(e, last);
    if (e >= 0 && last) warp_counts[(threadIdx.x / 32) * num_experts + e] = before + 1;
    return e;
}

// Adds each expert's count of the chunk, over the warps, to totals[e], and clears the warps'
// counts for the next chunk.
__device__ __forceinline__ void fold_chunk(int* warp_counts, int* totals, int num_experts) {
    for (int e = threadIdx.x; e < num_experts; e += MOE_SORT_THREADS) {
        int n = 0;
        for (int w = 0; w < MOE_SORT_WARPS; ++w) {
            n += warp_counts[w * num_experts + e];
            warp_counts[w * num_experts + e] = 0;
        }
        totals[e] += n;
    }
}

// Each expert's first row from the counts in `totals`, into expert_starts and back into
// `totals` (where the placing pass advances them): warp 0 scans 32 experts at a time.
__device__ __forceinline__ void expert_starts_from_counts(
    int* totals, int* expert_starts, int num_experts) {
    const int lane = threadIdx.x;
    if (lane >= 32) return;
    int carry = 0;
    for (int e0 = 0; e0 < num_experts; e0 += 32) {
        const int e = e0 + lane;
        const int n = e < num_experts ? totals[e] : 0;
        int sum = n;
        for (int d = 1; d < 32; d *= 2) {
            const int up = __shfl_up_sync(0xffffffffu, sum, d);
            if (lane >= d) sum += up;
        }
        if (e < num_experts) totals[e] = expert_starts[e] = carry + sum - n;
        carry += __shfl_sync(0xffffffffu, sum, 31);
    }
    if (lane == 0) expert_starts[num_experts] = carry;
}

extern "C" __global__ void __launch_bounds__(MOE_SORT_THREADS) moe_sort_pairs(
    const int* __restrict__ topk_ids,    // device [num_pairs]
    int* __restrict__ sorted_pairs,      // device [num_pairs]
    int* __restrict__ pair_rows,         // device [num_pairs]
    int* __restrict__ expert_starts,     // device [num_experts + 1]
    int num_pairs,
    int num_experts) {
    extern __shared__ int sort_smem[];
    int* warp_counts = sort_smem;                            // [MOE_SORT_WARPS][num_experts]
    int* totals = sort_smem + MOE_SORT_WARPS * num_experts;  // [num_experts]
    const int tid = threadIdx.x, warp = tid / 32;
    for (int i = tid; i < (MOE_SORT_WARPS + 1) * num_experts; i += MOE_SORT_THREADS)
        sort_smem[i] = 0;
    __syncthreads();
    int before;
    // Pass 1: each expert's pairs.
    for (int c0 = 0; c0 < num_pairs; c0 += MOE_SORT_THREADS) {
        chunk_expert(topk_ids, c0, num_pairs, num_experts, warp_counts, before);
        __syncthreads();
        fold_chunk(warp_counts, totals, num_experts);
        __syncthreads();
    }
    expert_starts_from_counts(totals, expert_starts, num_experts);
    __syncthreads();
    // Pass 2: rows; totals[e] is expert e's first row not yet taken.
    for (int c0 = 0; c0 < num_pairs; c0 += MOE_SORT_THREADS) {
        const int e = chunk_expert(topk_ids, c0, num_pairs, num_experts, warp_counts, before);
        __syncthreads();
        if (e >= 0) {
            int row = totals[e] + before;
            for (int w = 0; w < warp; ++w) row += warp_counts[w * num_experts + e];
            sorted_pairs[row] = c0 + tid;
            pair_rows[c0 + tid] = row;
        }
        __syncthreads();
        fold_chunk(warp_counts, totals, num_experts);
        __syncthreads();
    }
}
