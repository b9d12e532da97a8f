//! The matrix products.

use super::{Weights, bad, fits, int, launch, shape};
use crate::{
    BackendError,
    cuda::{CudaDevice, DevSlice, KernelId, launch as cfg},
};

impl CudaDevice {
    /// `out[m, n] = x[m, :] . w[n, :]` for `m` input rows, `n` outputs per row, inner dimension
    /// `k`, in the weights' storage and arithmetic: bf16 or f32 weights in the CPU's order
    /// (`gemm_bf16w_f32`, `gemm_f32w_f32`: bit for bit `cpu::linear` over the same values,
    /// whatever `m`), or bf16 weights in bf16 precision on tensor cores (`gemm_bf16w_mma`: the
    /// inputs rounded to bf16, `f32` sums in an order fixed per output, so a row's bits never
    /// depend on `m`, but they are not `cpu::linear`'s; needs [`CudaDevice::has_bf16_mma`]).
    pub fn gemm(
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
