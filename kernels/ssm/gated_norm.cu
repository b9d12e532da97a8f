// Mamba2's gated RMSNorm, in place: y = rms_norm(y * silu(z)) * weight over groups of
// group_size channels, z being the first d_inner columns of the in_proj output. A block owns a
// (token, group) pair, staged and summed as common/row_norm.cuh says (cpu::dot's order), so the
// result is the CPU's bit for bit.
//
// Block: NORM_THREADS threads, one (token, group) pair. Grid: num_tokens * groups.
extern "C" __global__ void __launch_bounds__(NORM_THREADS) mamba_gated_norm(
    float* __restrict__ y,              // device [num_tokens, d_inner]
    const float* __restrict__ proj,     // device [num_tokens, proj_dim]; z in columns 0..d_inner
    const float* __restrict__ weight,   // device [d_inner]
    int num_tokens,
    int d_inner,
    int proj_dim,
    int group_size,
    float eps) {
    __shared__ float s[NORM_CHUNK];
    __shared__ float inv_slot;
    const int groups = d_inner / group_size;
    const int item = blockIdx.x;
    if (item >= num_tokens * groups) return;
    const int t = item / groups, g = item % groups;
    float* v = y + (u64)t * d_inner + g * group_size;
    const float* z = proj + (u64)t * proj_dim + g * group_size;
    const float* w = weight + g * group_size;
    const float inv = norm_staged_inv(
        s, group_size, eps, &inv_slot, [&](int i) { return mul(v[i], silu(z[i])); },
        [&](int i, float gated) { v[i] = gated; });
    norm_write(
        s, group_size, [&](int i) { return v[i]; },
        [&](int i, float gated) { v[i] = mul(w[i], mul(gated, inv)); });
}
