// The step's attention heads from the fused q/k/v projection, in one pass: each query head normed
// (q_norm, Qwen3's per-head RMS norm) and rotated, written for the attention kernel; each key head
// normed (k_norm) and rotated, and each value head, written to its token's slot of one layer's
// cache, rounded to bf16 (nearest even). A negative slot (a padded row of a captured batch)
// writes no key or value.
//
// The arithmetic is the CPU's, step for step: the norm is cpu::rms_norm (a half-warp per head,
// lane l summing the squares of elements l, l + 16, ... in order, folded by the CPU's tree), the
// rotation the neox pairs (i, i + rot_dim / 2) of the first rot_dim dims with the host's cos/sin
// table, later dims passing through; so every head's bits are the CPU layer's.
//
// Block: QKV_HEADS_PER_BLOCK half-warps, a head each (queries, then keys, then values of a
// token). Grid: (num_tokens, ceil((num_q_heads + 2 * num_kv_heads) / QKV_HEADS_PER_BLOCK)).
// Dynamic shared memory: QKV_HEADS_PER_BLOCK * head_dim floats (each head's normed row, read
// across lanes by the rotation).

#define QKV_HEADS_PER_BLOCK 8

extern "C" __global__ void __launch_bounds__(QKV_HEADS_PER_BLOCK * DOT_LANES) qkv_heads_f32(
    const float* __restrict__ qkv,      // device [num_tokens, num_q_heads + 2 * num_kv_heads, head_dim]
    const float* __restrict__ q_norm,   // device [head_dim], or null
    const float* __restrict__ k_norm,   // device [head_dim], or null
    const float* __restrict__ cos_sin,  // device [max_positions, rot_dim / 2, 2], or null: no rotary
    const int* __restrict__ positions,  // device [num_tokens]
    const int* __restrict__ slots,      // device [num_tokens]
    float* __restrict__ q,              // device [num_tokens, num_q_heads, head_dim]
    bf16_t* __restrict__ k_cache,       // device [num_slots, num_kv_heads, head_dim]
    bf16_t* __restrict__ v_cache,       // device [num_slots, num_kv_heads, head_dim]
    int num_q_heads,
    int num_kv_heads,
    int head_dim,
    int rot_dim,
    float eps) {
    extern __shared__ float heads_smem[];
    const int t = blockIdx.x, hw = threadIdx.x / DOT_LANES, lane = threadIdx.x % DOT_LANES;
    const int num_heads = num_q_heads + 2 * num_kv_heads;
    const int head = blockIdx.y * QKV_HEADS_PER_BLOCK + hw;
    const bool live = head < num_heads;
    const bool is_q = head < num_q_heads, is_v = head >= num_q_heads + num_kv_heads;
    const float* norm = is_q ? q_norm : is_v ? nullptr : k_norm;
    float* row = heads_smem + hw * head_dim;
    const float* x = qkv + ((u64)t * num_heads + (live ? head : 0)) * head_dim;
    float acc = 0.0f;
    if (live) {
        for (int i = lane; i < head_dim; i += DOT_LANES) {
            const float v = x[i];
            row[i] = v;
            acc = add(acc, mul(v, v));
        }
    }
    // Every half-warp takes part in the fold's shuffles, whether its head is normed or not.
    const float inv = inv_rms_from_lanes(acc, head_dim, eps);
    if (live && norm) {
        for (int i = lane; i < head_dim; i += DOT_LANES) row[i] = mul(norm[i], mul(row[i], inv));
    }
    __syncwarp();  // the rotation reads elements other lanes wrote
    const int slot = slots[t];
    if (!live || (!is_q && slot < 0)) return;
    const int half = cos_sin && !is_v ? rot_dim / 2 : 0;
    const float* cs = half ? cos_sin + (u64)positions[t] * half * 2 : nullptr;
    const int kvh = head - num_q_heads - (is_v ? num_kv_heads : 0);
    float* q_out = is_q ? q + ((u64)t * num_q_heads + head) * head_dim : nullptr;
    bf16_t* cache_out =
        is_q ? nullptr : (is_v ? v_cache : k_cache) + ((u64)slot * num_kv_heads + kvh) * head_dim;
    for (int i = lane; i < head_dim; i += DOT_LANES) {
        float v = row[i];
        if (i < half) {
            v = sub(mul(row[i], cs[2 * i]), mul(row[i + half], cs[2 * i + 1]));
        } else if (i < 2 * half) {
            const int j = i - half;
            v = add(mul(row[i], cs[2 * j]), mul(row[j], cs[2 * j + 1]));
        }
        if (is_q) q_out[i] = v;
        else cache_out[i] = f32_to_bf16(v);
    }
}
