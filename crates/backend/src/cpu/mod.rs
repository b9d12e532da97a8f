//! CPU reference kernels over plain `f32` slices.
//!
//! Layout conventions: matrices are row-major; a weight `w` of a linear layer is `[n, k]` as stored
//! by Hugging Face (`out_features` rows of `in_features`), so `y = x w^T`.

mod matmul;
mod matrix;
mod ops;

pub use matmul::{dot, linear, linear_rows};
pub use matrix::{Matrix, MatrixData};
pub use ops::{
    add_assign, argmax, log_softmax, relu2_inplace, rms_norm, rms_norm_inplace, scale_inplace,
    silu, silu_inplace, softmax_inplace, softplus,
};

/// Below this many multiply-adds a kernel runs on the calling thread: handing tiny work to the
/// thread pool costs more than it saves.
pub(crate) const PAR_THRESHOLD: usize = 1 << 15;
