// The MoE router: from a token's router logits (f32) to its top-k experts and their weights, the
// math of crates/model/src/layers/router.rs. Expert ids come out in the canonical order:
// descending selection score, ties to the lower id. They are written three ways: as int32 for
// the expert sort, as weights in the same order, and as int16 into the routing buffer (L, N, K)
// at its fixed device address (the caller passes this layer's plane), which is what routing
// replay copies to the host.
//
// Router kinds (ROUTER_* below): softmax over all experts then top-k, optionally renormalised
// (Qwen3-MoE, Mixtral); top-k of the logits then softmax over the k (Granite); sigmoid scores with
// a selection-only correction bias, group-limited top-k, optional renormalisation and a routed
// scaling factor (Nemotron-H). Sums run serially in the CPU's order; exp is the device's expf,
// within 2 ulp of the host's, so ids equal the CPU's wherever two scores are not within a few ulp
// of each other.
//
// Block: ROUTER_WARPS warps, a warp per token. Dynamic shared memory per warp:
// router_warp_floats(num_experts) floats (see the Rust launcher).

#define ROUTER_SOFTMAX_TOPK 0
#define ROUTER_TOPK_SOFTMAX 1
#define ROUTER_SIGMOID_GROUPED 2
#define ROUTER_WARPS 4
#define ROUTER_MAX_GROUPS 64
#define ROUTER_MAX_TOP_K 32

// Index of the largest of vals[0..n) not yet taken, ties to the lower index (cpu top_k's pick),
// the same in every lane.
__device__ int warp_argmax(const float* vals, const unsigned char* taken, int n) {
    int lane = threadIdx.x % 32;
    float best = 0.0f;
    int best_i = -1;
    for (int i = lane; i < n; i += 32) {
        if (taken[i]) continue;
        if (best_i < 0 || vals[i] > best) { best = vals[i]; best_i = i; }
    }
    for (int o = 16; o > 0; o >>= 1) {
        float ov = __shfl_xor_sync(FULL_MASK, best, o);
        int oi = __shfl_xor_sync(FULL_MASK, best_i, o);
        bool better = oi >= 0 && (best_i < 0 || ov > best || (ov == best && oi < best_i));
        if (better) { best = ov; best_i = oi; }
    }
    return best_i;
}

// Writes the top `k` of vals[0..n) into ids[0..k) (canonical order); clears `taken` first.
__device__ void warp_top_k(const float* vals, unsigned char* taken, int n, int* ids, int k) {
    int lane = threadIdx.x % 32;
    for (int i = lane; i < n; i += 32) taken[i] = 0;
    __syncwarp();
    for (int j = 0; j < k; ++j) {
        int best = warp_argmax(vals, taken, n);
        if (lane == 0) { ids[j] = best; taken[best] = 1; }
        __syncwarp();
    }
}

// cpu::softmax_inplace over vals[0..n): exact max, exp(v - max) in parallel, the sum serially in
// index order, then each value times the reciprocal of the sum.
__device__ void warp_softmax(float* vals, int n) {
    int lane = threadIdx.x % 32;
    float mx = neg_inf();
    for (int i = lane; i < n; i += 32) mx = fmaxf(mx, vals[i]);
    mx = warp_max(mx);
    for (int i = lane; i < n; i += 32) vals[i] = expf(sub(vals[i], mx));
    __syncwarp();
    float inv = 0.0f;
    if (lane == 0) {
        float sum = 0.0f;
        for (int i = 0; i < n; ++i) sum = add(sum, vals[i]);
        inv = dvd(1.0f, sum);
    }
    inv = __shfl_sync(FULL_MASK, inv, 0);
    for (int i = lane; i < n; i += 32) vals[i] = mul(vals[i], inv);
    __syncwarp();
}

// Group-limited choice: a group's score is the sum of its two best choice values; experts
// outside the topk_groups best groups get -inf.
__device__ void mask_groups(float* choice, unsigned char* taken, float* group_scores, int* ids,
                            int n, int num_groups, int topk_groups) {
    int lane = threadIdx.x % 32;
    int per_group = n / num_groups;
    int take = min(2, per_group);
    for (int g = 0; g < num_groups; ++g) {
        warp_top_k(choice + g * per_group, taken, per_group, ids, take);
        if (lane == 0) {
            float s = choice[g * per_group + ids[0]];
            if (take == 2) s = add(s, choice[g * per_group + ids[1]]);
            group_scores[g] = s;
        }
        __syncwarp();
    }
    warp_top_k(group_scores, taken, num_groups, ids, topk_groups);
    for (int g = 0; g < num_groups; ++g) {
        bool keep = false;
        for (int j = 0; j < topk_groups; ++j) keep |= ids[j] == g;
        if (!keep)
            for (int i = lane; i < per_group; i += 32) choice[g * per_group + i] = neg_inf();
    }
    __syncwarp();
}

extern "C" __global__ void moe_router_topk(
    const float* __restrict__ logits,  // device [num_tokens, num_experts]
    const float* __restrict__ bias,    // device [num_experts] or null (selection-only bias)
    int* __restrict__ topk_ids,        // device [num_tokens, top_k]
    float* __restrict__ topk_weights,  // device [num_tokens, top_k]
    short* __restrict__ routing,       // device [num_tokens, top_k]: this layer's plane, or null
    int num_tokens,
    int num_experts,
    int top_k,
    int kind,
    int renormalize,
    int num_groups,
    int topk_groups,
    float scaling) {
    extern __shared__ float smem[];
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int t = blockIdx.x * ROUTER_WARPS + warp;
    if (t >= num_tokens) return;  // whole warps leave together
    const int stride =
        2 * num_experts + (num_experts + 3) / 4 + ROUTER_MAX_GROUPS + 2 * ROUTER_MAX_TOP_K;
    float* scores = smem + warp * stride;
    float* choice = scores + num_experts;
    unsigned char* taken = (unsigned char*)(choice + num_experts);
    float* group_scores = choice + num_experts + (num_experts + 3) / 4;
    int* ids = (int*)(group_scores + ROUTER_MAX_GROUPS);
    // The k weights, in shared memory rather than a local array: k is known at run time only,
    // and an array indexed by it would live in local memory.
    float* weights = (float*)(ids + ROUTER_MAX_TOP_K);
    const float* row = logits + (u64)t * num_experts;
    for (int i = lane; i < num_experts; i += 32) scores[i] = row[i];
    __syncwarp();

    if (kind == ROUTER_SOFTMAX_TOPK) {
        warp_softmax(scores, num_experts);
        warp_top_k(scores, taken, num_experts, ids, top_k);
    } else if (kind == ROUTER_TOPK_SOFTMAX) {
        warp_top_k(scores, taken, num_experts, ids, top_k);
    } else {
        for (int i = lane; i < num_experts; i += 32) {
            float s = dvd(1.0f, add(1.0f, expf(-scores[i])));
            scores[i] = s;
            choice[i] = bias ? add(s, bias[i]) : s;
        }
        __syncwarp();
        if (num_groups > 1 && topk_groups < num_groups)
            mask_groups(choice, taken, group_scores, ids, num_experts, num_groups, topk_groups);
        warp_top_k(choice, taken, num_experts, ids, top_k);
    }
    if (lane != 0) return;
    // The k weights, serially in rank order as the CPU does.
    for (int j = 0; j < top_k; ++j) weights[j] = scores[ids[j]];
    if (kind == ROUTER_TOPK_SOFTMAX) {
        float mx = neg_inf();
        for (int j = 0; j < top_k; ++j) mx = fmaxf(mx, weights[j]);
        float sum = 0.0f;
        for (int j = 0; j < top_k; ++j) { weights[j] = expf(sub(weights[j], mx)); sum = add(sum, weights[j]); }
        float inv = dvd(1.0f, sum);
        for (int j = 0; j < top_k; ++j) weights[j] = mul(weights[j], inv);
    } else if (renormalize) {
        float sum = 0.0f;
        for (int j = 0; j < top_k; ++j) sum = add(sum, weights[j]);
        sum = add(sum, kind == ROUTER_SIGMOID_GROUPED ? 1e-20f : 0.0f);
        for (int j = 0; j < top_k; ++j) weights[j] = dvd(weights[j], sum);
    }
    for (int j = 0; j < top_k; ++j) {
        float w = kind == ROUTER_SIGMOID_GROUPED ? mul(weights[j], scaling) : weights[j];
        u64 at = (u64)t * top_k + j;
        topk_ids[at] = ids[j];
        topk_weights[at] = w;
        if (routing) routing[at] = (short)ids[j];
    }
}
