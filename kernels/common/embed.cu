// Embedding gather: out[t, :] = table[ids[t], :] * scale, widened from bf16 (exact) or read as
// f32, as Matrix::row_into followed by cpu::scale_inplace (a scale of 1 leaves the bits unchanged).
//
// Grid: (ceil(hidden / blockDim.x), num_tokens).
template <typename W>
__device__ __forceinline__ void embed_gather(
    const W* __restrict__ table,  // device [vocab, hidden]
    const u32* __restrict__ ids,  // device [num_tokens]
    float* __restrict__ out,      // device [num_tokens, hidden]
    int hidden,
    float scale) {
    int t = blockIdx.y;
    int h = blockIdx.x * blockDim.x + threadIdx.x;
    if (h >= hidden) return;
    u64 row = (u64)ids[t] * (u64)hidden;
    out[(u64)t * hidden + h] = mul(load_weight(table + row + h), scale);
}

extern "C" __global__ void embed_gather_bf16(
    const bf16_t* table, const u32* ids, float* out, int hidden, float scale) {
    embed_gather(table, ids, out, hidden, scale);
}

extern "C" __global__ void embed_gather_f32(
    const float* table, const u32* ids, float* out, int hidden, float scale) {
    embed_gather(table, ids, out, hidden, scale);
}
