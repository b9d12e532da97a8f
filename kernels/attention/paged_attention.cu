// Attention over the paged KV cache, one kernel for prefill chunks and decode steps alike.
//
// Keys and values of the step are written to the cache (qkv_heads_f32) before this kernel runs,
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
// Partitions: the tiles are grouped into partitions of part_tiles tiles, also aligned at absolute
// position 0. A row's online softmax starts afresh in each partition, and the partitions' results
// (max, sum, accumulator) are folded in partition order (fold_partition): a row with one partition
// gets exactly the plain online softmax. A CTA either takes every partition of its rows in turn
// (partials null: prefill chunks, large batches) or only partition blockIdx.z, writing its
// results to `partials` for attention_combine_f32 to fold (split: decode of a few sequences over
// long contexts, where one CTA per KV head and sequence would leave most of the GPU idle). Both
// fold the same values with the same operations in the same order, so a row's bits do not
// depend on whether its context was split either.
//
// Sliding window: a query at position p sees keys max(0, p + 1 - window) ..= p (window 0: all).
// Attention without RoPE (Nemotron-H) is this kernel with the rotary kernel not called.
//
// Block: 128 threads (4 warps). Grid: (num_work_items, num_kv_heads, 1 or the partitions); a work
// item is (sequence, first row), rows of a sequence numbered token-major, ATTN_ROWS per item.
// Dynamic shared memory: attention_smem_floats(head_dim) * 4 bytes; head_dim <= 128.
// Partials: [num_tokens, num_heads, max_parts, 2 + head_dim], (max, sum, accumulator) per row and
// partition.

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
    // The partition under way: running max and sum, this tile's rescale, whether the tile has keys.
    float m[ATTN_ROWS];
    float l[ATTN_ROWS];
    float corr[ATTN_ROWS];
    int active[ATTN_ROWS];
    // The partitions done, folded (whole mode): max, sum, the weights of the last fold and its
    // kind (fold_partition).
    float run_m[ATTN_ROWS];
    float run_l[ATTN_ROWS];
    float c_run[ATTN_ROWS];
    float c_part[ATTN_ROWS];
    int fold[ATTN_ROWS];
};

// Folds a partition's max and sum into the running (m, l) of a row. Returns 1 for the row's first
// partition (taken as it is: weights 0 and 1) and 2 otherwise; c_run and c_part are the weights of
// the running and the partition's accumulators (fold_acc).
__device__ __forceinline__ int fold_partition(
    float& m, float& l, float m_part, float l_part, float& c_run, float& c_part) {
    if (m == neg_inf()) {
        m = m_part;
        l = l_part;
        c_run = 0.0f;
        c_part = 1.0f;
        return 1;
    }
    float m_new = fmaxf(m, m_part);
    c_run = exp_nonpositive(sub(m, m_new));
    c_part = exp_nonpositive(sub(m_part, m_new));
    l = add(mul(l, c_run), mul(l_part, c_part));
    m = m_new;
    return 2;
}

// An accumulator after fold_partition returned `kind` with these weights.
__device__ __forceinline__ float fold_acc(int kind, float acc_run, float acc_part, float c_run, float c_part) {
    return kind == 1 ? acc_part : add(mul(acc_run, c_run), mul(acc_part, c_part));
}

// Where one tile's keys and values are: positions base .. base + ATTN_TILE of one KV head,
// those outside [lo, hi] (no row of the CTA sees them) staged as zeros.
struct KvTile {
    const bf16_t* k_cache;
    const bf16_t* v_cache;
    const int* table;
    int block_size, num_kv_heads, kvh, head_dim, base, lo, hi;

    // The element offset of key j's first element, or -1 outside [lo, hi].
    __device__ __forceinline__ i64 at(int j) const {
        int kp = base + j;
        if (kp < lo || kp > hi) return -1;
        u64 slot = (u64)table[kp / block_size] * block_size + kp % block_size;
        return (i64)((slot * num_kv_heads + kvh) * head_dim);
    }
};

// Up to this many 8-element vectors of keys and as many of values per thread and tile.
#define ATTN_TILE_VECS (ATTN_TILE * ATTN_MAX_HEAD_DIM / 8 / ATTN_THREADS)

// Whether a tile can be staged with 16-byte loads: every key's row of a KV head starts 16-byte
// aligned when head_dim is a multiple of 8 and the caches' bases are aligned (the pools are, at
// 256 bytes; a cache handed over at another offset takes the element path).
__device__ __forceinline__ bool kv_vec_ok(
    const bf16_t* k_cache, const bf16_t* v_cache, int head_dim) {
    return head_dim % 8 == 0 && (u64)k_cache % 16 == 0 && (u64)v_cache % 16 == 0;
}

// A tile's keys and values as 16-byte vectors in flight (the thread's share), where kv_vec_ok.
struct KvVecs {
    u32x4 k[ATTN_TILE_VECS], v[ATTN_TILE_VECS];
};

// The thread's share of every tile, the same for each: vector u is elements d[u] .. d[u] + 8 of
// key key[u] (-1: none).
struct KvShare {
    int key[ATTN_TILE_VECS], d[ATTN_TILE_VECS];
};

__device__ __forceinline__ KvShare kv_share(int head_dim, int tid) {
    const int vecs = head_dim / 8;
    KvShare s;
#pragma unroll
    for (int u = 0; u < ATTN_TILE_VECS; ++u) {
        const int idx = tid + u * ATTN_THREADS;
        s.key[u] = idx < ATTN_TILE * vecs ? idx / vecs : -1;
        s.d[u] = (idx % vecs) * 8;
    }
    return s;
}

// Issues every 16-byte load of the thread's share of a tile without waiting for any, from the
// offsets of the tile's keys (`key_at`, KvTile::at of each; -1 loads zeros), which the first warp
// works out a tile ahead: no thread divides or reads the block table here, so all of its loads
// leave at once. The tile after the one under way is requested before that one is used, so its
// loads are in flight while the block computes (the loop below).
__device__ __forceinline__ void load_kv_tile_vec(
    const bf16_t* k_cache, const bf16_t* v_cache, const i64* key_at, const KvShare& share,
    KvVecs& r) {
#pragma unroll
    for (int u = 0; u < ATTN_TILE_VECS; ++u) {
        r.k[u] = r.v[u] = u32x4{0, 0, 0, 0};
        if (share.key[u] < 0) continue;
        const i64 at = key_at[share.key[u]];
        if (at < 0) continue;
        r.k[u] = *reinterpret_cast<const u32x4*>(k_cache + at + share.d[u]);
        r.v[u] = *reinterpret_cast<const u32x4*>(v_cache + at + share.d[u]);
    }
}

// Stores the loaded share of a tile into shared memory as f32 (keys with a padded stride against
// bank conflicts).
__device__ __forceinline__ void store_kv_tile_vec(
    const KvVecs& r, const KvShare& share, int head_dim, float* ks, float* vs) {
#pragma unroll
    for (int u = 0; u < ATTN_TILE_VECS; ++u) {
        if (share.key[u] < 0) break;
        const u32 kw[4] = {r.k[u].x, r.k[u].y, r.k[u].z, r.k[u].w};
        const u32 vw[4] = {r.v[u].x, r.v[u].y, r.v[u].z, r.v[u].w};
        float* kd = ks + share.key[u] * (head_dim + 1) + share.d[u];
        float* vd = vs + share.key[u] * head_dim + share.d[u];
        for (int e = 0; e < 4; ++e) {
            kd[2 * e] = bf16_lo(kw[e]);
            kd[2 * e + 1] = bf16_hi(kw[e]);
            vd[2 * e] = bf16_lo(vw[e]);
            vd[2 * e + 1] = bf16_hi(vw[e]);
        }
    }
}

// Stages a tile in shared memory as f32 one element at a time, where 16-byte loads would not be
// aligned (no loads ahead).
__device__ __forceinline__ void stage_kv_tile(const KvTile& t, float* ks, float* vs, int tid) {
    for (int idx = tid; idx < ATTN_TILE * t.head_dim; idx += ATTN_THREADS) {
        int j = idx / t.head_dim, d = idx % t.head_dim;
        i64 at = t.at(j);
        ks[j * (t.head_dim + 1) + d] = at < 0 ? 0.0f : bf16_to_f32(t.k_cache[at + d]);
        vs[j * t.head_dim + d] = at < 0 ? 0.0f : bf16_to_f32(t.v_cache[at + d]);
    }
}

extern "C" __global__ void __launch_bounds__(ATTN_THREADS) paged_attention_bf16kv(
    const float* __restrict__ q,             // device [num_tokens, num_heads, head_dim]
    const bf16_t* __restrict__ k_cache,      // device [num_slots, num_kv_heads, head_dim]
    const bf16_t* __restrict__ v_cache,      // device [num_slots, num_kv_heads, head_dim]
    const int* __restrict__ block_tables,    // device [num_seqs, max_blocks_per_seq]
    const int* __restrict__ positions,       // device [num_tokens]
    const int* __restrict__ seq_starts,      // device [num_seqs + 1], token offsets in the step
    const int* __restrict__ items,           // device [num_work_items, 2] (sequence, first row)
    float* __restrict__ out,                 // device [num_tokens, num_heads, head_dim]
    float* __restrict__ partials,            // device, see above; null: whole mode
    int max_parts,                           // partitions per row in `partials`
    int part_tiles,                          // tiles per partition
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
        rows.run_m[tid] = neg_inf();
        rows.run_l[tid] = 0.0f;
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
    const int tile_lo = min_first / ATTN_TILE, tile_hi = max_pos / ATTN_TILE;
    int part_lo = tile_lo / part_tiles, part_hi = tile_hi / part_tiles;
    const bool split = partials != nullptr;
    if (split) {
        // The same for every thread: the CTA leaves together, before any barrier.
        if ((int)blockIdx.z < part_lo || (int)blockIdx.z > part_hi) return;
        part_lo = part_hi = blockIdx.z;
    }
    float acc[ATTN_ACC_PER_THREAD], acc_run[ATTN_ACC_PER_THREAD];
#pragma unroll
    for (int j = 0; j < ATTN_ACC_PER_THREAD; ++j) acc_run[j] = 0.0f;
    const int* table = block_tables + (u64)seq * max_blocks_per_seq;
    const bool vec_loads = kv_vec_ok(k_cache, v_cache, head_dim);
    // Where tile `tile`'s keys and values are.
    const auto tile_at = [&](int tile) {
        return KvTile{k_cache, v_cache, table, block_size, num_kv_heads,
                      kvh, head_dim, tile * ATTN_TILE, min_first, max_pos};
    };
    // The CTA's tiles run from the first partition's first to the last partition's last without a
    // gap (partitions are consecutive), so the tile after any is the next one up to this.
    const int last_tile = min(tile_hi, part_hi * part_tiles + part_tiles - 1);
    // The vector path: each tile's key offsets in key_at[tile % 2], the first two tiles' now, a
    // later tile's two tiles ahead (see the end of the tile loop).
    __shared__ i64 key_at[2][ATTN_TILE];
    const KvShare share = kv_share(head_dim, tid);
    KvVecs next;
    if (vec_loads) {
        const int first = max(tile_lo, part_lo * part_tiles);
        for (int t = first; t <= min(first + 1, last_tile); ++t)
            if (tid < ATTN_TILE) key_at[t & 1][tid] = tile_at(t).at(tid);
        __syncthreads();
        load_kv_tile_vec(k_cache, v_cache, key_at[first & 1], share, next);
    }

    for (int part = part_lo; part <= part_hi; ++part) {
        __syncthreads();  // the previous partition's fold has read its m and l
        if (tid < ATTN_ROWS) {
            rows.m[tid] = neg_inf();
            rows.l[tid] = 0.0f;
        }
#pragma unroll
        for (int j = 0; j < ATTN_ACC_PER_THREAD; ++j) acc[j] = 0.0f;
        const int t_begin = max(tile_lo, part * part_tiles);
        const int t_end = min(tile_hi, part * part_tiles + part_tiles - 1);
        for (int tile = t_begin; tile <= t_end; ++tile) {
            const int base = tile * ATTN_TILE;
            __syncthreads();  // the previous tile's K, V and P are no longer read
            if (vec_loads) {
                store_kv_tile_vec(next, share, head_dim, ks, vs);
                if (tile < last_tile)
                    load_kv_tile_vec(k_cache, v_cache, key_at[(tile + 1) & 1], share, next);
            } else {
                stage_kv_tile(tile_at(tile), ks, vs, tid);
            }
            __syncthreads();
            // The first warp requests the key offsets of the tile two ahead now and stores them
            // after this tile's work (into the buffer this tile's loads read, free since the
            // barrier above), so the block-table read is in flight meanwhile.
            const bool ahead = vec_loads && tid < ATTN_TILE && tile + 2 <= last_tile;
            const i64 ahead_at = ahead ? tile_at(tile + 2).at(tid) : -1;
            // Scores and the online-softmax update: warp w takes rows w, w + 4, ...; lane j is
            // key j.
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
            if (ahead) key_at[tile & 1][tid] = ahead_at;
        }
        __syncthreads();  // the partition's m and l are final
        if (split) break;
        // Whole mode: fold the partition into the row's running result (rows without a key in
        // it keep theirs).
        if (tid < ATTN_ROWS) {
            rows.fold[tid] = rows.m[tid] == neg_inf()
                ? 0
                : fold_partition(rows.run_m[tid], rows.run_l[tid], rows.m[tid], rows.l[tid],
                                 rows.c_run[tid], rows.c_part[tid]);
        }
        __syncthreads();
#pragma unroll
        for (int j = 0; j < ATTN_ACC_PER_THREAD; ++j) {
            int idx = tid + ATTN_THREADS * j;
            if (idx >= ATTN_ROWS * head_dim) break;
            int r = idx / head_dim;
            if (rows.fold[r])
                acc_run[j] = fold_acc(rows.fold[r], acc_run[j], acc[j], rows.c_run[r], rows.c_part[r]);
        }
    }
    if (split) {
        // This partition's results of the rows with a key in it; the combine reads exactly those.
        const int p = blockIdx.z;
#pragma unroll
        for (int j = 0; j < ATTN_ACC_PER_THREAD; ++j) {
            int idx = tid + ATTN_THREADS * j;
            if (idx >= ATTN_ROWS * head_dim) break;
            int r = idx / head_dim, d = idx % head_dim;
            if (r >= num_rows || rows.m[r] == neg_inf()) continue;
            u64 at = (((u64)rows.token[r] * num_heads + rows.head[r]) * max_parts + p) * (head_dim + 2);
            partials[at + 2 + d] = acc[j];
            if (d == 0) {
                partials[at] = rows.m[r];
                partials[at + 1] = rows.l[r];
            }
        }
        return;
    }
#pragma unroll
    for (int j = 0; j < ATTN_ACC_PER_THREAD; ++j) {
        int idx = tid + ATTN_THREADS * j;
        if (idx >= ATTN_ROWS * head_dim) break;
        int r = idx / head_dim, d = idx % head_dim;
        if (r < num_rows)
            out[((u64)rows.token[r] * num_heads + rows.head[r]) * head_dim + d] =
                dvd(acc_run[j], rows.run_l[r]);
    }
}

// The partitions of split attention folded per (token, query head), in partition order, with the
// whole mode's fold: bit for bit what one CTA taking the partitions in turn writes. Every
// partition holding one of the row's keys was written by paged_attention_bf16kv.
//
// Block: ATTN_MAX_HEAD_DIM threads, thread d for element d. Grid: (num_tokens, num_heads).
extern "C" __global__ void __launch_bounds__(ATTN_MAX_HEAD_DIM) attention_combine_f32(
    const float* __restrict__ partials,  // device [num_tokens, num_heads, max_parts, 2 + head_dim]
    const int* __restrict__ positions,   // device [num_tokens]
    float* __restrict__ out,             // device [num_tokens, num_heads, head_dim]
    int num_heads,
    int head_dim,
    int max_parts,
    int part_tiles,
    int window) {
    const int tok = blockIdx.x, head = blockIdx.y, d = threadIdx.x;
    const int pos = positions[tok];
    const int first = window > 0 ? max(0, pos + 1 - window) : 0;
    const int part_len = part_tiles * ATTN_TILE;
    const float* row = partials + ((u64)tok * num_heads + head) * max_parts * (head_dim + 2);
    float m = neg_inf(), l = 0.0f, acc = 0.0f;
    for (int p = first / part_len; p <= pos / part_len; ++p) {
        const float* part = row + (u64)p * (head_dim + 2);
        float c_run, c_part;
        int kind = fold_partition(m, l, part[0], part[1], c_run, c_part);
        if (d < head_dim) acc = fold_acc(kind, acc, part[2 + d], c_run, c_part);
    }
    if (d < head_dim) out[((u64)tok * num_heads + head) * head_dim + d] = dvd(acc, l);
}
