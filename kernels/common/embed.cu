// Embedding gather: out[t, :] = table[ids[t], :] * scale, widened from bf16 (exact), as
// Matrix::row_into followed by cpu::scale_inplace (a scale of 1 leaves the bits unchanged).
//
// Grid: (ceil(hidden / blockDim.x), num_tokens).
extern "C" __global__ void embed_gather_bf16(
    const bf16_t* __restrict__ table,  // device [vocab, hidden]
    const u32* __restrict__ ids,       // device [num_tokens]
    float* __restrict__ out,           // device [num_tokens, hidden]
    int hidden,
    float scale) {
    int t = blockIdx.y;
    int h = blockIdx.x * blockDim.x + threadIdx.x;
    if (h >= hidden) return;
    u64 row = (u64)ids[t] * (u64)hidden;
    out[(u64)t * hidden + h] = mul(bf16_to_f32(table[row + h]), scale);
}
