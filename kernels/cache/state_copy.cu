// Recurrent-state slot copies: dst[pair.dst] = src[pair.src] for each listed pair, whole slots of
// `slot_len` floats (every Mamba layer of a slot). The same kernel restores a snapshot into a live
// slot (src = snapshot pool, dst = live pool) and takes a snapshot (the reverse); a negative
// source slot clears the destination (a sequence that starts from position 0).
//
// Grid: (ceil(slot_len / blockDim.x), num_pairs).
extern "C" __global__ void state_copy_f32(
    const float* __restrict__ src,      // device [num_src_slots, slot_len]
    float* __restrict__ dst,            // device [num_dst_slots, slot_len]
    const int* __restrict__ pairs,      // device [num_pairs, 2] (src slot, dst slot)
    int slot_len) {
    int p = blockIdx.y;
    int from = pairs[2 * p];
    int into = pairs[2 * p + 1];
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < slot_len; i += gridDim.x * blockDim.x) {
        dst[(u64)into * slot_len + i] = from < 0 ? 0.0f : src[(u64)from * slot_len + i];
    }
}
