//! Embedding, norms, rotary embedding and the element-wise activations.

use super::{Weights, fits, int, launch, shape};
use crate::{
    BackendError,
    cuda::{CudaDevice, DevSlice, KernelId, launch as cfg},
};

impl CudaDevice {
    /// `out[t] = table[ids[t]] * scale` for `num_tokens` tokens (`embed_gather_bf16`, or
    /// `embed_gather_f32` for an f32 table; a gather has no products, so a bf16 table's arithmetic
    /// does not matter).
    pub fn embed_gather(
        &self,
        table: Weights<'_>,
        ids: DevSlice<'_, u32>,
        out: DevSlice<'_, f32>,
        num_tokens: usize,
        hidden: usize,
        scale: f32,
    ) -> Result<(), BackendError> {
        let id =
            table.kernel([KernelId::EmbedGather, KernelId::EmbedGather, KernelId::EmbedGatherF32]);
        table.fits(id, "table", hidden)?;
        fits(id, "ids", &ids, num_tokens)?;
        fits(id, "out", &out, num_tokens * hidden)?;
        let (table, ids, out, hidden) =
            (table.addr(), ids.addr(), out.addr(), int(id, "hidden", hidden)?);
        launch!(
            self,
            id,
            shape(id, cfg::per_token(hidden as usize, num_tokens))?,
            [table, ids, out, hidden, scale]
        )
    }

    /// RMSNorm of `num_rows` rows of `width` (rows `stride` apart) into `out`, which may be `x`
    /// itself (the per-head norms of q and k) (`rms_norm_f32`).
    #[allow(clippy::too_many_arguments)] // the kernel's own parameters, each a plain size
    pub fn rms_norm(
        &self,
        x: DevSlice<'_, f32>,
        weight: DevSlice<'_, f32>,
        out: DevSlice<'_, f32>,
        num_rows: usize,
        width: usize,
        stride: usize,
        eps: f32,
    ) -> Result<(), BackendError> {
        let id = KernelId::RmsNorm;
        if stride < width {
            return Err(super::bad(id, "rows overlap (stride < width)"));
        }
        let need = (num_rows.saturating_sub(1)) * stride + width;
        fits(id, "x", &x, need)?;
        fits(id, "out", &out, need)?;
        fits(id, "weight", &weight, width)?;
        let (x, weight, out) = (x.addr(), weight.addr(), out.addr());
        let (rows, width, stride) =
            (int(id, "rows", num_rows)?, int(id, "width", width)?, int(id, "stride", stride)?);
        launch!(
            self,
            id,
            shape(id, cfg::norm(num_rows))?,
            [x, weight, out, rows, width, stride, eps]
        )
    }

    /// `x += scale * branch`, then `normed = rms_norm(x)`, for `num_rows` rows of `width`
    /// (`add_rms_norm_f32`).
    #[allow(clippy::too_many_arguments)] // the kernel's own parameters, each a plain size
    pub fn add_rms_norm(
        &self,
        x: DevSlice<'_, f32>,
        branch: DevSlice<'_, f32>,
        weight: DevSlice<'_, f32>,
        normed: DevSlice<'_, f32>,
        num_rows: usize,
        width: usize,
        scale: f32,
        eps: f32,
    ) -> Result<(), BackendError> {
        let id = KernelId::AddRmsNorm;
        for (what, s) in [("x", &x), ("branch", &branch), ("normed", &normed)] {
            fits(id, what, s, num_rows * width)?;
        }
        fits(id, "weight", &weight, width)?;
        let (x, branch, weight, normed) = (x.addr(), branch.addr(), weight.addr(), normed.addr());
        let (rows, width) = (int(id, "rows", num_rows)?, int(id, "width", width)?);
        launch!(
            self,
            id,
            shape(id, cfg::norm(num_rows))?,
            [x, branch, weight, normed, rows, width, scale, eps]
        )
    }

    /// `a[i] *= silu(g[i])` over `n` elements (`silu_mul_f32`).
    pub fn silu_mul(
        &self,
        a: DevSlice<'_, f32>,
        g: DevSlice<'_, f32>,
        n: usize,
    ) -> Result<(), BackendError> {
        let id = KernelId::SiluMul;
        fits(id, "a", &a, n)?;
        fits(id, "g", &g, n)?;
        let (a, g, n64) = (a.addr(), g.addr(), n as u64);
        launch!(self, id, shape(id, cfg::elementwise(n))?, [a, g, n64])
    }

    /// `a[i] = max(a[i], 0)^2` over `n` elements (`relu2_f32`).
    pub fn relu2(&self, a: DevSlice<'_, f32>, n: usize) -> Result<(), BackendError> {
        let id = KernelId::Relu2;
        fits(id, "a", &a, n)?;
        let (a, n64) = (a.addr(), n as u64);
        launch!(self, id, shape(id, cfg::elementwise(n))?, [a, n64])
    }

    /// `a[i] *= s` over `n` elements (`scale_f32`).
    pub fn scale(&self, a: DevSlice<'_, f32>, s: f32, n: usize) -> Result<(), BackendError> {
        let id = KernelId::Scale;
        fits(id, "a", &a, n)?;
        let (a, n64) = (a.addr(), n as u64);
        launch!(self, id, shape(id, cfg::elementwise(n))?, [a, s, n64])
    }
}
