// Element-wise activations of the dense feed-forward blocks (shared experts, dense layers), in
// place on the up projection: a[i] *= silu(g[i]) (cpu::mul_silu_inplace) or a[i] = max(a[i], 0)^2
// (cpu::relu2_inplace).
//
// Grid: ceil(n / blockDim.x).
extern "C" __global__ void silu_mul_f32(
    float* __restrict__ a,        // device [n]
    const float* __restrict__ g,  // device [n]
    u64 n) {
    u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) a[i] = mul(a[i], silu(g[i]));
}

extern "C" __global__ void relu2_f32(float* __restrict__ a, u64 n) {  // device [n]
    u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        float r = fmaxf(a[i], 0.0f);
        a[i] = mul(r, r);
    }
}

// a[i] *= s (cpu::scale_inplace): the logits divided by a model's logits scaling, `s` being the
// host's 1 / scaling.
extern "C" __global__ void scale_f32(float* __restrict__ a, float s, u64 n) {  // device [n]
    u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) a[i] = mul(a[i], s);
}
