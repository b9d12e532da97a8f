// Paged KV write: the step's keys and values go to their token slots in one attention layer's
// cache, rounded to bf16 (nearest even). The slot of position p of a sequence is
// block_table[p / block_size] * block_size + p % block_size, computed on the host as the slot
// mapping; a negative slot (a padded row of a captured batch) writes nothing.
//
// Grid: (ceil(width / blockDim.x), num_tokens), width = num_kv_heads * head_dim.
extern "C" __global__ void kv_write_bf16(
    const float* __restrict__ k,         // device [num_tokens, width]
    const float* __restrict__ v,         // device [num_tokens, width]
    const int* __restrict__ slots,       // device [num_tokens]
    bf16_t* __restrict__ k_cache,        // device [num_slots, width]
    bf16_t* __restrict__ v_cache,        // device [num_slots, width]
    int width) {
    int t = blockIdx.y;
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    int slot = slots[t];
    if (i >= width || slot < 0) return;
    u64 src = (u64)t * width + i;
    u64 dst = (u64)slot * width + i;
    k_cache[dst] = f32_to_bf16(k[src]);
    v_cache[dst] = f32_to_bf16(v[src]);
}
