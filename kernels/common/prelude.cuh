// Shared definitions, concatenated by the Rust side in front of every kernel source before NVRTC
// compiles it. No toolkit header is included anywhere under kernels/: NVRTC then needs no include
// path, and the built-in device functions (__fmul_rn, __shfl_down_sync, expf, ...) are all that
// the sources use.
//
// Arithmetic rule: where a CPU reference kernel (crates/backend/src/cpu) multiplies and then
// adds, the GPU does the same with the explicitly rounded intrinsics below, never a fused
// multiply-add. NVRTC also gets --fmad=false, so plain `a * b + c` is never contracted either.
// With the same operands in the same order the results are then bit for bit those of the CPU.

typedef unsigned short bf16_t;
typedef unsigned int u32;
typedef unsigned long long u64;
typedef long long i64;

// Lanes of the reduction every dot product uses: element i accumulates in lane i % 16, lanes fold
// by the pairwise tree (lane i plus lane i + w, for w = 8, 4, 2, 1), as cpu::dot does.
#define DOT_LANES 16
#define FULL_MASK 0xffffffffu

__device__ __forceinline__ float mul(float a, float b) { return __fmul_rn(a, b); }
__device__ __forceinline__ float add(float a, float b) { return __fadd_rn(a, b); }
__device__ __forceinline__ float sub(float a, float b) { return __fsub_rn(a, b); }
__device__ __forceinline__ float dvd(float a, float b) { return __fdiv_rn(a, b); }

// bf16 is the top half of an f32: widening is exact.
__device__ __forceinline__ float bf16_to_f32(bf16_t v) { return __uint_as_float(((u32)v) << 16); }
__device__ __forceinline__ float load_weight(const bf16_t* p) { return bf16_to_f32(*p); }
__device__ __forceinline__ float load_weight(const float* p) { return *p; }

// 16 bytes loaded or stored by one instruction (8 bf16 or 4 f32); the address must be 16-byte
// aligned.
struct alignas(16) u32x4 {
    u32 x, y, z, w;
};
struct alignas(16) f32x4 {
    float x, y, z, w;
};

// The 4 floats at [c, c + 4) of row p, zero past k and for a null row: one 16-byte load when
// `vec` (p and the row length keep it aligned) and all 4 lie inside k.
__device__ __forceinline__ f32x4 load_f32x4(const float* p, int c, int k, bool vec) {
    if (p && vec && c + 4 <= k) return *reinterpret_cast<const f32x4*>(p + c);
    f32x4 v;
    v.x = p && c < k ? p[c] : 0.0f;
    v.y = p && c + 1 < k ? p[c + 1] : 0.0f;
    v.z = p && c + 2 < k ? p[c + 2] : 0.0f;
    v.w = p && c + 3 < k ? p[c + 3] : 0.0f;
    return v;
}

// The input rows a staged product reads, by their index r among the block's rows: key(r) names
// row r (a read of memory where rows are gathered), at(key) is its address (null: absent, read as
// zeros). The stagings take every row's key before any address, so that a chunk's reads are all
// requested at once rather than each after the last (dense rows: r's row of x [m, k]; the experts'
// gathered rows: moe/expert_common.cuh).
struct DenseRows {
    const float* x;
    int m0, m_rows, k;
    __device__ __forceinline__ int key(int r) const { return m0 + r; }
    __device__ __forceinline__ const float* at(int row) const {
        return row < m_rows ? x + (u64)row * k : nullptr;
    }
};

// The 4 elements at column c of rows r0, r0 + STRIDE, ... (ITER of them) of `rows`, the share of
// a staging thread: every row's key is requested, then every load, before any value is used, so
// that they all leave together (a loop that used each quad before loading the next waited for a
// memory latency per quad, two where the row is gathered through the sort's pairs).
template <int ITER, int STRIDE, typename Rows>
__device__ __forceinline__ void load_row_quads(
    const Rows& rows, int r0, int c, int k, bool vec, f32x4 (&v)[ITER]) {
    int keys[ITER];
#pragma unroll
    for (int i = 0; i < ITER; ++i) keys[i] = rows.key(r0 + i * STRIDE);
#pragma unroll
    for (int i = 0; i < ITER; ++i) v[i] = load_f32x4(rows.at(keys[i]), c, k, vec);
}

// The two bf16 halves of a word loaded from memory: element 2i in the low half (little endian).
__device__ __forceinline__ float bf16_lo(u32 w) { return __uint_as_float(w << 16); }
__device__ __forceinline__ float bf16_hi(u32 w) { return __uint_as_float(w & 0xffff0000u); }

// Round to nearest even; a NaN stays a quiet NaN with its sign and top payload bits (as the `half`
// crate's conversion does, so host and device agree bit for bit).
__device__ __forceinline__ bf16_t f32_to_bf16(float f) {
    u32 x = __float_as_uint(f);
    if ((x & 0x7fffffffu) > 0x7f800000u) return (bf16_t)((x >> 16) | 0x0040u);
    u32 rounding = 0x7fffu + ((x >> 16) & 1u);
    return (bf16_t)((x + rounding) >> 16);
}

// Folds the 16 lane sums of a dot product held by lanes 0..15 of a half-warp (lane = thread % 16)
// with the CPU's tree; the result is in lane 0 of the half-warp. Every thread of the warp must
// call it.
__device__ __forceinline__ float fold16(float v) {
    for (int width = 8; width > 0; width >>= 1) {
        v = add(v, __shfl_down_sync(FULL_MASK, v, width, DOT_LANES));
    }
    return v;
}

// 1 / sqrt(mean(x^2) + eps) of a row of `width` from a half-warp's lane sums of squares (lane l
// summing elements l, l + 16, ... in order), in every lane: cpu ops::inv_rms bit for bit. Every
// thread of the warp must call it.
__device__ __forceinline__ float inv_rms_from_lanes(float lane_sum, int width, float eps) {
    float total = __shfl_sync(FULL_MASK, fold16(lane_sum), 0, DOT_LANES);
    return dvd(1.0f, __fsqrt_rn(add(dvd(total, (float)width), eps)));
}

// exp(x) for x <= 0 (no NaN), the polynomial of the CPU's exp_nonpositive step for step:
// 2^n * e^r with x = n ln2 + r, ln2 split in two, Cephes' degree-5 minimax polynomial.
__device__ __forceinline__ float exp_nonpositive(float x) {
    bool flush = x < -87.0f;
    x = fmaxf(x, -87.0f);
    const float shifter = 12582912.0f;
    float n = sub(add(mul(x, 1.44269504088896341f), shifter), shifter);
    float r = sub(sub(x, mul(n, 0.693359375f)), mul(n, -2.12194440e-4f));
    float p = 1.9875691e-4f;
    p = add(mul(p, r), 1.3981999e-3f);
    p = add(mul(p, r), 8.333452e-3f);
    p = add(mul(p, r), 4.1665796e-2f);
    p = add(mul(p, r), 0.16666665f);
    p = add(mul(p, r), 0.5f);
    float e_r = add(add(mul(p, mul(r, r)), r), 1.0f);
    float scale = __uint_as_float((u32)(((int)n + 127) << 23));
    return flush ? 0.0f : mul(e_r, scale);
}

// x * sigmoid(x) as cpu::silu computes it.
__device__ __forceinline__ float silu(float x) {
    float e = exp_nonpositive(-fabsf(x));
    float numerator = x >= 0.0f ? x : mul(x, e);
    return dvd(numerator, add(1.0f, e));
}

// log(1 + exp(x)), linear above 20 (cpu::softplus). The device expf/log1pf are within 2 ulp of
// the host's libm, not bitwise equal to it.
__device__ __forceinline__ float softplus(float x) { return x > 20.0f ? x : log1pf(expf(x)); }

__device__ __forceinline__ float neg_inf() { return __int_as_float(0xff800000); }

// Sum over a warp with the xor butterfly: a fixed tree, the same on every call.
__device__ __forceinline__ float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v = add(v, __shfl_xor_sync(FULL_MASK, v, o));
    return v;
}

__device__ __forceinline__ float warp_max(float v) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(FULL_MASK, v, o));
    return v;
}

// Walks k in chunks of `step` with two register sets of a chunk's operands, so that the next
// chunk's loads are in flight while the current one is computed: load_a(c0) / load_b(c0) fill
// set a / b with the chunk at c0, run_a(c0) / run_b(c0) compute it from that set; chunks run in
// ascending order, a, b, a, ... Two named sets rather than an array indexed by the chunk, so
// that both stay in registers (the staged products' weights).
template <typename LoadA, typename LoadB, typename RunA, typename RunB>
__device__ __forceinline__ void chunks_prefetched(
    int k, int step, LoadA load_a, LoadB load_b, RunA run_a, RunB run_b) {
    load_a(0);
    for (int c0 = 0; c0 < k; c0 += 2 * step) {
        const int c1 = c0 + step;
        if (c1 < k) load_b(c1);
        run_a(c0);
        if (c1 >= k) break;
        if (c1 + step < k) load_a(c1 + step);
        run_b(c1);
    }
}

// Order-preserving key of a float under total ordering (the order of f32::total_cmp).
__device__ __forceinline__ u32 total_order_key(float f) {
    u32 b = __float_as_uint(f);
    return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}

// Thread block clusters (sm_90 on): a cluster's blocks run at once and read each other's shared
// memory. The host launches clusters only where the device has them (launch::sample_blocks_per_row);
// elsewhere a cluster is one block: cluster_sync is the block's barrier and a block maps only to
// itself. The simulator brings its own (its runtime).
#if defined(ROUTED_SIM)
#elif defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
// Every thread of every block of the cluster; shared memory written before it is seen by the
// other blocks' reads after it (release, then acquire).
__device__ __forceinline__ void cluster_sync() {
    asm volatile("barrier.cluster.arrive.release.aligned;\n\tbarrier.cluster.wait.acquire.aligned;" ::: "memory");
}
// The generic address that `p`, in this block's shared memory, has in block `rank` of the cluster.
template <typename T>
__device__ __forceinline__ T* cluster_map(T* p, u32 rank) {
    u64 out;
    asm volatile("mapa.u64 %0, %1, %2;" : "=l"(out) : "l"((u64)p), "r"(rank));
    return (T*)out;
}
#else
__device__ __forceinline__ void cluster_sync() { __syncthreads(); }
template <typename T>
__device__ __forceinline__ T* cluster_map(T* p, u32) { return p; }
#endif
