// Attention over the paged KV cache, one kernel for prefill chunks and decode steps alike.
//
// Keys and values of the step are written to the cache (kv_write_bf16) before this kernel runs,
// so every key, the chunk's own included, is read from the cache. A CTA owns up to ATTN_ROWS
// query rows of one sequence and one KV head; a row is a (query token, query head of the group)
// pair, so grouped-query heads share every loaded key and value tile.
//
// Determinism: keys are visited in tiles of ATTN_TILE positions aligned at absolute position 0,
// and a row's online softmax takes the tiles in order, skipping a tile that holds none of its keys
// (an exact no-op). Within a tile, key j always sits in lane j: the row max is exact, the sum of
// the exponentials is a fixed butterfly, the values sum runs over j in order. Which keys a row
// sees in which tile depends only on its position and the window, so a row's bits do not depend
// on the other rows of its CTA, on the chunking of the prompt or on the batch.
//
// Sliding window: a query at position p sees keys max(0, p + 1 - window) ..= p (window 0: all).
// Attention without RoPE (Nemotron-H) is this kernel with the rotary kernel not called.
//
// Block: 128 threads (4 warps). Grid: (num_work_items, num_kv_heads); a work item is
// (sequence, first row), rows of a sequence numbered token-major, ATTN_ROWS per item.
// Dynamic shared memory: attention_smem_floats(head_dim) * 4 bytes; head_dim <= 128.

#define ATTN_TILE 32
#define ATTN_ROWS 16
#define ATTN_THREADS 128
#define ATTN_MAX_HEAD_DIM 128
#define ATTN_ACC_PER_THREAD (ATTN_ROWS * ATTN_MAX_HEAD_DIM / ATTN_THREADS)

struct AttnRows {
    int token[ATTN_ROWS];
    int head[ATTN_ROWS];
    int pos[ATTN_ROWS];
    int first[ATTN_ROWS];
    float m[ATTN_ROWS];
    float l[ATTN_ROWS];
    float corr[ATTN_ROWS];
    int active[ATTN_ROWS];
};

extern "C" __global__ void __launch_bounds__(ATTN_THREADS) paged_attention_bf16kv(
    const float* __restrict__ q,             // device [num_tokens, num_heads, head_dim]
    const bf16_t* __restrict__ k_cache,      // device [num_slots, num_kv_heads, head_dim]
    const bf16_t* __restrict__ v_cache,      // device [num_slots, num_kv_heads, head_dim]
    const int* __restrict__ block_tables,    // device [num_seqs, max_blocks_per_seq]
    const int* __restrict__ positions,       // device [num_tokens]
    const int* __restrict__ seq_starts,      // device [num_seqs + 1], token offsets in the step
    const int* __restrict__ items,           // device [num_work_items, 2] (sequence, first row)
    float* __restrict__ out,                 // device [num_tokens, num_heads, head_dim]
    int num_heads,
    int num_kv_heads,
    int head_dim,
    int block_size,
    int max_blocks_per_seq,
    int window,
    float scale) {
    extern __shared__ float smem[];
    __shared__ AttnRows rows;
    float* qs = smem;                                   // [ATTN_ROWS][head_dim]
    float* ks = qs + ATTN_ROWS * head_dim;              // [ATTN_TILE][head_dim + 1]
    float* vs = ks + ATTN_TILE * (head_dim + 1);        // [ATTN_TILE][head_dim]
    float* ps = vs + ATTN_TILE * head_dim;              // [ATTN_ROWS][ATTN_TILE]

    const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
    const int seq = items[2 * blockIdx.x], row0 = items[2 * blockIdx.x + 1];
    const int kvh = blockIdx.y;
    const int group = num_heads / num_kv_heads;
    const int t0 = seq_starts[seq];
    const int num_rows = min(ATTN_ROWS, (seq_starts[seq + 1] - t0) * group - row0);

    if (tid < ATTN_ROWS) {
        int r = row0 + tid;
        bool live = tid < num_rows;
        int tok = t0 + r / group;
        int pos = live ? positions[tok] : -1;
        rows.token[tid] = tok;
        rows.head[tid] = kvh * group + r % group;
        rows.pos[tid] = pos;
        rows.first[tid] = !live ? 0x7fffffff : (window > 0 ? max(0, pos + 1 - window) : 0);
        rows.m[tid] = neg_inf();
        rows.l[tid] = 0.0f;
    }
    __syncthreads();
    for (int idx = tid; idx < ATTN_ROWS * head_dim; idx += ATTN_THREADS) {
        int r = idx / head_dim, d = idx % head_dim;
        qs[idx] = r < num_rows
            ? q[((u64)rows.token[r] * num_heads + rows.head[r]) * head_dim + d] : 0.0f;
    }
    int min_first = 0x7fffffff, max_pos = -1;
    for (int r = 0; r < num_rows; ++r) {
        min_first = min(min_first, rows.first[r]);
        max_pos = max(max_pos, rows.pos[r]);
    }
    float acc[ATTN_ACC_PER_THREAD];
#pragma unroll
    for (int j = 0; j < ATTN_ACC_PER_THREAD; ++j) acc[j] = 0.0f;
    const int* table = block_tables + (u64)seq * max_blocks_per_seq;

    for (int tile = min_first / ATTN_TILE; tile <= max_pos / ATTN_TILE; ++tile) {
        const int base = tile * ATTN_TILE;
        __syncthreads();  // the previous tile's K, V and P are no longer read
        for (int idx = tid; idx < ATTN_TILE * head_dim; idx += ATTN_THREADS) {
            int j = idx / head_dim, d = idx % head_dim, kp = base + j;
            float kv = 0.0f, vv = 0.0f;
            if (kp >= min_first && kp <= max_pos) {
                u64 slot = (u64)table[kp / block_size] * block_size + kp % block_size;
                u64 at = (slot * num_kv_heads + kvh) * head_dim + d;
                kv = bf16_to_f32(k_cache[at]);
                vv = bf16_to_f32(v_cache[at]);
            }
            ks[j * (head_dim + 1) + d] = kv;
            vs[j * head_dim + d] = vv;
        }
        __syncthreads();
        // Scores and the online-softmax update: warp w takes rows w, w + 4, ...; lane j is key j.
        for (int r = warp; r < ATTN_ROWS; r += ATTN_THREADS / 32) {
            int kp = base + lane;
            bool valid = r < num_rows && kp >= rows.first[r] && kp <= rows.pos[r];
            float s = neg_inf();
            if (valid) {
                float dot = 0.0f;
                for (int d = 0; d < head_dim; ++d)
                    dot = add(dot, mul(qs[r * head_dim + d], ks[lane * (head_dim + 1) + d]));
                s = mul(dot, scale);
            }
            float tile_max = warp_max(s);
            if (tile_max == neg_inf()) {
                if (lane == 0) rows.active[r] = 0;
                continue;
            }
            float m_old = rows.m[r];
            float m_new = fmaxf(m_old, tile_max);
            float p = valid ? exp_nonpositive(sub(s, m_new)) : 0.0f;
            ps[r * ATTN_TILE + lane] = p;
            float tile_sum = warp_sum(p);
            if (lane == 0) {
                float corr = m_old == neg_inf() ? 0.0f : exp_nonpositive(sub(m_old, m_new));
                rows.l[r] = add(mul(rows.l[r], corr), tile_sum);
                rows.m[r] = m_new;
                rows.corr[r] = corr;
                rows.active[r] = 1;
            }
        }
        __syncthreads();
#pragma unroll
        for (int j = 0; j < ATTN_ACC_PER_THREAD; ++j) {
            int idx = tid + ATTN_THREADS * j;
            if (idx >= ATTN_ROWS * head_dim) break;
            int r = idx / head_dim, d = idx % head_dim;
            if (!rows.active[r]) continue;
            float t = 0.0f;
            for (int key = 0; key < ATTN_TILE; ++key)
                t = add(t, mul(ps[r * ATTN_TILE + key], vs[key * head_dim + d]));
            acc[j] = add(mul(acc[j], rows.corr[r]), t);
        }
    }
#pragma unroll
    for (int j = 0; j < ATTN_ACC_PER_THREAD; ++j) {
        int idx = tid + ATTN_THREADS * j;
        if (idx >= ATTN_ROWS * head_dim) break;
        int r = idx / head_dim, d = idx % head_dim;
        if (r < num_rows)
            out[((u64)rows.token[r] * num_heads + rows.head[r]) * head_dim + d] =
                dvd(acc[j], rows.l[r]);
    }
}
