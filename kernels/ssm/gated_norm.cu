// Mamba2's gated RMSNorm, in place: y = rms_norm(y * silu(z)) * weight over groups of
// group_size channels, z being the first d_inner columns of the in_proj output. A half-warp owns
// a (token, group) pair and sums squares in cpu::dot's order, so the result is the CPU's bit for
// bit.
//
// Block: 128 threads = GATED_NORM_ROWS_PER_BLOCK (token, group) pairs. Grid: ceil(num_tokens *
// groups / GATED_NORM_ROWS_PER_BLOCK).

#define GATED_NORM_ROWS_PER_BLOCK 8

extern "C" __global__ void mamba_gated_norm(
    float* __restrict__ y,              // device [num_tokens, d_inner]
    const float* __restrict__ proj,     // device [num_tokens, proj_dim]; z in columns 0..d_inner
    const float* __restrict__ weight,   // device [d_inner]
    int num_tokens,
    int d_inner,
    int proj_dim,
    int group_size,
    float eps) {
    const int groups = d_inner / group_size;
    const int item = blockIdx.x * GATED_NORM_ROWS_PER_BLOCK + threadIdx.x / DOT_LANES;
    const int lane = threadIdx.x % DOT_LANES;
    const bool live = item < num_tokens * groups;
    const int t = live ? item / groups : 0, g = live ? item % groups : 0;
    float* v = y + (u64)t * d_inner + g * group_size;
    const float* z = proj + (u64)t * proj_dim + g * group_size;
    float acc = 0.0f;
    if (live) {
        for (int i = lane; i < group_size; i += DOT_LANES) {
            float gated = mul(v[i], silu(z[i]));
            v[i] = gated;
            acc = add(acc, mul(gated, gated));
        }
    }
    float total = __shfl_sync(FULL_MASK, fold16(acc), 0, DOT_LANES);
    float inv = dvd(1.0f, __fsqrt_rn(add(dvd(total, (float)group_size), eps)));
    if (!live) return;
    const float* w = weight + g * group_size;
    for (int i = lane; i < group_size; i += DOT_LANES) v[i] = mul(w[i], mul(v[i], inv));
}
