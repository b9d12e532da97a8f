// Token selection from a row of logits: greedy argmax, log-softmax, seeded sampling with
// temperature, top-k, min-p and top-p, and the ranks and alternatives of logprobs. argmax takes a
// block of SAMPLE_THREADS threads per row; the others, which read a row several times, a thread
// block cluster of up to SAMPLE_CLUSTER such blocks (as many as the vocabulary keeps busy, one
// where the device has no clusters: the launch's gridDim.x), each over its stripes of the row.
// Every floating-point reduction is a fixed tree (thread stripes, warp butterflies, the warps'
// partials, then the blocks' in rank order), so a row's log-softmax depends on the row and the
// number of blocks alone, never on the other rows; the draw sums its masses exactly, in integers,
// so its token depends on the row alone (and is the CPU sampler's).

#define SAMPLE_THREADS 512
#define SAMPLE_WARPS (SAMPLE_THREADS / 32)
// Most blocks of a row's cluster (the portable limit).
#define SAMPLE_CLUSTER 8

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

// cpu::argmax's order: the first maximum, comparing as `>` does: -0 ties with +0 and NaN is
// never larger. So the largest key over the row, -0 keyed as +0 and NaN below every number (key
// 0), names the first maximum unless the first logit is NaN: then cpu::argmax keeps it.
__device__ __forceinline__ u64 argmax_key(float logit, int i) {
    if (logit != logit) return 0;
    return rank_key(logit == 0.0f ? 0.0f : logit, i);
}
__device__ __forceinline__ u32 argmax_of(u64 best_key, const float* row) {
    return row[0] != row[0] ? 0u : 0xffffffffu - (u32)best_key;
}

// Index of the first maximum of each row (cpu::argmax), a block per row.
extern "C" __global__ void __launch_bounds__(SAMPLE_THREADS) argmax_f32(
    const float* __restrict__ logits,  // device [num_rows, vocab]
    u32* __restrict__ out,             // device [num_rows]
    int vocab) {
    __shared__ u64 warp_best[SAMPLE_WARPS];
    const float* row = logits + (u64)blockIdx.x * vocab;
    u64 best = 0;
    for (int i = threadIdx.x; i < vocab; i += SAMPLE_THREADS) best = max(best, argmax_key(row[i], i));
    for (int o = 16; o > 0; o >>= 1) best = max(best, __shfl_xor_sync(FULL_MASK, best, o));
    if (threadIdx.x % 32 == 0) warp_best[threadIdx.x / 32] = best;
    __syncthreads();
    if (threadIdx.x == 0) {
        for (int w = 1; w < SAMPLE_WARPS; ++w) best = max(best, warp_best[w]);
        out[blockIdx.x] = argmax_of(best, row);
    }
}

// A search level's bins (search_cut): one per thread of the first SEARCH_BINS when the blocks'
// histograms are summed.
#define SEARCH_BINS 256

// Limbs of an exact mass (Mass), and the 32-bit words a histogram keeps it in.
#define MASS_LIMBS 3
#define MASS_WORDS (2 * MASS_LIMBS)

// Token ids a block lists for a search's later levels, once its share of the interval fits.
#define SEARCH_LIST 2048
// Most alternatives top_logprobs_f32 reports.
#define TOP_LOGPROBS_MAX 20
// What the list holds (search_cut's `listing`).
#define LIST_NONE 0
#define LIST_BUILD 1
#define LIST_READY 2


// A search level's histogram of the interval's tokens: per bin their number, their exact mass
// (32-bit word j of bin b at mass[j][b]), the upper halves of their smallest and largest rank keys
// (their logits' total_order_key) and the largest lower half (token id's complement). Filled
// with shared memory atomics, all of 32 bits (the 64-bit ones are compare-and-swap loops): every
// figure is an integer, so the order in which the tokens land changes nothing.
struct Histogram {
    u32 mass[MASS_WORDS][SEARCH_BINS];
    u32 lowest[SEARCH_BINS];
    u32 highest[SEARCH_BINS];
    u32 low_max[SEARCH_BINS];
    u32 count[SEARCH_BINS];
};

// An exact sum of f32 weights in [0, 1], in units of 2^-149 (the smallest f32), the CPU sampler's
// Mass: a weight is at most 2^149 units, so 192 bits hold 2^43 of them. Limb 0 is the lowest.
struct Mass {
    u64 w[MASS_LIMBS];
};

// What a search level chose (search_cut), for every thread of the block to read.
struct LevelCut {
    Mass above;      // the mass of the interval's keys above the bin, plus what was above it
    u64 lo, hi;      // keys bounding the bin's tokens and no other token of the interval
    u32 count;       // the bin's tokens
    u32 above_count; // as `above`, counted
    int bin;
};

// The shared memory of a row's block (dynamic, as a kernel launched in clusters keeps it).
#define SAMPLE_SMEM_BYTES 36864
struct RowShared {
    // This block's partials, for the other blocks to read: two, so that an exchange never
    // overwrites the one before it while a block may still be reading it.
    u64 part[2];
    // Every block's partials of the last exchange, in rank order.
    u64 gathered[SAMPLE_CLUSTER];
    // The warps' partials: a word per warp.
    u64 words[SAMPLE_WARPS];
    // A search's histograms, one per level in turn: a block fills one again two levels later,
    // after the cluster barrier of the level between, which every block reaches only once done
    // reading it.
    Histogram hist[2];
    // Each warp's totals of a level's bins (search_cut's suffix sums).
    Mass warp_mass[SEARCH_BINS / 32];
    u32 warp_count[SEARCH_BINS / 32];
    LevelCut cut;
    // The block's tokens inside a search's interval, from the level that listed them on.
    u32 num_listed;
    int listed_ids[SEARCH_LIST];
    // Each thread's share of a draw's normaliser (SideSum).
    float side_sum[SAMPLE_THREADS];
    // top_logprobs_f32: the block's keys among the row's n largest.
    u32 num_picked;
    u64 picked[TOP_LOGPROBS_MAX];
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
    int level;   // search levels so far: the histogram the next one fills is hist[level % 2]
    __device__ __forceinline__ int num_ranks() const { return (int)gridDim.x; }
    __device__ __forceinline__ int first() const { return (int)(blockIdx.x * SAMPLE_THREADS + threadIdx.x); }
    __device__ __forceinline__ int stride() const { return (int)(gridDim.x * SAMPLE_THREADS); }
};

// Publishes the block's word (in part[parity], written before the call) and gathers every
// block's into `gathered`, in rank order, for every thread to fold. A block writes a `part` again
// two exchanges later, after the cluster barrier of the one between, which every block reaches
// only once done reading it. Kernels end with cluster_sync, so that no block leaves while another
// may still read its partials.
__device__ __forceinline__ void exchange(RowPart& g) {
    RowShared& s = row_shared();
    cluster_sync();
    if ((int)threadIdx.x < g.num_ranks()) {
        s.gathered[threadIdx.x] = *cluster_map(&s.part[g.parity], threadIdx.x);
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
        s.part[g.parity] = to_word(b);
    }
    exchange(g);
    T r = from_word<T>(s.gathered[0]);
    for (int q = 1; q < g.num_ranks(); ++q) r = op(r, from_word<T>(s.gathered[q]));
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


// log_z = max + log(sum(exp(x - max))) (the exponentials by the CPU's polynomial); when `out`
// is not null, out[i] = x[i] - log_z (cpu::log_softmax); when `first_max` is not null, each
// row's argmax_f32 token, taken as the pass for the maximum reads the row, and its logprob,
// gather_logprob_f32's (a greedy row's token and logprob in one kernel).
extern "C" __global__ void __launch_bounds__(SAMPLE_THREADS) log_softmax_f32(
    const float* __restrict__ logits,    // device [num_rows, vocab]
    float* __restrict__ out,             // device [num_rows, vocab] or null
    float* __restrict__ log_z,           // device [num_rows]
    u32* __restrict__ first_max,         // device [num_rows] or null
    float* __restrict__ first_max_lp,    // device [num_rows], with first_max
    int vocab) {
    RowPart g{0, 0};
    const float* row = logits + (u64)blockIdx.y * vocab;
    float mx = neg_inf();
    u64 best = 0;
    if (first_max) {
        for (int i = g.first(); i < vocab; i += g.stride()) {
            const float x = row[i];
            mx = fmaxf(mx, x);
            best = max(best, argmax_key(x, i));
        }
        best = row_max_key(best, g);
    } else {
        for (int i = g.first(); i < vocab; i += g.stride()) mx = fmaxf(mx, row[i]);
    }
    mx = row_max(mx, g);
    float sum = 0.0f;
    for (int i = g.first(); i < vocab; i += g.stride()) sum = add(sum, exp_nonpositive(sub(row[i], mx)));
    sum = row_sum(sum, g);
    const float lz = add(mx, logf(sum));
    if (threadIdx.x == 0 && blockIdx.x == 0) {
        log_z[blockIdx.y] = lz;
        if (first_max) {
            const u32 token = argmax_of(best, row);
            first_max[blockIdx.y] = token;
            first_max_lp[blockIdx.y] = sub(row[token], lz);
        }
    }
    if (out) {
        for (int i = g.first(); i < vocab; i += g.stride()) out[(u64)blockIdx.y * vocab + i] = sub(row[i], lz);
    }
    cluster_sync();
}


// ---- Exact masses ----

__device__ __forceinline__ Mass mass_add(Mass a, const Mass& b) {
    u64 carry = 0;
#pragma unroll
    for (int l = 0; l < MASS_LIMBS; ++l) {
        const u64 s = a.w[l] + b.w[l];
        const u64 t = s + carry;
        carry = (u64)(s < a.w[l]) | (u64)(t < s);
        a.w[l] = t;
    }
    return a;
}

// a - b, for b <= a.
__device__ __forceinline__ Mass mass_sub(Mass a, const Mass& b) {
    u64 borrow = 0;
#pragma unroll
    for (int l = 0; l < MASS_LIMBS; ++l) {
        const u64 d = a.w[l] - b.w[l];
        const u64 t = d - borrow;
        borrow = (u64)(a.w[l] < b.w[l]) | (u64)(d < borrow);
        a.w[l] = t;
    }
    return a;
}

// The mass as the CPU rounds it (Mass::to_f64): its top 64 significant bits, rounded to the
// nearest f64, so that a comparison with a target decides as the CPU's does.
__device__ __forceinline__ double mass_to_f64(const Mass& m) {
    const int top = m.w[2] ? 2 : m.w[1] ? 1 : m.w[0] ? 0 : -1;
    if (top < 0) return 0.0;
    const u64 hi = top == 2 ? m.w[2] : top == 1 ? m.w[1] : m.w[0];
    const u64 lo = top == 2 ? m.w[1] : top == 1 ? m.w[0] : 0ull;
    const int lead = __clzll((i64)hi);
    const u64 bits = lead ? (hi << lead) | (lo >> (64 - lead)) : hi;
    // An exact power of two, well inside f64's normal range (-213 ..= 43).
    const int low_exp = 64 * top - lead - 149;
    return (double)bits * __longlong_as_double((i64)(1023 + low_exp) << 52);
}

// Adds weight `w` to bin `b` of a histogram's masses (`words` is its mass[0]), if it weighs: in
// (0, 1], as the CPU's `weighs` (NaN does not). w = m * 2^shift units: m its 24-bit mantissa,
// shift at most 126, so it spans two words; a carry goes on up (never out of the top word: a
// row's mass stays below 2^168 units).
__device__ __forceinline__ void mass_atomic_add(u32* words, int b, float w) {
    if (!(w > 0.0f && w <= 1.0f)) return;
    const u32 bits = __float_as_uint(w), e = bits >> 23;
    const u64 v = (u64)((bits & 0x7fffffu) | (e ? 0x800000u : 0u)) << ((e ? e - 1 : 0) % 32);
    int word = (int)((e ? e - 1 : 0) / 32);
    u32* at = words + word * SEARCH_BINS + b;
    const u32 low = (u32)v;
    const u32 old = low ? atomicAdd(at, low) : 0u;
    // At most 2^24 + 1: no overflow.
    u32 up = (u32)(v >> 32) + (old + low < old ? 1u : 0u);
    while (up && ++word < MASS_WORDS) {
        at += SEARCH_BINS;
        const u32 before = atomicAdd(at, up);
        up = before + up < before ? 1u : 0u;
    }
}

// Bin b's mass in a histogram: its words as limbs.
__device__ __forceinline__ Mass bin_mass(const Histogram& h, int b) {
    Mass m;
#pragma unroll
    for (int l = 0; l < MASS_LIMBS; ++l) m.w[l] = (u64)h.mass[2 * l + 1][b] << 32 | h.mass[2 * l][b];
    return m;
}

// ---- The search ----

// A rank key's logit (the inverse of total_order_key on its upper half).
__device__ __forceinline__ float key_logit(u64 k) {
    const u32 t = (u32)(k >> 32);
    return __uint_as_float(t & 0x80000000u ? t & 0x7fffffffu : ~t);
}

// How a search level spreads the interval [lo, hi] over the bins: by logit, evenly from `base`
// (lo's logit, or the row's lowest finite one where lo's is not finite) to hi's, where that range
// is finite and splits; else by the key bits below those lo and hi share. Either way a larger key
// never lands in a lower bin (each step of the arithmetic is monotone). Where lo's and hi's
// logits are those of the interval's lowest and highest tokens (as every level's bounds make
// them), a level by logit puts those tokens in bin 0 and the last bin; a level by key bits
// narrows the key range 256-fold: either way the search ends.
struct Binning {
    float base, scale;  // by logit where scale > 0
    u64 lo;
    int shift;
    __device__ __forceinline__ int operator()(float x, u64 k) const {
        if (scale > 0.0f) {
            const float d = sub(x, base);
            return d > 0.0f ? min((int)mul(d, scale), SEARCH_BINS - 1) : 0;
        }
        return (int)((k >> shift) - (lo >> shift));
    }
};

__device__ __forceinline__ Binning binning(u64 lo, u64 hi, float lowest, bool by_logit) {
    const float top = key_logit(hi), low = key_logit(lo);
    const float base = isfinite(low) ? low : lowest;
    const float span = sub(top, base), scale = dvd((float)SEARCH_BINS, span);
    if (by_logit && isfinite(top) && span > 0.0f && isfinite(span) && isfinite(scale))
        return Binning{base, scale, lo, 0};
    const int bits = 64 - __clzll((i64)(lo ^ hi));
    return Binning{0.0f, 0.0f, lo, bits > 8 ? bits - 8 : 0};
}

// Whether a cumulative mass (or, counting, a number of tokens) reaches `target`, or with
// `strict` exceeds it: the CPU's `crosses`.
__device__ __forceinline__ bool crosses(double cum, double target, bool strict) {
    return strict ? cum > target : cum >= target;
}

// A sum the first level of a search takes over every token it reads, beside its histogram: the
// terms of the row's log-softmax normaliser, exp(x - mx), in stripe order, as log_softmax_f32
// sums them, so that the draw need not read the row twice more for its logprob.
// Each thread's sum ends in row_shared().side_sum, out of the registers the search needs.
struct SideSum {
    bool on;
    float mx;
};

// One level of search_cut: fills a histogram of the interval [lo, hi] (reading the block's
// stripes of the row, or its list, as `source` says; building the list, it lists the tokens in
// [lo, list_hi], list_hi >= hi), sums the blocks' histograms bin by bin, and picks the bin
// holding the cut: the highest bin whose cumulative figure from the top (above + the bins down
// to it) passes, or, where none does (the target rounded onto the interval's whole figure), the
// lowest one; with `relative`, first scales the target by the interval's total mass. Returns the
// number of the interval's tokens; the cut is in row_shared().cut (its count 0 where no bin is
// picked).
template <bool COUNT, typename Weight>
__device__ u32 search_level(
    const float* row, int vocab, u64 lo, u64 hi, u64 list_hi, const Binning bin, int source,
    SideSum& side, bool relative, double& target, bool strict, const Mass& above, u32 above_count, Weight weight, RowPart& g) {
    RowShared& s = row_shared();
    Histogram& h = s.hist[g.level & 1];
    ++g.level;
    const int t = threadIdx.x;
    if (t < SEARCH_BINS) {
        h.count[t] = 0, h.lowest[t] = ~0u, h.highest[t] = 0, h.low_max[t] = 0;
#pragma unroll
        for (int j = 0; j < MASS_WORDS; ++j) h.mass[j][t] = 0;
    }
    if (t == 0 && source == LIST_BUILD) s.num_listed = 0;
    __syncthreads();
    float side_sum = 0.0f;
    auto visit = [&](int i) {
        const float x = row[i];
        if (side.on) side_sum = add(side_sum, exp_nonpositive(sub(x, side.mx)));
        const u64 k = rank_key(x, i);
        if (k < lo || k > list_hi) return;
        if (source == LIST_BUILD) {
            const u32 at = atomicAdd(&s.num_listed, 1u);
            if (at < SEARCH_LIST) s.listed_ids[at] = i;
        }
        if (k > hi) return;
        const int b = bin(x, k);
        atomicAdd(&h.count[b], 1u);
        atomicMin(&h.lowest[b], (u32)(k >> 32));
        atomicMax(&h.highest[b], (u32)(k >> 32));
        atomicMax(&h.low_max[b], (u32)k);
        if (!COUNT) mass_atomic_add(&h.mass[0][0], b, weight(x));
    };
    if (source == LIST_READY) {
        for (int e = t; e < (int)s.num_listed; e += SAMPLE_THREADS) visit(s.listed_ids[e]);
    } else {
        for (int i = g.first(); i < vocab; i += g.stride()) visit(i);
    }
    if (side.on) s.side_sum[t] = side_sum;
    cluster_sync();
    // Every thread has read the last level's cut by now.
    if (t == 0) s.cut.count = 0;
    // Thread t < SEARCH_BINS: bin t over the blocks, then its suffix sums within the warp (bins
    // t to the warp's last), then those of the warps above.
    const int warp = t / 32, lane = t % 32;
    u32 count = 0, suffix_count = 0;
    Mass mass{{0, 0, 0}}, suffix{{0, 0, 0}};
    u32 lowest = ~0u, highest = 0, low_max = 0;
    if (t < SEARCH_BINS) {
        for (int r = 0; r < g.num_ranks(); ++r) {
            const Histogram& o = *cluster_map(&h, (u32)r);
            count += o.count[t];
            lowest = min(lowest, o.lowest[t]);
            highest = max(highest, o.highest[t]);
            low_max = max(low_max, o.low_max[t]);
            if (!COUNT) mass = mass_add(mass, bin_mass(o, t));
        }
        suffix_count = count, suffix = mass;
        for (int d = 1; d < 32; d <<= 1) {
            const u32 c = __shfl_down_sync(FULL_MASK, suffix_count, d);
            Mass m;
#pragma unroll
            for (int l = 0; l < MASS_LIMBS; ++l) m.w[l] = __shfl_down_sync(FULL_MASK, suffix.w[l], d);
            if (lane + d < 32) suffix_count += c, suffix = mass_add(suffix, m);
        }
        if (lane == 0) s.warp_count[warp] = suffix_count, s.warp_mass[warp] = suffix;
    }
    __syncthreads();
    u32 total_count = 0;
    Mass total{{0, 0, 0}};
    for (int w = 0; w < SEARCH_BINS / 32; ++w) {
        total_count += s.warp_count[w];
        if (!COUNT) total = mass_add(total, s.warp_mass[w]);
        if (w > warp) suffix_count += s.warp_count[w];
        if (!COUNT && w > warp) suffix = mass_add(suffix, s.warp_mass[w]);
    }
    if (relative) target *= mass_to_f64(total);
    if (t < SEARCH_BINS && count > 0) {
        // The figures from the top down to this bin, and down to the bin above it.
        const Mass at = mass_add(above, suffix), after = mass_sub(at, mass);
        const u32 at_count = above_count + suffix_count, after_count = at_count - count;
        const double at_figure = COUNT ? (double)at_count : mass_to_f64(at);
        const double after_figure = COUNT ? (double)after_count : mass_to_f64(after);
        const bool passes = crosses(at_figure, target, strict);
        const bool next_passes = crosses(after_figure, target, strict);
        const bool bottom = suffix_count == total_count, top = suffix_count == count;
        if ((passes || bottom) && (top || !next_passes)) {
            // The bin's keys: inside the interval, between its tokens' logits (the lowest's
            // smallest id complement is at least 0, the highest's largest at most low_max), and,
            // by key bits, inside the bin's range. No other token of the interval is there.
            u64 bin_lo = max(lo, (u64)lowest << 32), bin_hi = min(hi, (u64)highest << 32 | low_max);
            if (bin.scale <= 0.0f) {
                const u64 start = ((lo >> bin.shift) + (u64)t) << bin.shift;
                bin_lo = max(bin_lo, start), bin_hi = min(bin_hi, start + ((1ull << bin.shift) - 1));
            }
            s.cut = LevelCut{after, bin_lo, bin_hi, count, after_count, t};
        }
    }
    __syncthreads();
    return total_count;
}

// The largest rank key v in [lo, hi] (keys of tokens of the row, or lo = 0) whose cumulative
// figure S(v) (`above` plus the weights of the tokens with v <= key <= hi, or their number with
// COUNT) passes `target` (exceeds it, `strict`, or reaches it), the cut of the candidates in rank
// order; the lowest key in the interval where none does. With `relative`, the target is
// target * S(lo) (a share of the interval's mass). The weights are `weight(logit)`; their sums
// are exact (Mass) and rounded as the CPU rounds them, so the cut is the CPU sampler's.
//
// Each level spreads the interval over SEARCH_BINS bins (Binning), every block fills a
// histogram of its tokens, and every block sums all of them and finds the bin holding the cut,
// which becomes the interval, until a bin holds one token. A level by logit that keeps more than
// half the interval is followed by one by key bits, which narrow the key range 256-fold, so a
// search ends within a few dozen levels whatever the row; spread logits take two to four. The
// first level reads the whole row; once a block's share of the interval fits SEARCH_LIST, the
// next level reads the row once more and lists it, and the later ones read only the list.
//
// `listing` says what the block's list holds on entry and on return: LIST_NONE, nothing to use;
// LIST_BUILD (on entry), nothing, but the interval holds at most SEARCH_LIST tokens, so the first
// level lists them; LIST_READY, every token of the block in the interval (on return: from the
// cut to hi), and so in any interval inside it, as the next search's is. With `list_head`, a
// list built at a later level takes the tokens above the interval too where they fit, so that it
// holds the head on return.
template <bool COUNT, typename Weight>
__device__ u64 search_cut(
    const float* row, int vocab, u64 lo, u64 hi, float lowest, double target, bool relative,
    bool strict, Weight weight, bool list_head, int& listing, SideSum& side, RowPart& g) {
    RowShared& s = row_shared();
    const u64 head_hi = hi;
    Mass above{{0, 0, 0}};
    u32 above_count = 0;
    bool by_logit = true;
    // Where each level reads: as `listing`; and the top of what a level building the list lists.
    int source = listing;
    u64 list_hi = hi;
    listing = source == LIST_NONE ? LIST_NONE : LIST_READY;
    for (bool first = true;; first = false) {
        const u32 num_inside = search_level<COUNT>(
            row, vocab, lo, hi, source == LIST_BUILD ? list_hi : hi, binning(lo, hi, lowest, by_logit),
            source, side, first && relative, target, strict, above, above_count, weight, g);
        side.on = false;
        if (source == LIST_BUILD && list_hi == head_hi) listing = LIST_READY;
        const LevelCut cut = s.cut;
        // One token: the bin's upper bound is its key (its logit's half and its id's).
        if (cut.count == 1) return cut.hi;
        if (cut.count == 0) return lo;
        // This block's tokens in the bin, from its own histogram.
        const u32 mine = s.hist[(g.level - 1) & 1].count[cut.bin];
        by_logit = !(by_logit && 2 * cut.count > num_inside);
        lo = cut.lo, hi = cut.hi, above = cut.above, above_count = cut.above_count;
        if (source != LIST_NONE) {
            source = LIST_READY;
        } else if (list_head && mine + cut.above_count <= SEARCH_LIST) {
            // The block's tokens above the bin are fewer than the cluster's, cut.above_count.
            source = LIST_BUILD, list_hi = head_hi;
        } else if (mine <= SEARCH_LIST) {
            source = LIST_BUILD, list_hi = cut.hi;
        }
    }
}

// Seeded sampling as the CPU sampler defines it (crates/model/src/sampling/draw.rs): candidates
// in rank order, the first top_k of them, weights exp((logit - max) / temperature) (the most
// likely token's 1), those weighing at least min_p, the shortest head whose mass reaches top_p of
// the total, then the first candidate whose cumulative mass exceeds u * (kept mass). The weights
// are the host's bit for bit (exp_nonpositive) and every mass is an exact sum rounded as the host
// rounds it, so the token is the CPU's. Instead of sorting, each cut is found by a search over
// rank keys (search_cut). With `log_z`, also the row's log-softmax normaliser, bit for bit
// log_softmax_f32's (its maximum and its sum over the same stripes and tree), the sum taken as
// the first search reads the row, and the token's logprob, gather_logprob_f32's.
//
// Two blocks an SM (64 registers, which ptxas reaches without spilling): twice the clusters in
// flight, their searches' memory and barrier waits overlapping.
extern "C" __global__ void __launch_bounds__(SAMPLE_THREADS, 2) sample_f32(
    const float* __restrict__ logits,          // device [num_rows, vocab]
    const SampleParams* __restrict__ params,   // device [num_rows]
    u32* __restrict__ out,                     // device [num_rows]
    float* __restrict__ log_z,                 // device [num_rows], or null
    float* __restrict__ logprob,               // device [num_rows], with log_z
    int vocab) {
    RowPart g{0, 0};
    const float* row = logits + (u64)blockIdx.y * vocab;
    const SampleParams pr = params[blockIdx.y];
    // The first token in rank order, the lowest finite logit (where the bins by logit start when
    // the interval's lowest key is a masked token's) and log_softmax_f32's maximum.
    float lowest = __int_as_float(0x7f800000), largest = neg_inf();
    u64 top = 0;
    for (int i = g.first(); i < vocab; i += g.stride()) {
        const float x = row[i];
        if (x > neg_inf()) lowest = fminf(lowest, x);
        largest = fmaxf(largest, x);
        top = max(top, rank_key(x, i));
    }
    lowest = row_reduce(lowest, g, [](float a, float b) { return fminf(a, b); });
    top = row_max_key(top, g);
    SideSum side{log_z != nullptr, 0.0f};
    if (side.on) side.mx = row_max(largest, g);
    const float mx = key_logit(top), inv_t = dvd(1.0f, pr.temperature);
    auto one = [](float) { return 1.0f; };
    // The host sampler's weights, bit for bit: the CPU's polynomial exp.
    auto weight = [=](float x) { return x == mx ? 1.0f : exp_nonpositive(mul(sub(x, mx), inv_t)); };
    u64 floor = 0;
    int listing = LIST_NONE;
    if (pr.top_k > 0 && pr.top_k < (u32)vocab) {
        floor = search_cut<true>(row, vocab, 0, top, lowest, (double)pr.top_k, false, false, one, true, listing, side, g);
        // [floor, top] holds top_k tokens: listed, or few enough for the next search to list
        // them as it starts.
        if (listing == LIST_NONE && pr.top_k <= SEARCH_LIST) listing = LIST_BUILD;
    }
    if (pr.min_p > 0.0f) {
        // The last kept candidate is the smallest key whose weight reaches min_p; the most likely
        // token (weight 1) always does, as the CPU keeps at least one.
        u64 last = ~0ull;
        for (int i = g.first(); i < vocab; i += g.stride()) {
            const u64 k = rank_key(row[i], i);
            if (k >= floor && weight(row[i]) >= pr.min_p && k < last) last = k;
        }
        floor = ~row_max_key(~last, g);
    }
    if (pr.top_p < 1.0f)
        floor = search_cut<false>(row, vocab, floor, top, lowest, (double)pr.top_p, true, false, weight, true, listing, side, g);
    const double u = uniform(pr.seed, pr.index);
    const u64 chosen = search_cut<false>(row, vocab, floor, top, lowest, u, true, true, weight, false, listing, side, g);
    const bool lead = threadIdx.x == 0 && blockIdx.x == 0;
    if (lead) out[blockIdx.y] = 0xffffffffu - (u32)(chosen & 0xffffffffull);
    if (log_z) {
        // The first search's first level summed every token of the thread's stripes.
        const float sum = row_sum(row_shared().side_sum[threadIdx.x], g);
        const float lz = add(side.mx, logf(sum));
        if (lead) {
            log_z[blockIdx.y] = lz;
            // The token's logit from its key (the same bits): gather_logprob_f32's logprob.
            logprob[blockIdx.y] = sub(key_logit(chosen), lz);
        }
    }
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
// reduction tree. The n most likely are the keys from the n-th largest up (a counting search_cut,
// its list holding them when it built one), each placed by the number of them above it.
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
    int n) {                           // at most TOP_LOGPROBS_MAX and vocab
    RowShared& s = row_shared();
    RowPart g{0, 0};
    const u32 r = blockIdx.y;
    const float* row = logits + (u64)r * vocab;
    const u64 key = rank_key(row[chosen[r]], (int)chosen[r]);
    u64 ahead = 0, top = 0;
    float lowest = __int_as_float(0x7f800000);
    for (int i = g.first(); i < vocab; i += g.stride()) {
        const float x = row[i];
        const u64 k = rank_key(x, i);
        ahead += k > key ? 1ull : 0ull;
        top = max(top, k);
        if (x > neg_inf()) lowest = fminf(lowest, x);
    }
    ahead = row_count(ahead, g);
    const bool lead = threadIdx.x == 0 && blockIdx.x == 0;
    if (lead) ranks[r] = ahead < 0xffffffffull ? (u32)(ahead + 1) : 0xffffffffu;
    if (n > 0) top = row_max_key(top, g);
    if (n == 1 && lead) {
        const u32 id = 0xffffffffu - (u32)(top & 0xffffffffull);
        top_ids[r] = id;
        top_logprobs[r] = sub(row[id], log_z[r]);
    }
    if (n > 1) {
        lowest = row_reduce(lowest, g, [](float a, float b) { return fminf(a, b); });
        int listing = LIST_NONE;
        auto one = [](float) { return 1.0f; };
        SideSum none{false, 0.0f};
        const u64 floor =
            search_cut<true>(row, vocab, 0, top, lowest, (double)n, false, false, one, true, listing, none, g);
        // This block's tokens from the floor up.
        if (threadIdx.x == 0) s.num_picked = 0;
        __syncthreads();
        auto pick = [&](int i) {
            const u64 k = rank_key(row[i], i);
            if (k < floor || k > top) return;
            const u32 at = atomicAdd(&s.num_picked, 1u);
            if (at < TOP_LOGPROBS_MAX) s.picked[at] = k;
        };
        if (listing == LIST_READY) {
            for (int e = threadIdx.x; e < (int)s.num_listed; e += SAMPLE_THREADS) pick(s.listed_ids[e]);
        } else {
            for (int i = g.first(); i < vocab; i += g.stride()) pick(i);
        }
        cluster_sync();
        // The first block places every block's picks: its thread b * TOP_LOGPROBS_MAX + j takes
        // pick j of block b.
        const int b = threadIdx.x / TOP_LOGPROBS_MAX, j = threadIdx.x % TOP_LOGPROBS_MAX;
        if (blockIdx.x == 0 && b < g.num_ranks()) {
            const RowShared& mine = *cluster_map(&s, (u32)b);
            if (j < (int)min(mine.num_picked, (u32)TOP_LOGPROBS_MAX)) {
                const u64 k = mine.picked[j];
                int place = 0;
                for (int q = 0; q < g.num_ranks(); ++q) {
                    const RowShared& other = *cluster_map(&s, (u32)q);
                    const int m = (int)min(other.num_picked, (u32)TOP_LOGPROBS_MAX);
                    for (int e = 0; e < m; ++e) place += other.picked[e] > k ? 1 : 0;
                }
                if (place < n) {
                    const u32 id = 0xffffffffu - (u32)(k & 0xffffffffull);
                    top_ids[(u64)r * n + place] = id;
                    top_logprobs[(u64)r * n + place] = sub(row[id], log_z[r]);
                }
            }
        }
    }
    cluster_sync();
}
