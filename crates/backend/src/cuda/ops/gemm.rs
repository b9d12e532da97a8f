//! The matrix products.

use super::{Weights, bad, fits, int, launch, shape};
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
        let id = KernelId::GemmBf16Mma;
        self.check_mma(id)?;
        fits(id, "w", &w, n * k)?;
        self.gemm(id, x, w.addr(), out, Dims { m, n, k })
    }

    /// `out[m, n] = x[m, :] . w[n, :]` with the weights' storage and arithmetic.
    pub fn gemm_weights(
        &self,
        x: DevSlice<'_, f32>,
        w: Weights<'_>,
        out: DevSlice<'_, f32>,
        (m, n, k): (usize, usize, usize),
    ) -> Result<(), BackendError> {
        match w {
            Weights::Bf16(w) => self.gemm_bf16(x, w, out, m, n, k),
            Weights::Bf16Mma(w) => self.gemm_bf16_mma(x, w, out, m, n, k),
            Weights::F32(w) => self.gemm_f32(x, w, out, m, n, k),
        }
    }

    /// `Ok` if this device runs `id`, a kernel of bf16 tensor cores.
    pub(crate) fn check_mma(&self, id: KernelId) -> Result<(), BackendError> {
        if !self.has_bf16_mma() {
            let arch = self.arch();
            return Err(bad(id, format!("bf16 tensor cores need sm_80 or later; this is {arch}")));
        }
        Ok(())
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
        let grid = if id == KernelId::GemmBf16Mma { cfg::gemm_mma } else { cfg::gemm };
        let sh = shape(id, grid(d.m, d.n))?;
        let (x, out) = (x.addr(), out.addr());
        let (m, n, k) = (int(id, "m", d.m)?, int(id, "n", d.n)?, int(id, "k", d.k)?);
        launch!(self, id, sh, [x, w, out, m, n, k])
    }
}
