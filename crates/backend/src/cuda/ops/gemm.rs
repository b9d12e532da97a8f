//! The matrix products.

use super::{Weights, bad, fits, int, launch, shape};
use crate::{
    BackendError,
    cuda::{CudaDevice, DevSlice, KernelId, launch as cfg},
};
use half::bf16;

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
        self.gemm_weights(x, Weights::Bf16(w), out, (m, n, k))
    }

    /// `out[m, n] = bf16(x[m, :]) . w[n, :]` in bf16 precision on tensor cores
    /// (`gemm_bf16w_mma`): the inputs rounded to bf16, `f32` sums in an order fixed per output,
    /// so a row's bits never depend on `m` (they are not `cpu::linear`'s). Needs bf16 tensor cores
    /// ([`CudaDevice::has_bf16_mma`]).
    pub fn gemm_bf16_mma(
        &self,
        x: DevSlice<'_, f32>,
        w: DevSlice<'_, bf16>,
        out: DevSlice<'_, f32>,
        m: usize,
        n: usize,
        k: usize,
    ) -> Result<(), BackendError> {
        self.gemm_weights(x, Weights::Bf16Mma(w), out, (m, n, k))
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
        self.gemm_weights(x, Weights::F32(w), out, (m, n, k))
    }

    /// `out[m, n] = x[m, :] . w[n, :]` with the weights' storage and arithmetic: `m` input rows,
    /// `n` outputs per row, inner dimension `k`.
    pub fn gemm_weights(
        &self,
        x: DevSlice<'_, f32>,
        w: Weights<'_>,
        out: DevSlice<'_, f32>,
        (m, n, k): (usize, usize, usize),
    ) -> Result<(), BackendError> {
        let id = w.kernel([KernelId::GemmBf16, KernelId::GemmBf16Mma, KernelId::GemmF32]);
        let grid = match w {
            Weights::Bf16Mma(_) => {
                self.check_mma(id)?;
                cfg::gemm_mma
            }
            Weights::Bf16(_) | Weights::F32(_) => cfg::gemm,
        };
        w.fits(id, "w", n * k)?;
        fits(id, "x", &x, m * k)?;
        fits(id, "out", &out, m * n)?;
        let sh = shape(id, grid(m, n))?;
        let (x, w, out) = (x.addr(), w.addr(), out.addr());
        let (m, n, k) = (int(id, "m", m)?, int(id, "n", n)?, int(id, "k", k)?);
        launch!(self, id, sh, [x, w, out, m, n, k])
    }

    /// `Ok` if this device runs `id`, a kernel of bf16 tensor cores.
    pub(crate) fn check_mma(&self, id: KernelId) -> Result<(), BackendError> {
        if !self.has_bf16_mma() {
            let arch = self.arch();
            return Err(bad(id, format!("bf16 tensor cores need sm_80 or later; this is {arch}")));
        }
        Ok(())
    }
}
