// Row norms staged through shared memory, shared by the row norms (common/norm.cu) and Mamba2's
// gated norm (ssm/gated_norm.cu). A block owns a row: its threads first stage the row in shared
// memory, every load in flight at once; then the block's first half-warp sums the squares as
// cpu::dot does (lane l accumulates elements l, l + 16, ... in order, and the lanes fold by the
// CPU's tree), so the sum of squares is the CPU's bit for bit and a row's result never depends on
// how many rows the launch holds. Staging first matters: the sum is a chain of width / 16
// dependent adds per lane, and reading global memory inside that chain paid a memory latency per
// step (about 30 us a 1024-wide row on an H100, whatever the batch).

#define NORM_THREADS 128
// Elements staged at once (16 KB); a multiple of 16, so each lane's order carries over chunks.
#define NORM_CHUNK 4096
// Loads each thread has in flight while staging.
#define NORM_BATCH 8

// s[i] = value(i) for i in [0, n), over the block's threads (thread t takes i = t mod
// NORM_THREADS). A whole batch's NORM_BATCH loads leave before any store, unpredicated (with a
// predicate each, the compiler ran out of predicate registers and issued them seven at a time),
// and only shared memory is written, so nothing orders a store before a later load.
template <typename Value>
__device__ __forceinline__ void norm_stage(float* s, int n, Value value) {
    int i = threadIdx.x;
    for (; i + (NORM_BATCH - 1) * NORM_THREADS < n; i += NORM_BATCH * NORM_THREADS) {
        float v[NORM_BATCH];
#pragma unroll
        for (int k = 0; k < NORM_BATCH; ++k) v[k] = value(i + k * NORM_THREADS);
#pragma unroll
        for (int k = 0; k < NORM_BATCH; ++k) s[i + k * NORM_THREADS] = v[k];
    }
    for (; i < n; i += NORM_THREADS) s[i] = value(i);
}

// The half-warp's lane sums of squares of s[0..n), continuing `acc` (lanes 0..15 of warp 0).
__device__ __forceinline__ float norm_lane_squares(const float* s, int n, int lane, float acc) {
#pragma unroll 8
    for (int i = lane; i < n; i += DOT_LANES) acc = add(acc, mul(s[i], s[i]));
    return acc;
}

// 1 / rms of the row whose lane sums warp 0 holds, broadcast to the block through `slot`.
__device__ __forceinline__ float norm_broadcast_inv(float acc, int width, float eps, float* slot) {
    if (threadIdx.x < 32) {
        float inv = inv_rms_from_lanes(acc, width, eps);
        if (threadIdx.x == 0) *slot = inv;
    }
    __syncthreads();
    return *slot;
}

// 1 / rms of a row of `width` values value(i), in every thread of the block: the row is staged
// NORM_CHUNK elements at a time into `s` (the last chunk stays there), its squares summed in the
// CPU's order, and each value handed to keep(i, v) by the thread that staged it (which is the
// thread norm_write gives element i: i = threadIdx.x mod NORM_THREADS either way, since chunks
// start at multiples of NORM_THREADS). Every thread of the block must call it.
template <typename Value, typename Keep>
__device__ __forceinline__ float norm_staged_inv(
    float* s, int width, float eps, float* slot, Value value, Keep keep) {
    const int t = threadIdx.x;
    float acc = 0.0f;
    for (int c0 = 0; c0 < width; c0 += NORM_CHUNK) {
        const int n = min(NORM_CHUNK, width - c0);
        norm_stage(s, n, [&](int i) { return value(c0 + i); });
        __syncthreads();
        if (t < DOT_LANES) acc = norm_lane_squares(s, n, t, acc);
        for (int i = t; i < n; i += NORM_THREADS) keep(c0 + i, s[i]);
        // The next chunk overwrites s.
        if (c0 + NORM_CHUNK < width) __syncthreads();
    }
    return norm_broadcast_inv(acc, width, eps, slot);
}

// store(i, v) for every element of the row norm_staged_inv staged, v read from `s` when the row
// was one chunk and from reread(i) otherwise (what keep stored: the same thread reads it back, so
// an output aliasing the input is read before it is written).
template <typename Reread, typename Store>
__device__ __forceinline__ void norm_write(const float* s, int width, Reread reread, Store store) {
    for (int i = threadIdx.x; i < width; i += NORM_THREADS)
        store(i, width <= NORM_CHUNK ? s[i] : reread(i));
}
