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
    /// `gemm_bf16w_f32_row`, `gemm_f32w_f32_row`: a half-warp per output, 32 stripes of k
    /// requested ahead, for a decode step of one sequence, whose narrow products the thin kernel
    /// spreads over fewer blocks than the SMs. On tensor cores, the thin kernel.
    Row,
    /// `gemm_bf16w_f32`, `gemm_f32w_f32`, `gemm_bf16w_mma`: every thread reads its own input
    /// rows, so an input element is read once per 4 output columns (once per 16 on tensor
    /// cores); with a few rows that costs no more than the weights, and no barrier slows the
    /// latency-bound steps of a decode.
    Thin,
    /// `gemm_*_f32_staged`, `gemm_bf16w_mma_staged`: a block copies its rows' inputs into shared
    /// memory once for all its threads (16 rows by 32 columns in the `f32` kernels, 4 times the
    /// thin kernel's rows; on tensor cores the thin kernel's blocks, 32 rows by 64 columns).
    Staged,
    /// `gemm_bf16w_mma_staged_wide` on tensor cores (the `f32` kernels take [`Self::Staged`]):
    /// blocks of 64 rows by 128 columns, which read an input once per 128 columns and a weight
    /// once per 64 rows.
    StagedWide,
}

impl GemmTiling {
    /// The tiling [`CudaDevice::gemm`] takes for `m` rows by `n` columns, on tensor cores if
    /// `mma`: one row in `f32` by the row kernel; thin up to [`cfg::GEMM_THIN_MAX_ROWS`] rows;
    /// beyond, where the thin kernels' input reads outgrow their weights, a staged kernel, with
    /// blocks bigger than the thin ones (the `f32` kernel, the wide tensor-core one) only where
    /// its grid still has [`cfg::GEMM_BIG_MIN_BLOCKS`] blocks. A narrow `f32` product of a few
    /// dozen rows stays thin.
    pub fn for_shape(m: usize, n: usize, mma: bool) -> Self {
        let blocks = |s: Option<cfg::Shape>| s.map_or(0, |s| s.grid.0 as usize * s.grid.1 as usize);
        let big = |s| blocks(s) >= cfg::GEMM_BIG_MIN_BLOCKS;
        match (m <= cfg::GEMM_THIN_MAX_ROWS, mma) {
            (true, false) if m == 1 => Self::Row,
            (true, _) => Self::Thin,
            (false, true) if big(cfg::gemm_mma_staged_wide(m, n)) => Self::StagedWide,
            (false, true) => Self::Staged,
            (false, false) if big(cfg::gemm_staged(m, n)) => Self::Staged,
            (false, false) => Self::Thin,
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
            (Weights::Bf16(_), Row) => (KernelId::GemmBf16Row, cfg::gemm_row),
            (Weights::F32(_), Row) => (KernelId::GemmF32Row, cfg::gemm_row),
            (Weights::Bf16(_), Thin) => (KernelId::GemmBf16, cfg::gemm),
            (Weights::F32(_), Thin) => (KernelId::GemmF32, cfg::gemm),
            (Weights::Bf16(_), Staged | StagedWide) => (KernelId::GemmBf16Staged, cfg::gemm_staged),
            (Weights::F32(_), Staged | StagedWide) => (KernelId::GemmF32Staged, cfg::gemm_staged),
            (Weights::Bf16Mma(_), Row | Thin) => (KernelId::GemmBf16Mma, cfg::gemm_mma),
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

#[cfg(test)]
mod tests {
    use super::GemmTiling::{self, *};

    #[test]
    fn tilings_follow_the_rows_and_the_grid() {
        let (lm_head, q_proj) = (151_936, 1024);
        // A decode step of one sequence: the row kernel in f32, thin on tensor cores.
        assert_eq!(GemmTiling::for_shape(1, q_proj, false), Row);
        assert_eq!(GemmTiling::for_shape(1, lm_head, true), Thin);
        // Up to 8 rows: thin, whatever the width.
        for mma in [false, true] {
            assert_eq!(GemmTiling::for_shape(2, lm_head, mma), Thin);
            assert_eq!(GemmTiling::for_shape(8, q_proj, mma), Thin);
        }
        // f32: staged where its 16-row blocks still number 264 or more, else thin.
        assert_eq!(GemmTiling::for_shape(9, lm_head, false), Staged);
        assert_eq!(GemmTiling::for_shape(64, q_proj, false), Thin);
        assert_eq!(GemmTiling::for_shape(512, q_proj, false), Staged);
        // Tensor cores: staged beyond 8 rows, wide where its 64 x 128 blocks fill the device.
        assert_eq!(GemmTiling::for_shape(64, lm_head, true), StagedWide);
        assert_eq!(GemmTiling::for_shape(64, q_proj, true), Staged);
        assert_eq!(GemmTiling::for_shape(2048, q_proj, true), Staged);
        assert_eq!(GemmTiling::for_shape(4096, q_proj, true), StagedWide);
    }
}
