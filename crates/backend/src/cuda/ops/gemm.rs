//! The matrix products.

use super::{Weights, bad, fits, int, launch, shape};
use crate::{
    BackendError,
    cuda::{CudaDevice, DevSlice, KernelId, launch as cfg},
};

/// A launch shape for `m` rows by `n` columns.
type GridOf = fn(usize, usize) -> Option<cfg::Shape>;

/// How a matrix product spreads its rows and columns over threads and blocks: a choice of speed
/// only, since every tiling gives every output the same operations on the same operands in the
/// same order, hence the same bits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GemmTiling {
    /// `gemm_bf16w_f32`, `gemm_f32w_f32`, `gemm_bf16w_mma`: every thread reads its own input
    /// rows, so an input element is read once per 4 output columns (once per 16 on tensor
    /// cores); with a few rows that costs no more than the weights, and no barrier slows the
    /// latency-bound steps of a decode.
    Thin,
    /// `gemm_*_f32_staged`, `gemm_bf16w_mma_staged`: a block copies its rows' inputs into shared
    /// memory once for all its threads (16 rows by 32 columns in the `f32` kernels; on tensor
    /// cores the thin kernel's blocks, 32 rows by 64 columns).
    Staged,
    /// `gemm_bf16w_mma_staged_wide` on tensor cores (the `f32` kernels take [`Self::Staged`]):
    /// blocks of 64 rows by 128 columns, which read an input once per 128 columns and a weight
    /// once per 64 rows.
    StagedWide,
}

impl GemmTiling {
    /// The tiling [`CudaDevice::gemm`] takes for `m` rows by `n` columns, on tensor cores if
    /// `mma`: thin up to [`cfg::GEMM_THIN_MAX_ROWS`] rows, staged beyond (where the thin kernels'
    /// input reads outgrow their weights), on tensor cores wide where its grid still has
    /// [`cfg::MMA_WIDE_MIN_BLOCKS`] blocks.
    pub fn for_shape(m: usize, n: usize, mma: bool) -> Self {
        let wide_blocks = cfg::gemm_mma_staged_wide(m, n).map_or(0, |s| s.grid.0 * s.grid.1);
        if m <= cfg::GEMM_THIN_MAX_ROWS {
            Self::Thin
        } else if mma && wide_blocks as usize >= cfg::MMA_WIDE_MIN_BLOCKS {
            Self::StagedWide
        } else {
            Self::Staged
        }
    }
}

impl CudaDevice {
    /// `out[m, n] = x[m, :] . w[n, :]` for `m` input rows, `n` outputs per row, inner dimension
    /// `k`, in the weights' storage and arithmetic: bf16 or f32 weights in the CPU's order
    /// (`gemm_bf16w_f32`, `gemm_f32w_f32` and their staged variants: bit for bit `cpu::linear`
    /// over the same values, whatever `m`), or bf16 weights in bf16 precision on tensor cores
    /// (`gemm_bf16w_mma` and its staged variants: the inputs rounded to bf16, `f32` sums in an
    /// order fixed per output, so a row's bits never depend on `m`, but they are not
    /// `cpu::linear`'s; needs [`CudaDevice::has_bf16_mma`]).
    pub fn gemm(
        &self,
        x: DevSlice<'_, f32>,
        w: Weights<'_>,
        out: DevSlice<'_, f32>,
        (m, n, k): (usize, usize, usize),
    ) -> Result<(), BackendError> {
        let tiling = GemmTiling::for_shape(m, n, matches!(w, Weights::Bf16Mma(_)));
        self.gemm_tiled(x, w, out, (m, n, k), tiling)
    }

    /// [`CudaDevice::gemm`] with the tiling chosen by the caller (for tests and benchmarks: the
    /// bits are the same whichever it is).
    pub fn gemm_tiled(
        &self,
        x: DevSlice<'_, f32>,
        w: Weights<'_>,
        out: DevSlice<'_, f32>,
        (m, n, k): (usize, usize, usize),
        tiling: GemmTiling,
    ) -> Result<(), BackendError> {
        use GemmTiling::*;
        let (id, grid): (KernelId, GridOf) = match (w, tiling) {
            (Weights::Bf16(_), Thin) => (KernelId::GemmBf16, cfg::gemm),
            (Weights::F32(_), Thin) => (KernelId::GemmF32, cfg::gemm),
            (Weights::Bf16(_), Staged | StagedWide) => (KernelId::GemmBf16Staged, cfg::gemm_staged),
            (Weights::F32(_), Staged | StagedWide) => (KernelId::GemmF32Staged, cfg::gemm_staged),
            (Weights::Bf16Mma(_), Thin) => (KernelId::GemmBf16Mma, cfg::gemm_mma),
            (Weights::Bf16Mma(_), Staged) => (KernelId::GemmBf16MmaStaged, cfg::gemm_mma_staged),
            (Weights::Bf16Mma(_), StagedWide) => {
                (KernelId::GemmBf16MmaStagedWide, cfg::gemm_mma_staged_wide)
            }
        };
        if let Weights::Bf16Mma(_) = w {
            self.check_mma(id)?;
        }
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
