//! The matrix products.

use super::{fits, int, launch, shape};
use crate::{
    BackendError,
    cuda::{CudaDevice, DevSlice, KernelId, launch as cfg},
};
use half::bf16;

/// The problem of one product: `m` input rows, `n` outputs per row, inner dimension `k`.
#[derive(Clone, Copy, Debug)]
struct Dims {
    m: usize,
    n: usize,
    k: usize,
}

impl CudaDevice {
    /// `out[m, n] = x[m, :] . w[n, :]` with bf16 weights `[n, k]` (`gemm_bf16w_f32`): bit for bit
    /// `cpu::linear` over the same values, whatever `m`.
    pub fn gemm_bf16(
        &self,
        x: DevSlice<'_, f32>,
        w: DevSlice<'_, bf16>,
        out: DevSlice<'_, f32>,
        m: usize,
        n: usize,
        k: usize,
    ) -> Result<(), BackendError> {
        let id = KernelId::GemmBf16;
        fits(id, "w", &w, n * k)?;
        self.gemm(id, x, w.addr(), out, Dims { m, n, k })
    }

    /// As [`CudaDevice::gemm_bf16`] with f32 weights (`gemm_f32w_f32`).
    pub fn gemm_f32(
        &self,
        x: DevSlice<'_, f32>,
        w: DevSlice<'_, f32>,
        out: DevSlice<'_, f32>,
        m: usize,
        n: usize,
        k: usize,
    ) -> Result<(), BackendError> {
        let id = KernelId::GemmF32;
        fits(id, "w", &w, n * k)?;
        self.gemm(id, x, w.addr(), out, Dims { m, n, k })
    }

    fn gemm(
        &self,
        id: KernelId,
        x: DevSlice<'_, f32>,
        w: u64,
        out: DevSlice<'_, f32>,
        d: Dims,
    ) -> Result<(), BackendError> {
        fits(id, "x", &x, d.m * d.k)?;
        fits(id, "out", &out, d.m * d.n)?;
        let sh = shape(id, cfg::gemm(d.m, d.n))?;
        let (x, out) = (x.addr(), out.addr());
        let (m, n, k) = (int(id, "m", d.m)?, int(id, "n", d.n)?, int(id, "k", d.k)?);
        launch!(self, id, sh, [x, w, out, m, n, k])
    }
}
