// Mamba2's selective scan as one sequential recurrence, the same kernel for prefill chunks and
// decode steps: a token's arithmetic depends only on the state before it, never on how the
// prompt was chunked or what else is in the batch, and the state after any position can be
// snapshotted exactly.
//
// Per token of a sequence, per head h (group g = h / (num_heads / num_groups)):
//   dt = softplus(dt_raw + dt_bias[h]), clamped to [dt_min, dt_max] at prompt positions only
//        (positions < num_prompt_tokens; a generated token recomputed later is not clamped),
//   decay = exp(dt * a[h]),  state[i][p] = state[i][p] * decay + (dt * B[i]) * x[p],
//   y[p] = sum_i state[i][p] * C[i] (i ascending) + d[h] * x[p]
// as the CPU's ssm_step does. softplus and exp are the device's (within 2 ulp of the host's libm),
// every other operation is the CPU's, in its order.
//
// Snapshot taps as in mamba_conv1d; this kernel stores the SSM part of the slot.
// Grid: (num_heads, num_seqs). Block: head_dim threads rounded up to a warp; thread p owns channel
// p. Dynamic shared memory: (state_size * head_dim + 2 * state_size) floats.

struct ScanShape {
    int proj_dim;     // in_proj output width
    int dt_offset;    // column of head 0's dt in the in_proj output
    int conv_dim;     // x|B|C width
    int num_heads;
    int head_dim;
    int num_groups;
    int state_size;
    int slot_len;     // floats per state slot
    int ssm_offset;   // this layer's SSM state within a slot
    float dt_min;     // prompt-position clamp (-inf: none)
    float dt_max;     // (+inf: none)
};

__device__ __forceinline__ void store_ssm(float* dst, const float* state, const ScanShape& sh, int p) {
    for (int i = 0; i < sh.state_size; ++i) dst[(u64)i * sh.head_dim + p] = state[i * sh.head_dim + p];
}

extern "C" __global__ void mamba_scan(
    const float* __restrict__ xbc,          // device [num_tokens, conv_dim], after conv and SiLU
    const float* __restrict__ proj,         // device [num_tokens, proj_dim]
    const float* __restrict__ dt_bias,      // device [num_heads]
    const float* __restrict__ a,            // device [num_heads], -exp(A_log)
    const float* __restrict__ d,            // device [num_heads]
    const int* __restrict__ num_prompt,     // device [num_seqs], prompt length of each sequence
    float* __restrict__ live,               // device [num_live_slots, slot_len]
    float* __restrict__ snapshots,          // device [num_snapshot_slots, slot_len]
    SsmSeqs seqs,
    float* __restrict__ y,                  // device [num_tokens, num_heads * head_dim]
    ScanShape sh) {
    extern __shared__ float smem[];
    float* state = smem;                              // [state_size][head_dim]
    float* dtb = state + sh.state_size * sh.head_dim; // [state_size]
    float* cs = dtb + sh.state_size;                  // [state_size]
    const int h = blockIdx.x, s = blockIdx.y, p = threadIdx.x;
    const bool owner = p < sh.head_dim;
    const int d_inner = sh.num_heads * sh.head_dim;
    const int g = h / (sh.num_heads / sh.num_groups);
    const u64 head_state = (u64)h * sh.state_size * sh.head_dim;
    const int t0 = seqs.seq_starts[s], t1 = seqs.seq_starts[s + 1];
    const int tap0 = seqs.tap_starts[s], tap1 = seqs.tap_starts[s + 1];
    float* live_state = live + (u64)seqs.live_slots[s] * sh.slot_len + sh.ssm_offset + head_state;
    if (owner) {
        for (int i = 0; i < sh.state_size; ++i) state[i * sh.head_dim + p] = live_state[(u64)i * sh.head_dim + p];
        for (int j = tap0; j < tap1; ++j) {
            if (t0 < t1 && seqs.taps[2 * j] == seqs.positions[t0])
                store_ssm(snapshots + (u64)seqs.taps[2 * j + 1] * sh.slot_len + sh.ssm_offset + head_state, state, sh, p);
        }
    }
    for (int t = t0; t < t1; ++t) {
        const int pos = seqs.positions[t];
        float dt = softplus(add(proj[(u64)t * sh.proj_dim + sh.dt_offset + h], dt_bias[h]));
        if (pos < num_prompt[s]) dt = fminf(fmaxf(dt, sh.dt_min), sh.dt_max);
        const float decay = expf(mul(dt, a[h]));
        const float* row = xbc + (u64)t * sh.conv_dim;
        __syncthreads();  // the previous token's dtb and C are no longer read
        for (int i = p; i < sh.state_size; i += blockDim.x) {
            dtb[i] = mul(dt, row[d_inner + g * sh.state_size + i]);
            cs[i] = row[d_inner + (sh.num_groups + g) * sh.state_size + i];
        }
        __syncthreads();
        if (!owner) continue;
        const float x = row[h * sh.head_dim + p];
        float acc = 0.0f;
        for (int i = 0; i < sh.state_size; ++i) {
            float v = add(mul(state[i * sh.head_dim + p], decay), mul(dtb[i], x));
            state[i * sh.head_dim + p] = v;
            acc = add(acc, mul(v, cs[i]));
        }
        y[(u64)t * d_inner + h * sh.head_dim + p] = add(acc, mul(d[h], x));
        for (int j = tap0; j < tap1; ++j) {
            if (seqs.taps[2 * j] == pos + 1)
                store_ssm(snapshots + (u64)seqs.taps[2 * j + 1] * sh.slot_len + sh.ssm_offset + head_state, state, sh, p);
        }
    }
    if (owner)
        for (int i = 0; i < sh.state_size; ++i) live_state[(u64)i * sh.head_dim + p] = state[i * sh.head_dim + p];
}
