//! CPU reference kernels over plain `f32` slices.
//!
//! Layout conventions: matrices are row-major; a weight `w` of a linear layer is `[n, k]` as stored
//! by Hugging Face (`out_features` rows of `in_features`), so `y = x w^T`.

/// Calls `$body($args)` compiled for AVX-512F where the CPU has it, else for the baseline
/// instruction set. Both builds run the one body, so they give the same bits; the AVX-512 one only
/// lets the compiler use wider vectors. Expands as the tail of the public function.
macro_rules! with_avx512 {
    ($body:ident($($arg:ident: $ty:ty),*) $(-> $ret:ty)?) => {{
        #[cfg(target_arch = "x86_64")]
        if super::avx512_available() {
            #[target_feature(enable = "avx512f")]
            unsafe fn avx512($($arg: $ty),*) $(-> $ret)? {
                $body($($arg),*)
            }
            // SAFETY: the CPU has AVX-512F.
            return unsafe { avx512($($arg),*) };
        }
        $body($($arg),*)
    }};
}

mod matmul;
mod matrix;
mod ops;
mod pool;
mod ssm;

pub use matmul::{
    dot, identity_rows, lane_weighted_sum, linear, linear_rows, linear_rows_f32, linear_rows_serial,
};
pub use matrix::{MatmulPrecision, Matrix, MatrixData, streamed_vec};
pub use ops::{
    add_assign, argmax, exp_below, exp_nonpositive, log_softmax, log_sum_exp, mul_silu_inplace,
    relu2_inplace, rms_norm, rms_norm_inplace, scale_inplace, silu, silu_inplace, softmax_inplace,
    softmax_scaled_inplace, softplus, sum_exp_below,
};
pub use pool::with_hot_workers;
pub use ssm::{conv_step, ssm_step};

/// Below this many multiply-adds a kernel runs on the calling thread: handing tiny work to the
/// thread pool costs more than it saves.
pub(crate) const PAR_THRESHOLD: usize = 1 << 15;

/// Whether the CPU has the AVX-512 BF16 dot product as well as what [`avx512_available`] needs.
#[cfg(target_arch = "x86_64")]
pub(crate) fn avx512_bf16_available() -> bool {
    static AVAILABLE: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *AVAILABLE.get_or_init(|| avx512_available() && is_x86_feature_detected!("avx512bf16"))
}

/// Whether the CPU runs the AVX-512 builds of the kernels (checked once).
#[cfg(target_arch = "x86_64")]
pub(crate) fn avx512_available() -> bool {
    static AVAILABLE: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *AVAILABLE.get_or_init(|| {
        is_x86_feature_detected!("avx512f")
            && is_x86_feature_detected!("avx512bw")
            && is_x86_feature_detected!("avx512vl")
            && is_x86_feature_detected!("avx512dq")
    })
}
