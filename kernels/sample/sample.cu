// Token selection from a row of logits: greedy argmax, log-softmax, seeded sampling with
// temperature, top-k, min-p and top-p, and the ranks and alternatives of logprobs. argmax takes a
// block of SAMPLE_THREADS threads per row; the others, which read a row several times, a thread
// block cluster of up to SAMPLE_CLUSTER such blocks (as many as the vocabulary keeps busy, one
// where the device has no clusters: the launch's gridDim.x), each over its stripes of the row.
// Every reduction is a fixed tree (thread stripes, warp butterflies, the warps' partials, then the
// blocks' in rank order), so a row's result depends on the row and the number of blocks alone,
// never on the other rows.

#define SAMPLE_THREADS 512
#define SAMPLE_WARPS (SAMPLE_THREADS / 32)
// Most blocks of a row's cluster (the portable limit).
#define SAMPLE_CLUSTER 8

// Index of the first maximum (ties to the lower index), cpu::argmax.
extern "C" __global__ void __launch_bounds__(SAMPLE_THREADS) argmax_f32(
    const float* __restrict__ logits,  // device [num_rows, vocab]
    u32* __restrict__ out,             // device [num_rows]
    int vocab) {
    __shared__ float best_v[SAMPLE_THREADS];
    __shared__ int best_i[SAMPLE_THREADS];
    const float* row = logits + (u64)blockIdx.x * vocab;
    float bv = neg_inf();
    int bi = -1;
    // Selects, not a branch per token: the loop's loads then leave ahead of the comparisons.
    for (int i = threadIdx.x; i < vocab; i += SAMPLE_THREADS) {
        const float v = row[i];
        const bool better = bi < 0 || v > bv;
        bv = better ? v : bv;
        bi = better ? i : bi;
    }
    best_v[threadIdx.x] = bv;
    best_i[threadIdx.x] = bi;
    for (int width = SAMPLE_THREADS / 2; width > 0; width >>= 1) {
        __syncthreads();
        if (threadIdx.x < width) {
            float ov = best_v[threadIdx.x + width];
            int oi = best_i[threadIdx.x + width];
            bool better = oi >= 0 && (best_i[threadIdx.x] < 0 || ov > best_v[threadIdx.x] ||
                                      (ov == best_v[threadIdx.x] && oi < best_i[threadIdx.x]));
            if (better) { best_v[threadIdx.x] = ov; best_i[threadIdx.x] = oi; }
        }
    }
    if (threadIdx.x == 0) out[blockIdx.x] = (u32)best_i[0];
}

// Per-row sampling parameters; the Rust side mirrors this layout.
struct SampleParams {
    u64 seed;
    u64 index;          // the token's index in the request's output: selects the random number
    float temperature;  // > 0
    float top_p;        // (0, 1]
    u32 top_k;          // 0: no limit
    float min_p;        // [0, 1]; 0: no limit
};

// A uniform number in [0, 1) from (seed, index): SplitMix64's finaliser, as the CPU sampler.
__device__ __forceinline__ double uniform(u64 seed, u64 index) {
    u64 z = seed + (index + 1) * 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    return (double)(z >> 11) / (double)(1ull << 53);
}

// Rank key of token i: larger sorts first; logits in total order, ties to the lower id, the
// order the CPU sampler sorts its candidates in.
__device__ __forceinline__ u64 rank_key(float logit, int i) {
    return ((u64)total_order_key(logit) << 32) | (u64)(0xffffffffu - (u32)i);
}

#define SEARCH_WAYS 8

// Candidates a thread lists for the later passes of a search (search_cut): its tokens inside the
// interval, in stripe order.
#define SEARCH_LIST 8

// Words a block publishes per exchange: a search pass's masses and counts.
#define EXCHANGE_WORDS (2 * SEARCH_WAYS)

// The shared memory of a row's block (dynamic, as a kernel launched in clusters keeps it).
#define SAMPLE_SMEM_BYTES 20480
struct RowShared {
    // This block's partials, for the other blocks to read: two, so that an exchange never
    // overwrites the one before it while a block may still be reading it.
    u64 part[2][EXCHANGE_WORDS];
    // Every block's partials of the last exchange, in rank order.
    u64 gathered[SAMPLE_CLUSTER][EXCHANGE_WORDS];
    // The warps' partials: a word per warp, or a search pass's masses and counts per warp.
    u64 words[SAMPLE_WARPS];
    double mass[SEARCH_WAYS][SAMPLE_WARPS];
    u32 count[SEARCH_WAYS][SAMPLE_WARPS];
    // A search's candidates: SEARCH_LIST ids per thread, entry c of thread t at
    // [c * SAMPLE_THREADS + t].
    int listed_ids[SEARCH_LIST * SAMPLE_THREADS];
};
static_assert(sizeof(RowShared) <= SAMPLE_SMEM_BYTES, "SAMPLE_SMEM_BYTES holds a row block's shared memory");

// The block's shared memory through its symbol, so that ptxas knows the accesses are shared ones
// (a pointer kept in a register would be generic).
__device__ __forceinline__ RowShared& row_shared() {
    extern __shared__ u64 sample_smem[];
    return *reinterpret_cast<RowShared*>(sample_smem);
}

// A block's share of its row: the row is blockIdx.y, the block blockIdx.x of the gridDim.x blocks
// (a cluster's ranks) that take it; thread t of block b takes tokens b * SAMPLE_THREADS + t,
// stepping over the cluster's threads. Those figures come from the special registers where used
// rather than holding registers of their own.
struct RowPart {
    int parity;  // the `part` the next exchange publishes
    __device__ __forceinline__ int num_ranks() const { return (int)gridDim.x; }
    __device__ __forceinline__ int first() const { return (int)(blockIdx.x * SAMPLE_THREADS + threadIdx.x); }
    __device__ __forceinline__ int stride() const { return (int)(gridDim.x * SAMPLE_THREADS); }
};

// Publishes the block's `n` words (in part[parity], written before the call) and gathers every
// block's into `gathered`, in rank order, for every thread to fold. A block writes a `part` again
// two exchanges later, after the cluster barrier of the one between, which every block reaches
// only once done reading it. Kernels end with cluster_sync, so that no block leaves while another
// may still read its partials.
__device__ __forceinline__ void exchange(RowPart& g, int n) {
    RowShared& s = row_shared();
    cluster_sync();
    if ((int)threadIdx.x < g.num_ranks() * n) {
        const int r = threadIdx.x / n, w = threadIdx.x % n;
        s.gathered[r][w] = *cluster_map(&s.part[g.parity][w], (u32)r);
    }
    __syncthreads();
    g.parity ^= 1;
}

__device__ __forceinline__ u64 to_word(float v) { return __float_as_uint(v); }
__device__ __forceinline__ u64 to_word(u64 v) { return v; }
template <typename T>
__device__ __forceinline__ T from_word(u64 w);
template <>
__device__ __forceinline__ float from_word<float>(u64 w) { return __uint_as_float((u32)w); }
template <>
__device__ __forceinline__ u64 from_word<u64>(u64 w) { return w; }

// `op` over the row, every thread's `v`, the result in every thread: butterflies within each warp,
// then thread 0 folds the warps' in order, then every thread folds the blocks' in rank order. A
// fixed tree, whatever the rows beside.
template <typename T, typename Op>
__device__ __forceinline__ T row_reduce(T v, RowPart& g, Op op) {
    RowShared& s = row_shared();
    for (int o = 16; o > 0; o >>= 1) v = op(v, __shfl_xor_sync(FULL_MASK, v, o));
    __syncthreads();  // the warps' words are free again
    if (threadIdx.x % 32 == 0) s.words[threadIdx.x / 32] = to_word(v);
    __syncthreads();
    if (threadIdx.x == 0) {
        T b = from_word<T>(s.words[0]);
        for (int w = 1; w < SAMPLE_WARPS; ++w) b = op(b, from_word<T>(s.words[w]));
        s.part[g.parity][0] = to_word(b);
    }
    exchange(g, 1);
    T r = from_word<T>(s.gathered[0][0]);
    for (int q = 1; q < g.num_ranks(); ++q) r = op(r, from_word<T>(s.gathered[q][0]));
    return r;
}

__device__ __forceinline__ u64 row_max_key(u64 v, RowPart& g) {
    return row_reduce(v, g, [](u64 a, u64 b) { return max(a, b); });
}
__device__ __forceinline__ float row_max(float v, RowPart& g) {
    return row_reduce(v, g, [](float a, float b) { return fmaxf(a, b); });
}
__device__ __forceinline__ float row_sum(float v, RowPart& g) {
    return row_reduce(v, g, [](float a, float b) { return add(a, b); });
}
__device__ __forceinline__ u64 row_count(u64 v, RowPart& g) {
    return row_reduce(v, g, [](u64 a, u64 b) { return a + b; });
}

// A search pass's SEARCH_WAYS masses and counts over the row, the result in every thread:
// butterflies within each warp, then thread j folds figure j of the warps in order (the block's),
// then every thread folds the blocks' in rank order. The per-way arrays are indexed by constants
// only (see search_cut).
__device__ __forceinline__ void row_reduce_ways(
    double (&mass)[SEARCH_WAYS], u32 (&count)[SEARCH_WAYS], RowPart& g) {
    RowShared& s = row_shared();
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
#pragma unroll
    for (int j = 0; j < SEARCH_WAYS; ++j) {
        for (int o = 16; o > 0; o >>= 1) {
            mass[j] += __shfl_xor_sync(FULL_MASK, mass[j], o);
            count[j] += __shfl_xor_sync(FULL_MASK, count[j], o);
        }
    }
    __syncthreads();  // the warps' figures are free again
    if (lane == 0) {
#pragma unroll
        for (int j = 0; j < SEARCH_WAYS; ++j) s.mass[j][warp] = mass[j], s.count[j][warp] = count[j];
    }
    __syncthreads();
    const int j = threadIdx.x;
    if (j < SEARCH_WAYS) {
        double m = 0.0;
        for (int w = 0; w < SAMPLE_WARPS; ++w) m += s.mass[j][w];
        s.part[g.parity][j] = (u64)__double_as_longlong(m);
    } else if (j < EXCHANGE_WORDS) {
        u32 c = 0;
        for (int w = 0; w < SAMPLE_WARPS; ++w) c += s.count[j - SEARCH_WAYS][w];
        s.part[g.parity][j] = c;
    }
    exchange(g, EXCHANGE_WORDS);
#pragma unroll
    for (int j = 0; j < SEARCH_WAYS; ++j) {
        mass[j] = 0.0, count[j] = 0;
        for (int r = 0; r < g.num_ranks(); ++r) {
            mass[j] += __longlong_as_double((i64)s.gathered[r][j]);
            count[j] += (u32)s.gathered[r][SEARCH_WAYS + j];
        }
    }
}

// log_z = max + log(sum(exp(x - max))) (the exponentials by the CPU's polynomial), and, when `out`
// is not null, out[i] = x[i] - log_z (cpu::log_softmax).
extern "C" __global__ void __launch_bounds__(SAMPLE_THREADS) log_softmax_f32(
    const float* __restrict__ logits,  // device [num_rows, vocab]
    float* __restrict__ out,           // device [num_rows, vocab] or null
    float* __restrict__ log_z,         // device [num_rows]
    int vocab) {
    RowPart g{0};
    const float* row = logits + (u64)blockIdx.y * vocab;
    float mx = neg_inf();
    for (int i = g.first(); i < vocab; i += g.stride()) mx = fmaxf(mx, row[i]);
    mx = row_max(mx, g);
    float sum = 0.0f;
    for (int i = g.first(); i < vocab; i += g.stride()) sum = add(sum, exp_nonpositive(sub(row[i], mx)));
    sum = row_sum(sum, g);
    const float lz = add(mx, logf(sum));
    if (threadIdx.x == 0 && blockIdx.x == 0) log_z[blockIdx.y] = lz;
    if (out) {
        for (int i = g.first(); i < vocab; i += g.stride()) out[(u64)blockIdx.y * vocab + i] = sub(row[i], lz);
    }
    cluster_sync();
}

// Calls f(i) for this thread's tokens: its list's `num_listed` entries, or (num_listed < 0) its
// stripes of the row, in ascending order either way.
template <typename F>
__device__ __forceinline__ void for_each_token(int vocab, int num_listed, const RowPart& g, F f) {
    if (num_listed >= 0) {
        for (int c = 0; c < num_listed; ++c) f(row_shared().listed_ids[c * SAMPLE_THREADS + threadIdx.x]);
    } else {
        for (int i = g.first(); i < vocab; i += g.stride()) f(i);
    }
}

// The largest rank key v in [lo, hi] with S(v) > target (strict) or S(v) >= target, where
// S(v) = above + the sum of weight(i) over the row's tokens with v <= key <= hi: the cut of a
// prefix of the candidates in rank order. S is non-increasing in v and S(lo) must pass. With
// `relative`, the target is target * S(lo) (a share of the interval's weight, known after the
// first pass).
//
// Each pass splits the interval at SEARCH_WAYS pivots and sums, per pivot, the weight and the
// number of tokens from it to hi: the interval becomes the bucket holding the cut, until a bucket
// holds one token, whose key a last pass takes. Every sum is a fixed tree over the row's blocks
// (row_reduce_ways), so the cut depends on the row alone.
//
// A pass over the whole row also lists each thread's tokens inside the interval. Once every
// thread's (of every block) fit in SEARCH_LIST (after a pass or two the interval holds few
// tokens), the passes visit the lists instead of the row: the same tokens of each thread (the
// interval only shrinks) in the same order, so each thread's sums, and every cut, are those of
// whole-row passes, which read the row again each time the interval narrows SEARCH_WAYS-fold.
//
// The per-way arrays are only ever indexed by constants (the loops over the ways unrolled, the
// picked way's figures taken while the ways are visited): one index not known at compile time
// puts an array in local memory, and then every token of every pass reads and writes it there
// (tests/cuda_kernels_compile.rs holds every kernel to no stack frame).
template <typename Weight>
__device__ u64 search_cut(
    const float* row, int vocab, u64 lo, u64 hi, double above, double target, bool relative,
    bool strict, Weight weight, RowPart& g) {
    // Entries of this thread's list once every thread's candidates fit (valid or not on every
    // thread alike), else -1.
    int num_listed = -1;
    for (bool first = true; lo < hi; first = false) {
        const u64 span = hi - lo, step = span / SEARCH_WAYS + 1;
        u64 pivot[SEARCH_WAYS];
#pragma unroll
        for (int j = 0; j < SEARCH_WAYS; ++j) pivot[j] = (u64)j * step <= span ? lo + (u64)j * step : ~0ull;
        double mass[SEARCH_WAYS];
        // Counts of tokens: at most the vocabulary, so 32 bits (and fewer registers).
        u32 count[SEARCH_WAYS];
#pragma unroll
        for (int j = 0; j < SEARCH_WAYS; ++j) mass[j] = 0.0, count[j] = 0;
        int* record = num_listed < 0 ? row_shared().listed_ids : nullptr;
        int listed = 0;
        for_each_token(vocab, num_listed, g, [&](int i) {
            const u64 k = rank_key(row[i], i);
            if (k < lo || k > hi) return;
            if (record) {
                if (listed < SEARCH_LIST) record[listed * SAMPLE_THREADS + threadIdx.x] = i;
                ++listed;
            }
            const double w = weight(i);
#pragma unroll
            for (int j = 0; j < SEARCH_WAYS; ++j) {
                if (pivot[j] != ~0ull && k >= pivot[j]) mass[j] += w, count[j] += 1;
            }
        });
        row_reduce_ways(mass, count, g);
        if (num_listed < 0 && row_max_key((u64)listed, g) <= SEARCH_LIST) num_listed = listed;
        if (first && relative) target *= above + mass[0];
        // The bucket [from, next) holding the cut: the last way whose sum passes, its figures
        // taken as the ways are visited.
        u64 from = pivot[0], next = pivot[1];
        u32 from_count = count[0], next_count = count[1];
        double next_mass = mass[1];
#pragma unroll
        for (int j = 1; j < SEARCH_WAYS; ++j) {
            const double s = above + mass[j];
            if (pivot[j] != ~0ull && (strict ? s > target : s >= target)) {
                from = pivot[j], from_count = count[j];
                next = j + 1 < SEARCH_WAYS ? pivot[j + 1] : ~0ull;
                next_count = j + 1 < SEARCH_WAYS ? count[j + 1] : 0u;
                next_mass = j + 1 < SEARCH_WAYS ? mass[j + 1] : 0.0;
            }
        }
        const bool last = next == ~0ull;
        lo = from;
        if (!last) hi = next - 1, above += next_mass;
        if (from_count - (last ? 0u : next_count) == 1) {
            // One token in [lo, hi]: its key.
            u64 key = 0;
            for_each_token(vocab, num_listed, g, [&](int i) {
                const u64 k = rank_key(row[i], i);
                if (k >= lo && k <= hi) key = k;
            });
            return row_max_key(key, g);
        }
    }
    return lo;
}

// Seeded sampling as the CPU sampler defines it: candidates in rank order, the first top_k of
// them, probabilities exp((logit - max) / temperature), those at least min_p (relative to the
// most likely's, which is 1: a head of the order), the shortest head whose mass reaches top_p of
// the total, then the first candidate whose cumulative mass exceeds u * (kept mass). The weights
// are the host's bit for bit (exp_nonpositive). Instead of sorting, each cut is found by a search
// over rank keys with block-wide sums (search_cut; masses in f64 where the host sums exactly): the
// token equals the CPU's except when u lands within rounding of a boundary of the CDF or the
// top-p cut.
extern "C" __global__ void __launch_bounds__(SAMPLE_THREADS) sample_f32(
    const float* __restrict__ logits,          // device [num_rows, vocab]
    const SampleParams* __restrict__ params,   // device [num_rows]
    u32* __restrict__ out,                     // device [num_rows]
    int vocab) {
    RowPart g{0};
    const float* row = logits + (u64)blockIdx.y * vocab;
    const SampleParams pr = params[blockIdx.y];
    float mx = neg_inf();
    u64 top = 0;
    for (int i = g.first(); i < vocab; i += g.stride()) {
        mx = fmaxf(mx, row[i]);
        top = max(top, rank_key(row[i], i));
    }
    mx = row_max(mx, g);
    top = row_max_key(top, g);
    const float inv_t = dvd(1.0f, pr.temperature);
    auto one = [](int) { return 1.0; };
    // The host sampler's weights, bit for bit: the CPU's polynomial exp.
    auto prob = [=](int i) { return (double)exp_nonpositive(mul(sub(row[i], mx), inv_t)); };
    u64 floor = 0;
    if (pr.top_k > 0 && pr.top_k < (u32)vocab)
        floor = search_cut(row, vocab, 0, top, 0.0, (double)pr.top_k, false, false, one, g);
    if (pr.min_p > 0.0f) {
        // The last kept candidate is the smallest key whose probability reaches min_p; the most
        // likely token (probability 1) always does, as the CPU keeps at least one.
        u64 last = ~0ull;
        for (int i = g.first(); i < vocab; i += g.stride()) {
            u64 k = rank_key(row[i], i);
            bool keep = k >= floor && exp_nonpositive(mul(sub(row[i], mx), inv_t)) >= pr.min_p;
            if (keep && k < last) last = k;
        }
        floor = ~row_max_key(~last, g);
    }
    if (pr.top_p < 1.0f)
        floor = search_cut(
            row, vocab, floor, top, 0.0, (double)pr.top_p, true, false, prob, g);
    const double u = uniform(pr.seed, pr.index);
    const u64 chosen = search_cut(row, vocab, floor, top, 0.0, u, true, true, prob, g);
    if (threadIdx.x == 0 && blockIdx.x == 0) out[blockIdx.y] = 0xffffffffu - (u32)(chosen & 0xffffffffull);
    cluster_sync();
}

// One token's logit bias and penalties (crate::logit_edits): the CPU sampler's passes over that
// token, in order.
struct LogitEdit {
    u32 token;
    u32 ops;           // EDIT_BIAS | EDIT_REPETITION | EDIT_PENALTIES
    float bias;        // added first
    float repetition;  // divides a positive logit, multiplies any other
    float frequency;   // frequency_penalty * count, subtracted
    float presence;    // subtracted last
};

#define EDIT_BIAS 1u
#define EDIT_REPETITION 2u
#define EDIT_PENALTIES 4u

// Applies each device row's edits to its logits row, keeping the raw values in `saved`, or (with
// `restore`) puts the raw values back, so that the choice sees the edited row and the logprobs
// the raw one. A row's edits touch distinct tokens: the threads of its block take them in turn.
//
// Grid: one block per row.
extern "C" __global__ void logit_edits_f32(
    float* __restrict__ logits,              // device [num_rows, vocab]
    const int* __restrict__ edit_starts,     // device [num_rows + 1]
    const LogitEdit* __restrict__ edits,     // device [edit_starts[num_rows]]
    float* __restrict__ saved,               // device [edit_starts[num_rows]]
    int vocab,
    int restore) {
    float* row = logits + (u64)blockIdx.x * vocab;
    for (int e = edit_starts[blockIdx.x] + threadIdx.x; e < edit_starts[blockIdx.x + 1]; e += blockDim.x) {
        const LogitEdit ed = edits[e];
        float* at = row + ed.token;
        if (restore) {
            *at = saved[e];
            continue;
        }
        float l = *at;
        saved[e] = l;
        if (ed.ops & EDIT_BIAS) l = add(l, ed.bias);
        if (ed.ops & EDIT_REPETITION) l = l > 0.0f ? dvd(l, ed.repetition) : mul(l, ed.repetition);
        if (ed.ops & EDIT_PENALTIES) l = sub(sub(l, ed.frequency), ed.presence);
        *at = l;
    }
}

// The logprob of each row's chosen token: logits[r][ids[r]] - log_z[r], the CPU sampler's
// `logits[token] - log_z` with log_z from log_softmax_f32.
//
// Grid: ceil(num_rows / blockDim.x).
extern "C" __global__ void gather_logprob_f32(
    const float* __restrict__ logits,  // device [num_rows, vocab]
    const u32* __restrict__ ids,       // device [num_rows]
    const float* __restrict__ log_z,   // device [num_rows]
    float* __restrict__ out,           // device [num_rows]
    int vocab,
    int num_rows) {
    int r = blockIdx.x * blockDim.x + threadIdx.x;
    if (r < num_rows) out[r] = sub(logits[(u64)r * vocab + ids[r]], log_z[r]);
}

// What a row that asks for logprobs reports besides its token's logprob, as the CPU sampler
// computes it: the token's rank (1 + the tokens ahead of it in rank order: logits in total order,
// ties to the lower id) and the row's `n` most likely tokens in that order with their logprobs
// (logit - log_z). Integer keys make both exact: the ids and ranks are the CPU's whatever the
// reduction tree. Each of the n rounds takes the largest key below the previous round's.
//
// Grid: a cluster per row, as sample_f32.
extern "C" __global__ void __launch_bounds__(SAMPLE_THREADS) top_logprobs_f32(
    const float* __restrict__ logits,  // device [num_rows, vocab]
    const u32* __restrict__ chosen,    // device [num_rows]
    const float* __restrict__ log_z,   // device [num_rows]
    u32* __restrict__ top_ids,         // device [num_rows, n] (null when n is 0)
    float* __restrict__ top_logprobs,  // device [num_rows, n] (null when n is 0)
    u32* __restrict__ ranks,           // device [num_rows]
    int vocab,
    int n) {
    RowPart g{0};
    const u32 r = blockIdx.y;
    const float* row = logits + (u64)r * vocab;
    const u32 token = chosen[r];
    const u64 key = rank_key(row[token], (int)token);
    u64 ahead = 0;
    for (int i = g.first(); i < vocab; i += g.stride()) ahead += rank_key(row[i], i) > key ? 1ull : 0ull;
    ahead = row_count(ahead, g);
    const bool lead = threadIdx.x == 0 && blockIdx.x == 0;
    if (lead) ranks[r] = ahead < 0xffffffffull ? (u32)(ahead + 1) : 0xffffffffu;
    u64 below = 0;
    for (int j = 0; j < n; ++j) {
        u64 best = 0;
        for (int i = g.first(); i < vocab; i += g.stride()) {
            u64 k = rank_key(row[i], i);
            if ((j == 0 || k < below) && k > best) best = k;
        }
        best = row_max_key(best, g);
        if (lead) {
            u32 id = 0xffffffffu - (u32)(best & 0xffffffffull);
            u64 at = (u64)r * n + j;
            top_ids[at] = id;
            top_logprobs[at] = sub(row[id], log_z[r]);
        }
        below = best;
    }
    cluster_sync();
}
