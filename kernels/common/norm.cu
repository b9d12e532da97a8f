// Row norms. A half-warp owns a row: lane l accumulates the squares of elements l, l + 16, ... in
// order and the lanes fold by the CPU's tree, so the sum of squares is cpu::dot(x, x) bit for bit
// and the row's result never depends on how many rows the launch holds.
//
// Block: 128 threads = 8 rows. Grid: ceil(num_rows / 8).

#define NORM_ROWS_PER_BLOCK 8

// out[r, :] = weight * (x[r, :] * inv_rms(x[r, :])), cpu::rms_norm. `out` may alias `x`; rows
// are `width` wide and `stride` apart.
extern "C" __global__ void rms_norm_f32(
    const float* x,                    // device [num_rows, stride]
    const float* __restrict__ weight,  // device [width]
    float* out,                        // device [num_rows, stride]
    int num_rows,
    int width,
    int stride,
    float eps) {
    int row = blockIdx.x * NORM_ROWS_PER_BLOCK + threadIdx.x / DOT_LANES;
    int lane = threadIdx.x % DOT_LANES;
    bool live = row < num_rows;
    const float* xr = x + (u64)(live ? row : 0) * stride;
    float acc = 0.0f;
    if (live) {
        for (int i = lane; i < width; i += DOT_LANES) acc = add(acc, mul(xr[i], xr[i]));
    }
    float inv = inv_rms_from_lanes(acc, width, eps);
    if (!live) return;
    float* orow = out + (u64)row * stride;
    for (int i = lane; i < width; i += DOT_LANES) orow[i] = mul(weight[i], mul(xr[i], inv));
}

// The residual add and the next norm in one pass: x[r, :] += scale * branch[r, :] (the model's
// add_residual; a scale of 1 multiplies exactly), then normed[r, :] = rms_norm(x[r, :]).
extern "C" __global__ void add_rms_norm_f32(
    float* __restrict__ x,             // device [num_rows, width], updated in place
    const float* __restrict__ branch,  // device [num_rows, width]
    const float* __restrict__ weight,  // device [width]
    float* __restrict__ normed,        // device [num_rows, width]
    int num_rows,
    int width,
    float scale,
    float eps) {
    int row = blockIdx.x * NORM_ROWS_PER_BLOCK + threadIdx.x / DOT_LANES;
    int lane = threadIdx.x % DOT_LANES;
    bool live = row < num_rows;
    u64 base = (u64)(live ? row : 0) * width;
    float acc = 0.0f;
    if (live) {
        for (int i = lane; i < width; i += DOT_LANES) {
            float v = add(x[base + i], mul(scale, branch[base + i]));
            x[base + i] = v;
            acc = add(acc, mul(v, v));
        }
    }
    float inv = inv_rms_from_lanes(acc, width, eps);
    if (!live) return;
    for (int i = lane; i < width; i += DOT_LANES) {
        normed[base + i] = mul(weight[i], mul(x[base + i], inv));
    }
}
