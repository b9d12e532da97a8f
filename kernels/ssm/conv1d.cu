// Mamba2's causal depthwise conv1d over x|B|C, then SiLU, for every token of the step, advancing
// each sequence's conv state: the CPU's conv_step token by token (bias, then the taps oldest
// first, then the new input, each a separately rounded multiply and add) and silu_inplace.
//
// State: a live slot holds, per Mamba layer, the conv state [conv_kernel - 1, conv_dim] (oldest
// first) at conv_offset, then the SSM state. Snapshot taps: a tap (position q, snapshot slot s)
// stores the state after q tokens of the sequence into slot s; this kernel stores the conv part,
// mamba_scan the SSM part, both at the same offsets of the slot.
//
// Grid: (ceil(conv_dim / blockDim.x), num_seqs); a thread owns one channel of one sequence and
// walks its tokens in order, its window of past inputs in registers.

#define CONV_MAX_KERNEL 8

__device__ __forceinline__ void store_conv(float* slot_base, const float (&past)[CONV_MAX_KERNEL],
                                           int num_past, int conv_dim, int c) {
    for (int i = 0; i < num_past; ++i) slot_base[(u64)i * conv_dim + c] = past[i];
}

extern "C" __global__ void mamba_conv1d(
    const float* __restrict__ proj,       // device [num_tokens, proj_dim]; x|B|C at xbc_offset
    const float* __restrict__ weight_t,   // device [conv_kernel, conv_dim]
    const float* __restrict__ bias,       // device [conv_dim] or null
    float* __restrict__ live,             // device [num_live_slots, slot_len]
    float* __restrict__ snapshots,        // device [num_snapshot_slots, slot_len]
    SsmSeqs seqs,
    float* __restrict__ xbc,              // device [num_tokens, conv_dim], after SiLU
    int proj_dim,
    int xbc_offset,
    int conv_dim,
    int conv_kernel,
    int slot_len,
    int conv_offset) {
    const int s = blockIdx.y;
    const int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= conv_dim) return;
    const int num_past = conv_kernel - 1;
    const int t0 = seqs.seq_starts[s], t1 = seqs.seq_starts[s + 1];
    const int tap0 = seqs.tap_starts[s], tap1 = seqs.tap_starts[s + 1];
    float* state = live + (u64)seqs.live_slots[s] * slot_len + conv_offset;
    float past[CONV_MAX_KERNEL];
    for (int i = 0; i < CONV_MAX_KERNEL; ++i) past[i] = i < num_past ? state[(u64)i * conv_dim + c] : 0.0f;
    for (int j = tap0; j < tap1; ++j) {
        if (t0 < t1 && seqs.taps[2 * j] == seqs.positions[t0])
            store_conv(snapshots + (u64)seqs.taps[2 * j + 1] * slot_len + conv_offset, past, num_past, conv_dim, c);
    }
    for (int t = t0; t < t1; ++t) {
        float x = proj[(u64)t * proj_dim + xbc_offset + c];
        float out = bias ? bias[c] : 0.0f;
        for (int i = 0; i < num_past; ++i) out = add(out, mul(weight_t[(u64)i * conv_dim + c], past[i]));
        out = add(out, mul(weight_t[(u64)num_past * conv_dim + c], x));
        for (int i = 0; i + 1 < num_past; ++i) past[i] = past[i + 1];
        if (num_past > 0) past[num_past - 1] = x;
        xbc[(u64)t * conv_dim + c] = silu(out);
        for (int j = tap0; j < tap1; ++j) {
            if (seqs.taps[2 * j] == seqs.positions[t] + 1)
                store_conv(snapshots + (u64)seqs.taps[2 * j + 1] * slot_len + conv_offset, past, num_past, conv_dim, c);
        }
    }
    store_conv(state, past, num_past, conv_dim, c);
}
