// Row norms. A block owns a row. Its threads first stage the row in shared memory, every load in
// flight at once; then the block's first half-warp sums the squares as cpu::dot does (lane l
// accumulates elements l, l + 16, ... in order, and the lanes fold by the CPU's tree), so the sum
// of squares is the CPU's bit for bit and a row's result never depends on how many rows the
// launch holds. Staging first matters: the sum is a chain of width / 16 dependent adds per lane,
// and reading global memory inside that chain paid a memory latency per step (about 30 us a
// 2048-wide row on an H100, whatever the batch).
//
// Block: NORM_THREADS threads, one row. Grid: num_rows.

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

// out[r, :] = weight * (x[r, :] * inv_rms(x[r, :])), cpu::rms_norm. `out` may alias `x`; rows
// are `width` wide and `stride` apart.
extern "C" __global__ void __launch_bounds__(NORM_THREADS) rms_norm_f32(
    const float* x,                    // device [num_rows, stride]
    const float* __restrict__ weight,  // device [width]
    float* out,                        // device [num_rows, stride]
    int num_rows,
    int width,
    int stride,
    float eps) {
    __shared__ float s[NORM_CHUNK];
    __shared__ float inv_slot;
    const int row = blockIdx.x, t = threadIdx.x;
    if (row >= num_rows) return;
    const float* xr = x + (u64)row * stride;
    float acc = 0.0f;
    for (int c0 = 0; c0 < width; c0 += NORM_CHUNK) {
        const int n = min(NORM_CHUNK, width - c0);
        norm_stage(s, n, [&](int i) { return xr[c0 + i]; });
        __syncthreads();
        if (t < DOT_LANES) acc = norm_lane_squares(s, n, t, acc);
        // The next chunk overwrites s; the last one stays for the output pass.
        if (c0 + NORM_CHUNK < width) __syncthreads();
    }
    const float inv = norm_broadcast_inv(acc, width, eps, &inv_slot);
    float* orow = out + (u64)row * stride;
    // One chunk: the row is still staged. More: read it again (each element by the thread that
    // writes it, so an `out` aliasing `x` is read before it is written).
    if (width <= NORM_CHUNK) {
        for (int i = t; i < width; i += NORM_THREADS) orow[i] = mul(weight[i], mul(s[i], inv));
    } else {
        for (int i = t; i < width; i += NORM_THREADS) orow[i] = mul(weight[i], mul(xr[i], inv));
    }
}

// The residual add and the next norm in one pass: x[r, :] += scale * branch[r, :] (the model's
// add_residual; a scale of 1 multiplies exactly), then normed[r, :] = rms_norm(x[r, :]).
extern "C" __global__ void __launch_bounds__(NORM_THREADS) add_rms_norm_f32(
    float* __restrict__ x,             // device [num_rows, width], updated in place
    const float* __restrict__ branch,  // device [num_rows, width]
    const float* __restrict__ weight,  // device [width]
    float* __restrict__ normed,        // device [num_rows, width]
    int num_rows,
    int width,
    float scale,
    float eps) {
    __shared__ float s[NORM_CHUNK];
    __shared__ float inv_slot;
    const int row = blockIdx.x, t = threadIdx.x;
    if (row >= num_rows) return;
    float* xr = x + (u64)row * width;
    const float* br = branch + (u64)row * width;
    float acc = 0.0f;
    for (int c0 = 0; c0 < width; c0 += NORM_CHUNK) {
        const int n = min(NORM_CHUNK, width - c0);
        norm_stage(s, n, [&](int i) { return add(xr[c0 + i], mul(scale, br[c0 + i])); });
        __syncthreads();
        if (t < DOT_LANES) acc = norm_lane_squares(s, n, t, acc);
        // The updated residual, by the thread that staged each element (it reads it back below).
        for (int i = t; i < n; i += NORM_THREADS) xr[c0 + i] = s[i];
        if (c0 + NORM_CHUNK < width) __syncthreads();
    }
    const float inv = norm_broadcast_inv(acc, width, eps, &inv_slot);
    float* nrow = normed + (u64)row * width;
    // More than a chunk: the updated row is read back from x, each element by the thread that
    // wrote it above.
    if (width <= NORM_CHUNK) {
        for (int i = t; i < width; i += NORM_THREADS) nrow[i] = mul(weight[i], mul(s[i], inv));
    } else {
        for (int i = t; i < width; i += NORM_THREADS) nrow[i] = mul(weight[i], mul(xr[i], inv));
    }
}
