// Rotary embedding in the "rotate half" (neox) layout, applied in place to queries and keys:
// dims i and i + rot/2 of the first `rot_dim` dims of every head form a pair (rot_dim < head_dim
// is partial rotary; the remaining dims pass through). The cos/sin table is built on the host with
// the CPU's formula, so the rotation is bit for bit the CPU's.
//
// Grid: (num_tokens, num_q_heads + num_k_heads). Block: rot_dim / 2 threads (at most 1024).
extern "C" __global__ void rope_neox_f32(
    float* __restrict__ q,              // device [num_tokens, num_q_heads, head_dim]
    float* __restrict__ k,              // device [num_tokens, num_k_heads, head_dim]
    const float* __restrict__ cos_sin,  // device [max_positions, rot_dim / 2, 2] (cos, sin)
    const int* __restrict__ positions,  // device [num_tokens]
    int num_q_heads,
    int num_k_heads,
    int head_dim,
    int rot_dim) {
    int t = blockIdx.x;
    int head = blockIdx.y;
    int half = rot_dim / 2;
    int i = threadIdx.x;
    if (i >= half) return;
    float* v = head < num_q_heads
        ? q + ((u64)t * num_q_heads + head) * head_dim
        : k + ((u64)t * num_k_heads + (head - num_q_heads)) * head_dim;
    const float* cs = cos_sin + ((u64)positions[t] * half + i) * 2;
    float c = cs[0], s = cs[1];
    float x0 = v[i], x1 = v[i + half];
    v[i] = sub(mul(x0, c), mul(x1, s));
    v[i + half] = add(mul(x1, c), mul(x0, s));
}
