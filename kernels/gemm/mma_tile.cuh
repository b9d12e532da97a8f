// The tensor-core product tile shared by the dense and the grouped (MoE) products in bf16
// precision (`--matmul-precision bf16`); compiled in front of both.
//
// Arithmetic: the inputs are rounded to bf16 (to nearest, ties to even: f32_to_bf16, as the CPU's
// bf16 mode rounds them) and multiplied with the bf16 weights by mma.sync.m16n8k16 with f32
// accumulation. The weights are the instruction's A operand (16 output columns by 16 of k) and the
// input rows its B operand (16 of k by 8 rows): a decode step's few rows then fill an 8-wide
// operand instead of a 16-high one.
//
// Reduction order: a warp walks k in ascending steps of MMA_K, two instructions per step, each
// accumulating onto the running sums; what an instruction does inside is the hardware's, the same
// on every call. An output therefore depends on its input row and its weight row only: never on
// the other rows of its operand, the number of rows, the tile or the grid (no split-K), so a
// row's bits never depend on the batch. They are not the CPU's bits (its bf16 mode adds in
// another order): tests hold them to a summation bound instead.
//
// Which k an operand element stands for: in step s, lane l (group g = l / 4, t = l % 4) loads
// the 8 consecutive elements at s * MMA_K + 8t of its weight rows and of its input row, and gives
// the first instruction elements 0-3 and the second elements 4-7, in the slots the instruction
// calls k = 2t, 2t + 1, 2t + 8, 2t + 9. A and B are permuted alike, so every product pairs the
// right elements, and every load is 16 (weights) or 32 (inputs) contiguous bytes.

#define MMA_WARPS 4
#define MMA_COLS 16
#define MMA_ROWS 8
#define MMA_K 32
// Steps whose weights are loaded ahead of their instructions.
#define MMA_UNROLL 4
// Groups of MMA_ROWS input rows a warp takes at once in the dense and the expert products.
#define MMA_ROW_GROUPS 4

__device__ __forceinline__ u32 pack_bf16x2(float lo, float hi) {
    return (u32)f32_to_bf16(lo) | ((u32)f32_to_bf16(hi) << 16);
}

// d = a . b + c over one m16n8k16 tile, bf16 inputs, f32 accumulation, in the operand layout of
// the PTX ISA (a: 4 registers of bf16 pairs, b: 2, c and d: 4 floats per lane). The simulator's
// runtime provides its own, which exchanges the fragments between the warp's lanes.
#ifndef ROUTED_SIM
__device__ __forceinline__ void mma_bf16_16816(
    float (&d)[4], const u32 (&a)[4], const u32 (&b)[2], const float (&c)[4]) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
    // bf16 tensor cores arrived with sm_80; the host never launches this below it.
    __trap();
#else
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
        "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%10, %11, %12, %13};\n"
        : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]), "f"(c[0]),
          "f"(c[1]), "f"(c[2]), "f"(c[3]));
#endif
}
#endif

// The 8 weights at [c, c + 8) of row `p` as bf16 pairs (zero past k, or all zero for a null row).
__device__ __forceinline__ void load_w8(const bf16_t* p, int c, int k, bool vec, u32 (&v)[4]) {
    if (p && vec && c + 8 <= k) {
        u32x4 q = *reinterpret_cast<const u32x4*>(p + c);
        v[0] = q.x, v[1] = q.y, v[2] = q.z, v[3] = q.w;
        return;
    }
    for (int j = 0; j < 4; ++j) {
        u32 lo = p && c + 2 * j < k ? p[c + 2 * j] : 0u;
        u32 hi = p && c + 2 * j + 1 < k ? p[c + 2 * j + 1] : 0u;
        v[j] = lo | (hi << 16);
    }
}

// The 8 inputs at [c, c + 8) of row `p`, rounded to bf16 pairs (zero past k or for a null row).
__device__ __forceinline__ void load_x8(const float* p, int c, int k, bool vec, u32 (&v)[4]) {
    // One test for both loads (not load_f32x4 twice): it keeps the thin kernel at 92 registers,
    // five blocks an SM, where two tests took 103.
    float e[8];
    if (p && vec && c + 8 <= k) {
        f32x4 q0 = *reinterpret_cast<const f32x4*>(p + c);
        f32x4 q1 = *reinterpret_cast<const f32x4*>(p + c + 4);
        e[0] = q0.x, e[1] = q0.y, e[2] = q0.z, e[3] = q0.w;
        e[4] = q1.x, e[5] = q1.y, e[6] = q1.z, e[7] = q1.w;
    } else {
        for (int j = 0; j < 8; ++j) e[j] = p && c + j < k ? p[c + j] : 0.0f;
    }
    for (int j = 0; j < 4; ++j) v[j] = pack_bf16x2(e[2 * j], e[2 * j + 1]);
}

// Whether 16-byte loads are safe: k keeps every row 16-byte aligned and the bases are.
__device__ __forceinline__ bool mma_vec_ok(const void* x, const void* w, int k) {
    return k % 8 == 0 && (u64)x % 16 == 0 && (u64)w % 16 == 0;
}

// The lane's weights of one step at c: rows g and g + 8 of each of the NW matrices.
template <int NW>
__device__ __forceinline__ void load_step_weights(
    const bf16_t* const (&w_lo)[NW], const bf16_t* const (&w_hi)[NW], int c, int k, bool vec,
    u32 (&lo)[NW][4], u32 (&hi)[NW][4]) {
#pragma unroll
    for (int j = 0; j < NW; ++j) {
        load_w8(w_lo[j], c, k, vec, lo[j]);
        load_w8(w_hi[j], c, k, vec, hi[j]);
    }
}

// A step's two instructions for every matrix onto group r's sums, from the lane's weights and its
// input fragment of the group (8 elements as bf16 pairs: 0-3 for the first instruction, 4-7 for
// the second). Every product kernel, thin or staged, multiplies through here, hence the same
// bits. r must be known at compile time (the callers' loops are unrolled).
template <int NW, int RT>
__device__ __forceinline__ void mma_step_group(
    const u32 (&lo)[NW][4], const u32 (&hi)[NW][4], const u32 (&xv)[4], int r,
    float (&acc)[NW][RT][4]) {
    const u32 b0[2] = {xv[0], xv[1]};
    const u32 b1[2] = {xv[2], xv[3]};
#pragma unroll
    for (int j = 0; j < NW; ++j) {
        const u32 a0[4] = {lo[j][0], hi[j][0], lo[j][1], hi[j][1]};
        const u32 a1[4] = {lo[j][2], hi[j][2], lo[j][3], hi[j][3]};
        mma_bf16_16816(acc[j][r], a0, b0, acc[j][r]);
        mma_bf16_16816(acc[j][r], a1, b1, acc[j][r]);
    }
}

// Every running sum to zero (unrolled: the arrays stay in registers).
template <int NW, int RT>
__device__ __forceinline__ void zero_sums(float (&acc)[NW][RT][4]) {
#pragma unroll
    for (int j = 0; j < NW; ++j)
#pragma unroll
        for (int r = 0; r < RT; ++r)
#pragma unroll
            for (int i = 0; i < 4; ++i) acc[j][r][i] = 0.0f;
}

// One step at c: the input rows' elements loaded and rounded, then the step's two instructions
// for every matrix and row group, onto the running sums.
template <int NW, int RT>
__device__ __forceinline__ void mma_step(
    const u32 (&lo)[NW][4], const u32 (&hi)[NW][4], const float* const (&xs)[RT],
    const bool (&has)[RT], int c, int k, bool vec, float (&acc)[NW][RT][4]) {
#pragma unroll
    for (int r = 0; r < RT; ++r) {
        if (!has[r]) continue;
        u32 xv[4];
        load_x8(xs[r], c, k, vec, xv);
        mma_step_group(lo, hi, xv, r, acc);
    }
}

// The running sums of one warp over all of k: `nw` weight row pairs (lane's rows g and g + 8 of
// each: w_lo[j], w_hi[j], null past the matrix) against `RT` groups of 8 input rows (the lane's
// row g of group r: xs[r], null when absent; group r takes part only if has[r], the same on every
// lane, since the instruction needs the whole warp). acc[j][r] holds the lane's four outputs:
// (column g, rows 2t and 2t + 1) and (column g + 8, the same rows).
//
// The weights and inputs of MMA_UNROLL steps are loaded before the first of them is multiplied,
// so that a decode step's thin product (a few warps per SM, bound by memory latency) has that
// many loads in flight; the instructions still run step after step, each group's in ascending
// order, so the sums are those of one step at a time (mma_step's). The fragment arrays are
// indexed by unrolled loops only, so that they stay in registers.
template <int NW, int RT>
__device__ __forceinline__ void mma_tile(
    const bf16_t* const (&w_lo)[NW],
    const bf16_t* const (&w_hi)[NW],
    const float* const (&xs)[RT],
    const bool (&has)[RT],
    int k,
    bool vec,
    float (&acc)[NW][RT][4]) {
    const int t = (threadIdx.x % 32) % 4;
    zero_sums(acc);
    int k0 = 0;
    for (; k0 + MMA_UNROLL * MMA_K <= k; k0 += MMA_UNROLL * MMA_K) {
        u32 lo[MMA_UNROLL][NW][4], hi[MMA_UNROLL][NW][4], xv[MMA_UNROLL][RT][4];
#pragma unroll
        for (int u = 0; u < MMA_UNROLL; ++u)
            load_step_weights(w_lo, w_hi, k0 + u * MMA_K + 8 * t, k, vec, lo[u], hi[u]);
        // The inputs too (from L2): loaded step by step beside their instructions, each step
        // waited for its own (the H100 showed a 1024-wide product at one row taking 15.5 us, a
        // step's round trip to L2 at a time).
#pragma unroll
        for (int u = 0; u < MMA_UNROLL; ++u)
#pragma unroll
            for (int r = 0; r < RT; ++r)
                if (has[r]) load_x8(xs[r], k0 + u * MMA_K + 8 * t, k, vec, xv[u][r]);
#pragma unroll
        for (int u = 0; u < MMA_UNROLL; ++u)
#pragma unroll
            for (int r = 0; r < RT; ++r)
                if (has[r]) mma_step_group(lo[u], hi[u], xv[u][r], r, acc);
    }
    // The last steps, one at a time.
    for (; k0 < k; k0 += MMA_K) {
        u32 lo[NW][4], hi[NW][4];
        load_step_weights(w_lo, w_hi, k0 + 8 * t, k, vec, lo, hi);
        mma_step(lo, hi, xs, has, k0 + 8 * t, k, vec, acc);
    }
}

// Staging: a block whose warps share their input rows rounds them to bf16 once into shared
// memory, MMA_STAGE_K elements of k at a time, and its warps read their fragments there instead
// of each loading (and rounding) the rows itself. The instructions, operands and order are
// mma_tile's, so the outputs are the same bits.
#define MMA_STAGE_K (MMA_UNROLL * MMA_K)
// Row stride of a staged chunk in bf16 elements: 320 bytes, 64 modulo 128, so the eight lanes of
// a 16-byte load phase (groups g and g + 1, t = 0..3) hit 32 distinct banks.
#define MMA_STAGE_STRIDE (MMA_STAGE_K + 32)

// Rounds ROWS input rows at [c0, c0 + MMA_STAGE_K) to bf16 pairs in `dst` (zero past k, and for
// an absent row) with the block's THREADS threads: four elements a thread at a time, consecutive
// threads along a row (a warp reads 512 contiguous bytes of a row), each thread the same quads of
// every chunk, all of them requested before the first store (load_row_quads).
template <int ROWS, int THREADS, typename Rows>
__device__ __forceinline__ void stage_rows(const Rows& rows, int c0, int k, bool vec, bf16_t* dst) {
    constexpr int QUADS = MMA_STAGE_K / 4, STRIDE = THREADS / QUADS, ITER = ROWS / STRIDE;
    static_assert(THREADS % QUADS == 0 && ROWS % STRIDE == 0, "whole rows per round");
    const int c = (threadIdx.x % QUADS) * 4, r0 = threadIdx.x / QUADS;
    f32x4 v[ITER];
    load_row_quads<ITER, STRIDE>(rows, r0, c0 + c, k, vec, v);
#pragma unroll
    for (int i = 0; i < ITER; ++i) {
        u32* d = reinterpret_cast<u32*>(dst + (r0 + i * STRIDE) * MMA_STAGE_STRIDE + c);
        d[0] = pack_bf16x2(v[i].x, v[i].y);
        d[1] = pack_bf16x2(v[i].z, v[i].w);
    }
}

// Step s of a staged chunk: the lane's input fragment of each group that takes part, from shared
// memory, then the step's two instructions for every matrix onto its sums (mma_step's order).
template <int NW, int GROUPS>
__device__ __forceinline__ void mma_step_staged(
    const u32 (&lo)[NW][4], const u32 (&hi)[NW][4], const bf16_t* chunk, int s,
    const bool (&has)[GROUPS], float (&acc)[NW][GROUPS][4]) {
    const int lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
#pragma unroll
    for (int r = 0; r < GROUPS; ++r) {
        if (!has[r]) continue;
        const u32x4 v = *reinterpret_cast<const u32x4*>(
            chunk + (r * MMA_ROWS + g) * MMA_STAGE_STRIDE + s * MMA_K + 8 * t);
        const u32 xv[4] = {v.x, v.y, v.z, v.w};
        mma_step_group(lo, hi, xv, r, acc);
    }
}

// The lane's weights of the MMA_UNROLL steps of the chunk at c0.
template <int NW>
__device__ __forceinline__ void load_chunk_weights(
    const bf16_t* const (&w_lo)[NW], const bf16_t* const (&w_hi)[NW], int c0, int t, int k,
    bool vec, u32 (&lo)[MMA_UNROLL][NW][4], u32 (&hi)[MMA_UNROLL][NW][4]) {
#pragma unroll
    for (int u = 0; u < MMA_UNROLL; ++u)
        load_step_weights(w_lo, w_hi, c0 + u * MMA_K + 8 * t, k, vec, lo[u], hi[u]);
}

// One staged chunk at c0 with its weights loaded: the block stages its input rows into chunk
// `buf` (then flips it), meets at the barrier, and the live warps run the chunk's steps.
template <int THREADS, int NW, int GROUPS, typename Rows>
__device__ __forceinline__ void mma_chunk_staged(
    const u32 (&lo)[MMA_UNROLL][NW][4], const u32 (&hi)[MMA_UNROLL][NW][4], const Rows& rows,
    const bool (&has)[GROUPS], int c0, int k, bool vec, bool live, bf16_t* chunks, int& buf,
    float (&acc)[NW][GROUPS][4]) {
    constexpr int CHUNK = GROUPS * MMA_ROWS * MMA_STAGE_STRIDE;
    bf16_t* chunk = chunks + buf * CHUNK;
    buf ^= 1;
    stage_rows<GROUPS * MMA_ROWS, THREADS>(rows, c0, k, vec, chunk);
    __syncthreads();
    if (!live) return;
#pragma unroll
    for (int u = 0; u < MMA_UNROLL; ++u) {
        // mma_tile has no step at or past k.
        if (c0 + u * MMA_K < k) mma_step_staged(lo[u], hi[u], chunk, u, has, acc);
    }
}

// mma_tile over GROUPS groups of input rows that the whole block of THREADS threads shares
// (`rows`, as the prelude's DenseRows: row r of the groups, absent rows read as zeros), staged
// through `chunks` (two chunks of GROUPS * MMA_ROWS * MMA_STAGE_STRIDE elements, 16-byte
// aligned). Every thread of the block must call it with the same rows and k; a warp that is not
// `live` (its columns past the matrix) stages its share and meets the others at each barrier but
// multiplies nothing. `buf` is the chunk to fill first; it carries over from call to call, so that
// consecutive chunks always alternate (the barrier before a chunk is read then also orders the
// next write to that buffer after every read of it). With PREFETCH the next chunk's weights are
// requested before this one is staged (twice the weight registers: the wide product, whose
// blocks already fill the device two an SM and stream at 84 % of the bandwidth on an H100, goes
// without, keeping that occupancy).
template <int THREADS, bool PREFETCH = true, int NW, int GROUPS, typename Rows>
__device__ __forceinline__ void mma_tile_staged(
    const bf16_t* const (&w_lo)[NW], const bf16_t* const (&w_hi)[NW], const Rows& rows,
    const bool (&has)[GROUPS], int k, bool vec, bool live, bf16_t* chunks, int& buf,
    float (&acc)[NW][GROUPS][4]) {
    const int t = (threadIdx.x % 32) % 4;
    zero_sums(acc);
    u32 lo_a[MMA_UNROLL][NW][4], hi_a[MMA_UNROLL][NW][4];
    if (!PREFETCH) {
        for (int c0 = 0; c0 < k; c0 += MMA_STAGE_K) {
            load_chunk_weights(w_lo, w_hi, c0, t, k, vec, lo_a, hi_a);
            mma_chunk_staged<THREADS>(lo_a, hi_a, rows, has, c0, k, vec, live, chunks, buf, acc);
        }
        return;
    }
    // The next chunk's weights in flight while this one is staged and multiplied (with one set,
    // each chunk waited a round trip to memory of its own after the barrier).
    u32 lo_b[MMA_UNROLL][NW][4], hi_b[MMA_UNROLL][NW][4];
    const auto load = [&](int c0, u32(&lo)[MMA_UNROLL][NW][4], u32(&hi)[MMA_UNROLL][NW][4]) {
        load_chunk_weights(w_lo, w_hi, c0, t, k, vec, lo, hi);
    };
    const auto run = [&](int c0, const u32(&lo)[MMA_UNROLL][NW][4],
                         const u32(&hi)[MMA_UNROLL][NW][4]) {
        mma_chunk_staged<THREADS>(lo, hi, rows, has, c0, k, vec, live, chunks, buf, acc);
    };
    chunks_prefetched(
        k, MMA_STAGE_K, [&](int c0) { load(c0, lo_a, hi_a); }, [&](int c0) { load(c0, lo_b, hi_b); },
        [&](int c0) { run(c0, lo_a, hi_a); }, [&](int c0) { run(c0, lo_b, hi_b); });
}
