//! The Mamba2 kernels: conv1d, the selective scan, the gated norm.

use super::{addr_or_null, bad, fits, int, launch, shape};
use crate::{
    BackendError,
    cuda::{CudaDevice, DevSlice, KernelId, launch as cfg},
};
use cudarc::driver::DeviceRepr;

/// The step's sequences as the Mamba kernels read them (the kernels' `SsmSeqs`).
#[derive(Clone, Copy, Debug)]
pub struct MambaSeqs<'a> {
    /// Token offset of each sequence, `[num_seqs + 1]`.
    pub seq_starts: DevSlice<'a, i32>,
    /// `[num_tokens]`.
    pub positions: DevSlice<'a, i32>,
    /// Live state slot of each sequence, `[num_seqs]`.
    pub live_slots: DevSlice<'a, i32>,
    /// Offsets into `taps` per sequence, `[num_seqs + 1]`.
    pub tap_starts: DevSlice<'a, i32>,
    /// `(position, snapshot slot)`: store the state after that many tokens, `[num_taps, 2]`.
    pub taps: DevSlice<'a, i32>,
    /// Sequences in the step.
    pub num_seqs: usize,
    /// Tokens in the step.
    pub num_tokens: usize,
}

/// The kernels' `SsmSeqs`: five device pointers.
#[repr(C)]
#[derive(Clone, Copy)]
struct SeqsArg([u64; 5]);

// SAFETY: `repr(C)` plain addresses, laid out as the kernels' struct of five pointers.
unsafe impl DeviceRepr for SeqsArg {}

impl MambaSeqs<'_> {
    fn check(&self, id: KernelId) -> Result<SeqsArg, BackendError> {
        fits(id, "seq_starts", &self.seq_starts, self.num_seqs + 1)?;
        fits(id, "positions", &self.positions, self.num_tokens)?;
        fits(id, "live_slots", &self.live_slots, self.num_seqs)?;
        fits(id, "tap_starts", &self.tap_starts, self.num_seqs + 1)?;
        Ok(SeqsArg([
            self.seq_starts.addr(),
            self.positions.addr(),
            self.live_slots.addr(),
            self.tap_starts.addr(),
            self.taps.addr(),
        ]))
    }
}

/// The shape of a conv1d launch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConvParams {
    /// in_proj output width.
    pub proj_dim: usize,
    /// Column of x|B|C in the in_proj output (`d_inner`).
    pub xbc_offset: usize,
    /// x|B|C width.
    pub conv_dim: usize,
    /// Kernel width, at most [`cfg::CONV_MAX_KERNEL`].
    pub conv_kernel: usize,
    /// Floats per state slot.
    pub slot_len: usize,
    /// This layer's conv state within a slot.
    pub conv_offset: usize,
}

/// The shape of a scan launch (the kernels' `ScanShape`).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ScanParams {
    /// in_proj output width.
    pub proj_dim: i32,
    /// Column of head 0's dt in the in_proj output.
    pub dt_offset: i32,
    /// x|B|C width.
    pub conv_dim: i32,
    /// SSM heads.
    pub num_heads: i32,
    /// Channels per head.
    pub head_dim: i32,
    /// Groups sharing B and C.
    pub num_groups: i32,
    /// State entries per channel.
    pub state_size: i32,
    /// Floats per state slot.
    pub slot_len: i32,
    /// This layer's SSM state within a slot.
    pub ssm_offset: i32,
    /// Lower dt clamp at prompt positions (`f32::NEG_INFINITY`: none).
    pub dt_min: f32,
    /// Upper dt clamp at prompt positions (`f32::INFINITY`: none).
    pub dt_max: f32,
}

// SAFETY: `repr(C)` of 4-byte fields, the kernels' `ScanShape`.
unsafe impl DeviceRepr for ScanParams {}

/// The per-head parameters of a scan.
#[derive(Clone, Copy, Debug)]
pub struct ScanWeights<'a> {
    /// `[num_heads]`.
    pub dt_bias: DevSlice<'a, f32>,
    /// `-exp(A_log)`, `[num_heads]`.
    pub a: DevSlice<'a, f32>,
    /// `[num_heads]`.
    pub d: DevSlice<'a, f32>,
}

impl CudaDevice {
    /// The conv1d over x|B|C of every token, then SiLU, into `xbc` `[num_tokens, conv_dim]`,
    /// advancing each sequence's conv state and storing it at the snapshot taps
    /// (`mamba_conv1d`).
    #[allow(clippy::too_many_arguments)] // the kernel's own buffers
    pub fn mamba_conv1d(
        &self,
        p: &ConvParams,
        proj: DevSlice<'_, f32>,
        weight_t: DevSlice<'_, f32>,
        bias: Option<DevSlice<'_, f32>>,
        (live, snapshots): (DevSlice<'_, f32>, DevSlice<'_, f32>),
        seqs: &MambaSeqs<'_>,
        xbc: DevSlice<'_, f32>,
    ) -> Result<(), BackendError> {
        let id = KernelId::MambaConv1d;
        if p.conv_kernel == 0 || p.conv_kernel > cfg::CONV_MAX_KERNEL {
            return Err(bad(
                id,
                format!("conv_kernel {} over {}", p.conv_kernel, cfg::CONV_MAX_KERNEL),
            ));
        }
        if p.xbc_offset + p.conv_dim > p.proj_dim
            || p.conv_offset + (p.conv_kernel - 1) * p.conv_dim > p.slot_len
        {
            return Err(bad(id, "x|B|C or the conv state lies outside its row"));
        }
        let sq = seqs.check(id)?;
        fits(id, "proj", &proj, seqs.num_tokens * p.proj_dim)?;
        fits(id, "weight_t", &weight_t, p.conv_kernel * p.conv_dim)?;
        fits(id, "xbc", &xbc, seqs.num_tokens * p.conv_dim)?;
        if let Some(b) = &bias {
            fits(id, "bias", b, p.conv_dim)?;
        }
        let sh = shape(id, cfg::conv1d(p.conv_dim, seqs.num_seqs))?;
        let (proj, w, bias, live, snaps, xbc) = (
            proj.addr(),
            weight_t.addr(),
            addr_or_null(bias),
            live.addr(),
            snapshots.addr(),
            xbc.addr(),
        );
        let proj_dim = int(id, "proj_dim", p.proj_dim)?;
        let xbc_offset = p.xbc_offset as i32;
        let conv_dim = int(id, "conv_dim", p.conv_dim)?;
        let kernel = p.conv_kernel as i32;
        let slot_len = int(id, "slot_len", p.slot_len)?;
        let conv_offset = p.conv_offset as i32;
        launch!(
            self,
            id,
            sh,
            [
                proj,
                w,
                bias,
                live,
                snaps,
                sq,
                xbc,
                proj_dim,
                xbc_offset,
                conv_dim,
                kernel,
                slot_len,
                conv_offset,
            ]
        )
    }

    /// The selective scan of every head of every sequence over the step's tokens, into `y`
    /// `[num_tokens, num_heads * head_dim]`, advancing the SSM state and storing it at the taps
    /// (`mamba_scan`). `num_prompt[s]` is sequence `s`'s prompt length (the dt clamp).
    #[allow(clippy::too_many_arguments)] // the kernel's own buffers
    pub fn mamba_scan(
        &self,
        p: &ScanParams,
        w: &ScanWeights<'_>,
        (xbc, proj): (DevSlice<'_, f32>, DevSlice<'_, f32>),
        num_prompt: DevSlice<'_, i32>,
        (live, snapshots): (DevSlice<'_, f32>, DevSlice<'_, f32>),
        seqs: &MambaSeqs<'_>,
        y: DevSlice<'_, f32>,
    ) -> Result<(), BackendError> {
        let id = KernelId::MambaScan;
        let dims = [p.proj_dim, p.conv_dim, p.num_heads, p.head_dim, p.num_groups, p.state_size];
        if dims.iter().any(|&d| d <= 0) || p.num_heads % p.num_groups != 0 {
            return Err(bad(id, "sizes must be positive and heads a multiple of groups"));
        }
        let (heads, hd, ns) = (p.num_heads as usize, p.head_dim as usize, p.state_size as usize);
        let d_inner = heads * hd;
        if d_inner + 2 * p.num_groups as usize * ns > p.conv_dim as usize
            || p.dt_offset as usize + heads > p.proj_dim as usize
            || p.ssm_offset as usize + heads * hd * ns > p.slot_len as usize
        {
            return Err(bad(id, "x|B|C, dt or the SSM state lies outside its row"));
        }
        let sq = seqs.check(id)?;
        fits(id, "xbc", &xbc, seqs.num_tokens * p.conv_dim as usize)?;
        fits(id, "proj", &proj, seqs.num_tokens * p.proj_dim as usize)?;
        fits(id, "y", &y, seqs.num_tokens * d_inner)?;
        fits(id, "num_prompt", &num_prompt, seqs.num_seqs)?;
        for (what, s) in [("dt_bias", &w.dt_bias), ("a", &w.a), ("d", &w.d)] {
            fits(id, what, s, heads)?;
        }
        let sh = shape(id, cfg::scan(heads, seqs.num_seqs, hd, ns))?;
        let (xbc, proj, dt_bias, a, d, num_prompt, live, snaps, y) = (
            xbc.addr(),
            proj.addr(),
            w.dt_bias.addr(),
            w.a.addr(),
            w.d.addr(),
            num_prompt.addr(),
            live.addr(),
            snapshots.addr(),
            y.addr(),
        );
        let params = *p;
        launch!(self, id, sh, [xbc, proj, dt_bias, a, d, num_prompt, live, snaps, sq, y, params])
    }

    /// Mamba2's gated RMSNorm in place on `y` `[num_tokens, d_inner]`, gate `z` in the first
    /// `d_inner` columns of `proj` (`mamba_gated_norm`).
    #[allow(clippy::too_many_arguments)] // the kernel's own parameters
    pub fn mamba_gated_norm(
        &self,
        y: DevSlice<'_, f32>,
        proj: DevSlice<'_, f32>,
        weight: DevSlice<'_, f32>,
        num_tokens: usize,
        (d_inner, proj_dim): (usize, usize),
        group_size: usize,
        eps: f32,
    ) -> Result<(), BackendError> {
        let id = KernelId::MambaGatedNorm;
        if group_size == 0 || d_inner % group_size != 0 || proj_dim < d_inner {
            return Err(bad(id, format!("groups of {group_size} over {d_inner} channels")));
        }
        fits(id, "y", &y, num_tokens * d_inner)?;
        fits(id, "proj", &proj, num_tokens * proj_dim)?;
        fits(id, "weight", &weight, d_inner)?;
        let sh = shape(id, cfg::norm(num_tokens * (d_inner / group_size)))?;
        let (y, proj, weight) = (y.addr(), proj.addr(), weight.addr());
        let (n, d_inner, proj_dim, group) = (
            int(id, "tokens", num_tokens)?,
            int(id, "d_inner", d_inner)?,
            int(id, "proj_dim", proj_dim)?,
            int(id, "group_size", group_size)?,
        );
        launch!(self, id, sh, [y, proj, weight, n, d_inner, proj_dim, group, eps])
    }
}
