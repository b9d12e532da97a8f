// Row norms: a block a row, staged and summed as common/row_norm.cuh says.
//
// Block: NORM_THREADS threads, one row. Grid: num_rows.

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
    const int row = blockIdx.x;
    if (row >= num_rows) return;
    const float* xr = x + (u64)row * stride;
    float* orow = out + (u64)row * stride;
    const float inv = norm_staged_inv(
        s, width, eps, &inv_slot, [&](int i) { return xr[i]; }, [](int, float) {});
    norm_write(
        s, width, [&](int i) { return xr[i]; },
        [&](int i, float v) { orow[i] = mul(weight[i], mul(v, inv)); });
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
    const int row = blockIdx.x;
    if (row >= num_rows) return;
    float* xr = x + (u64)row * width;
    const float* br = branch + (u64)row * width;
    float* nrow = normed + (u64)row * width;
    const float inv = norm_staged_inv(
        s, width, eps, &inv_slot, [&](int i) { return add(xr[i], mul(scale, br[i])); },
        [&](int i, float v) { xr[i] = v; });
    norm_write(
        s, width, [&](int i) { return xr[i]; },
        [&](int i, float v) { nrow[i] = mul(weight[i], mul(v, inv)); });
}
