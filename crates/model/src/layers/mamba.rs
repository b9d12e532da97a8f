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
    workspace::{MambaWork, ScanBuffers, zeroed},
};
use rayon::prelude::*;
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
        for (seq, range) in seqs.iter().zip(&tokens.seq_ranges) {
            let io = seq.state.expect("hybrid sequences carry state (checked by the model)");
            let snapshot_at =
                |pos: usize| io.snapshots.iter().filter(move |(p, _)| *p == pos).map(|(_, s)| *s);
            for slot in snapshot_at(seq.num_computed_tokens) {
                states.snapshot_layer(io.live, self.index, slot);
            }
            // Segments end where a snapshot is due, so each snapshot sees the state after
            // exactly its position.
            let mut start = range.start;
            while start < range.end {
                let mut end = start + 1;
                while end < range.end && snapshot_at(tokens.positions[end - 1] + 1).next().is_none()
                {
                    end += 1;
                }
                let segment = Segment {
                    proj,
                    proj_dim,
                    tokens: start..end,
                    positions: &tokens.positions,
                    num_prompt_tokens: seq.num_prompt_tokens,
                };
                let (conv, ssm) = states.live_layer_mut(io.live, self.index);
                self.scan(&segment, conv, ssm, &mut work.scan, y);
                for slot in snapshot_at(tokens.positions[end - 1] + 1) {
                    states.snapshot_layer(io.live, self.index, slot);
                }
                start = end;
            }
        }
        self.gated_norm(proj, proj_dim, y);
        cpu::linear(y, &self.out_proj, out);
    }

    /// Advances the state over one segment of a sequence's tokens and writes their SSM outputs
    /// (before the gated norm) into `y`.
    ///
    /// The conv runs token by token (its state is shared by every head); then every head scans the
    /// segment on its own slice of the SSM state, heads in parallel. A head's arithmetic is the
    /// same whatever the segment or the thread, so the result is bitwise that of a token-by-token
    /// loop. The conv state is `[conv_kernel - 1, conv_dim]` and each head's SSM state is
    /// `[state_size, head_dim]`, so the backend kernels run across channels.
    fn scan(
        &self,
        seg: &Segment<'_>,
        conv: &mut [f32],
        ssm: &mut [f32],
        work: &mut ScanBuffers,
        y: &mut [f32],
    ) {
        let cfg = &self.cfg;
        let (d_inner, conv_dim) = (cfg.d_inner(), cfg.conv_dim());
        let (hd, ns) = (cfg.head_dim, cfg.state_size);
        let n = seg.tokens.len();
        let xbc = zeroed(&mut work.xbc, n * conv_dim);
        for (t, row) in seg.tokens.clone().zip(xbc.chunks_exact_mut(conv_dim)) {
            let input = &seg.proj[t * seg.proj_dim + d_inner..][..conv_dim];
            cpu::conv_step(conv, &self.conv_weight_t, self.conv_bias.as_deref(), input, row);
        }
        cpu::silu_inplace(xbc);
        let by_head = zeroed(&mut work.by_head, cfg.num_heads * n * hd);
        let dtb = zeroed(&mut work.dtb, cfg.num_heads * ns);
        let xbc = &*xbc;
        let scan = |head: usize, state: &mut [f32], dtb: &mut [f32], out: &mut [f32]| {
            self.scan_head(seg, head, xbc, state, dtb, out)
        };
        let (state_len, out_len) = (hd * ns, n * hd);
        if n >= PARALLEL_SCAN_TOKENS {
            let heads = (
                ssm.par_chunks_exact_mut(state_len),
                dtb.par_chunks_exact_mut(ns),
                by_head.par_chunks_exact_mut(out_len),
            );
            let heads = heads.into_par_iter().enumerate();
            heads.for_each(|(head, (state, dtb, out))| scan(head, state, dtb, out));
        } else {
            let heads = ssm.chunks_exact_mut(state_len).zip(dtb.chunks_exact_mut(ns));
            for (head, ((state, dtb), out)) in
                heads.zip(by_head.chunks_exact_mut(out_len)).enumerate()
            {
                scan(head, state, dtb, out);
            }
        }
        for (head, rows) in by_head.chunks_exact(n * hd).enumerate() {
            for (t, row) in seg.tokens.clone().zip(rows.chunks_exact(hd)) {
                y[t * d_inner + head * hd..][..hd].copy_from_slice(row);
            }
        }
    }

    /// One head's scan over a segment: its outputs `[token][head_dim]` into `out`.
    fn scan_head(
        &self,
        seg: &Segment<'_>,
        head: usize,
        xbc: &[f32],
        state: &mut [f32],
        dtb: &mut [f32],
        out: &mut [f32],
    ) {
        let cfg = &self.cfg;
        let (d_inner, conv_dim) = (cfg.d_inner(), cfg.conv_dim());
        let (hd, ns) = (cfg.head_dim, cfg.state_size);
        let gn = cfg.num_groups * ns;
        let g = head / (cfg.num_heads / cfg.num_groups);
        let rows = xbc.chunks_exact(conv_dim).zip(out.chunks_exact_mut(hd));
        for (t, (row, out)) in seg.tokens.clone().zip(rows) {
            let dt_raw = seg.proj[t * seg.proj_dim + d_inner + conv_dim + head];
            let mut dt = cpu::softplus(dt_raw + self.dt_bias[head]);
            if seg.positions[t] < seg.num_prompt_tokens {
                dt = dt.clamp(
                    cfg.dt_min_prompt.unwrap_or(f32::NEG_INFINITY),
                    cfg.dt_max_prompt.unwrap_or(f32::INFINITY),
                );
            }
            let decay = (dt * self.a[head]).exp();
            let (b, c) = (&row[d_inner + g * ns..][..ns], &row[d_inner + gn + g * ns..][..ns]);
            dtb.iter_mut().zip(b).for_each(|(o, &bv)| *o = dt * bv);
            let x = &row[head * hd..(head + 1) * hd];
            cpu::ssm_step(state, x, dtb, c, decay, self.d[head], out);
        }
    }

    /// `y = RMSNorm(y * silu(z))` per group of channels, times the norm weight.
    fn gated_norm(&self, proj: &[f32], proj_dim: usize, y: &mut [f32]) {
        let d_inner = self.cfg.d_inner();
        let group = d_inner / self.norm_groups;
        y.par_chunks_exact_mut(d_inner).zip(proj.par_chunks_exact(proj_dim)).for_each(
            |(row, p)| {
                cpu::mul_silu_inplace(row, &p[..d_inner]);
                for (chunk, w) in row.chunks_exact_mut(group).zip(self.norm.chunks_exact(group)) {
                    cpu::rms_norm_inplace(chunk, w, self.cfg.norm_eps);
                }
            },
        );
    }
}

/// Segments at least this long scan their heads in parallel; shorter ones (decode steps) are a few
/// microseconds of work, less than a fork costs.
const PARALLEL_SCAN_TOKENS: usize = 4;

/// The tokens `tokens` of one sequence, with the step's in_proj output and positions.
struct Segment<'a> {
    proj: &'a [f32],
    proj_dim: usize,
    tokens: std::ops::Range<usize>,
    positions: &'a [usize],
    num_prompt_tokens: usize,
}
