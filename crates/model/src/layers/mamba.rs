//! The Mamba2 mixer: in_proj, causal depthwise conv1d, the selective state-space update, gated
//! RMSNorm and out_proj.
//!
//! The state is advanced one token at a time, so the state after any position is available
//! exactly (for snapshots) and is the same however the prompt was chunked: a chunk simply resumes
//! from the live state the previous chunk left. A prompt shorter than the conv window works
//! because the conv state starts as zeros, which is the causal zero padding.

use super::StepTokens;
use crate::{
    batch::SeqInput,
    config::MambaConfig,
    state::StateCache,
    workspace::{MambaWork, zeroed},
};
use routed_backend::cpu::{self, Matrix};

pub(crate) struct Mamba {
    pub cfg: MambaConfig,
    /// Index among the model's Mamba layers (its place in a state slot).
    pub index: usize,
    /// `[2 * d_inner + conv_dim + heads, hidden]`: z, then x|B|C, then dt.
    pub in_proj: Matrix,
    /// `[conv_kernel, conv_dim]` (transposed from the checkpoint's `[conv_dim, 1, conv_kernel]`).
    pub conv_weight_t: Vec<f32>,
    pub conv_bias: Option<Vec<f32>>,
    pub dt_bias: Vec<f32>,
    /// `-exp(A_log)`, per head.
    pub a: Vec<f32>,
    pub d: Vec<f32>,
    /// Gated RMSNorm weight, `[d_inner]`, normalised in `norm_groups` groups.
    pub norm: Vec<f32>,
    pub norm_groups: usize,
    /// `[hidden, d_inner]`.
    pub out_proj: Matrix,
}

impl Mamba {
    pub fn forward(
        &self,
        h: &[f32],
        tokens: &StepTokens,
        seqs: &[SeqInput<'_>],
        states: &mut StateCache,
        out: &mut [f32],
        work: &mut MambaWork,
    ) {
        let cfg = &self.cfg;
        let n = tokens.positions.len();
        let d_inner = cfg.d_inner();
        let proj_dim = self.in_proj.rows();
        let proj = zeroed(&mut work.proj, n * proj_dim);
        cpu::linear(h, &self.in_proj, proj);
        let y = zeroed(&mut work.y, n * d_inner);
        let xbc = zeroed(&mut work.xbc, cfg.conv_dim());
        let dtb = zeroed(&mut work.dtb, cfg.state_size);
        for (seq, range) in seqs.iter().zip(&tokens.seq_ranges) {
            let io = seq.state.expect("hybrid sequences carry state (checked by the model)");
            let snapshot_at =
                |pos: usize| io.snapshots.iter().filter(move |(p, _)| *p == pos).map(|(_, s)| *s);
            for slot in snapshot_at(seq.num_computed_tokens) {
                states.snapshot_layer(io.live, self.index, slot);
            }
            for t in range.clone() {
                let pos = tokens.positions[t];
                let (conv, ssm) = states.live_layer_mut(io.live, self.index);
                let prompt = pos < seq.num_prompt_tokens;
                let row = &proj[t * proj_dim..(t + 1) * proj_dim];
                let y = &mut y[t * d_inner..(t + 1) * d_inner];
                self.step(row, prompt, conv, ssm, xbc, dtb, y);
                for slot in snapshot_at(pos + 1) {
                    states.snapshot_layer(io.live, self.index, slot);
                }
            }
        }
        self.gated_norm(proj, proj_dim, y);
        cpu::linear(y, &self.out_proj, out);
    }

    /// Advances the state by one token and writes its SSM output `y` (before the gated norm).
    ///
    /// The conv state is `[conv_kernel - 1, conv_dim]` and each head's SSM state is
    /// `[state_size, head_dim]`, so the backend kernels run across channels.
    #[allow(clippy::too_many_arguments)]
    fn step(
        &self,
        proj: &[f32],
        prompt: bool,
        conv: &mut [f32],
        ssm: &mut [f32],
        xbc: &mut [f32],
        dtb: &mut [f32],
        y: &mut [f32],
    ) {
        let cfg = &self.cfg;
        let (d_inner, conv_dim) = (cfg.d_inner(), cfg.conv_dim());
        let input = &proj[d_inner..d_inner + conv_dim];
        let dt_raw = &proj[d_inner + conv_dim..];
        cpu::conv_step(conv, &self.conv_weight_t, self.conv_bias.as_deref(), input, xbc);
        cpu::silu_inplace(xbc);
        let (x, bc) = xbc.split_at(d_inner);
        let gn = cfg.num_groups * cfg.state_size;
        let (b, c) = bc.split_at(gn);
        let heads_per_group = cfg.num_heads / cfg.num_groups;
        let (hd, ns) = (cfg.head_dim, cfg.state_size);
        for head in 0..cfg.num_heads {
            let mut dt = cpu::softplus(dt_raw[head] + self.dt_bias[head]);
            if prompt {
                dt = dt.clamp(
                    cfg.dt_min_prompt.unwrap_or(f32::NEG_INFINITY),
                    cfg.dt_max_prompt.unwrap_or(f32::INFINITY),
                );
            }
            let decay = (dt * self.a[head]).exp();
            let g = head / heads_per_group;
            let (bg, cg) = (&b[g * ns..(g + 1) * ns], &c[g * ns..(g + 1) * ns]);
            dtb.iter_mut().zip(bg).for_each(|(o, &bv)| *o = dt * bv);
            cpu::ssm_step(
                &mut ssm[head * hd * ns..(head + 1) * hd * ns],
                &x[head * hd..(head + 1) * hd],
                dtb,
                cg,
                decay,
                self.d[head],
                &mut y[head * hd..(head + 1) * hd],
            );
        }
    }

    /// `y = RMSNorm(y * silu(z))` per group of channels, times the norm weight.
    fn gated_norm(&self, proj: &[f32], proj_dim: usize, y: &mut [f32]) {
        let d_inner = self.cfg.d_inner();
        let group = d_inner / self.norm_groups;
        for (t, row) in y.chunks_exact_mut(d_inner).enumerate() {
            let z = &proj[t * proj_dim..t * proj_dim + d_inner];
            cpu::mul_silu_inplace(row, z);
            for (chunk, w) in row.chunks_exact_mut(group).zip(self.norm.chunks_exact(group)) {
                cpu::rms_norm_inplace(chunk, w, self.cfg.norm_eps);
            }
        }
    }
}
