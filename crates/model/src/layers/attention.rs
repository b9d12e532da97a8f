//! Grouped-query self-attention over the paged KV cache, with optional RoPE and q/k norms.
//!
//! A query reduces over its keys in absolute position order, reading earlier chunks' keys from the
//! cache, so its output does not depend on how the prompt was chunked or batched.

use super::StepTokens;
use crate::{batch::SeqInput, config::AttentionConfig, kv::KvCache};
use rayon::prelude::*;
use routed_backend::cpu::{self, Matrix};

pub(crate) struct Attention {
    pub cfg: AttentionConfig,
    /// Index of this layer's tensors in the KV cache.
    pub kv_index: usize,
    pub q_proj: Matrix,
    pub k_proj: Matrix,
    pub v_proj: Matrix,
    pub o_proj: Matrix,
    pub q_norm: Option<Vec<f32>>,
    pub k_norm: Option<Vec<f32>>,
    pub norm_eps: f32,
}

impl Attention {
    pub fn forward(
        &self,
        h: &[f32],
        tokens: &StepTokens,
        seqs: &[SeqInput<'_>],
        kv: &mut KvCache,
        out: &mut [f32],
    ) {
        let cfg = &self.cfg;
        let n = tokens.positions.len();
        let (hd, nh, nkv) = (cfg.head_dim, cfg.num_heads, cfg.num_kv_heads);
        let mut q = vec![0.0; n * nh * hd];
        let mut k = vec![0.0; n * nkv * hd];
        let mut v = vec![0.0; n * nkv * hd];
        cpu::linear(h, &self.q_proj, &mut q);
        cpu::linear(h, &self.k_proj, &mut k);
        cpu::linear(h, &self.v_proj, &mut v);
        if let (Some(qn), Some(kn)) = (&self.q_norm, &self.k_norm) {
            cpu::rms_norm_inplace(&mut q, qn, self.norm_eps);
            cpu::rms_norm_inplace(&mut k, kn, self.norm_eps);
        }
        if let Some(theta) = cfg.rope_theta {
            apply_rope(&mut q, hd, &tokens.positions, theta);
            apply_rope(&mut k, hd, &tokens.positions, theta);
        }
        // Every key and value of the step is written before any query reads, so a chunk's
        // queries see their own chunk's keys.
        let width = kv.slot_width();
        let layer = &mut kv.layers[self.kv_index];
        for (t, &slot) in tokens.slots.iter().enumerate() {
            layer.k[slot * width..(slot + 1) * width]
                .copy_from_slice(&k[t * width..(t + 1) * width]);
            layer.v[slot * width..(slot + 1) * width]
                .copy_from_slice(&v[t * width..(t + 1) * width]);
        }
        let mut heads = vec![0.0; n * nh * hd];
        let kv_ro: &KvCache = kv;
        let attend = |scores: &mut Vec<f32>, (t, o): (usize, &mut [f32])| {
            let seq = &seqs[tokens.seq_of[t]];
            self.attend_one(
                &q[t * nh * hd..(t + 1) * nh * hd],
                tokens.positions[t],
                seq,
                kv_ro,
                scores,
                o,
            );
        };
        if n * nh > 8 {
            heads.par_chunks_mut(nh * hd).enumerate().for_each_init(Vec::new, attend);
        } else {
            let mut scores = Vec::new();
            heads.chunks_mut(nh * hd).enumerate().for_each(|x| attend(&mut scores, x));
        }
        cpu::linear(&heads, &self.o_proj, out);
    }

    /// All heads of one query at `pos`, over keys at positions `[first, pos]` of its sequence.
    fn attend_one(
        &self,
        q: &[f32],
        pos: usize,
        seq: &SeqInput<'_>,
        kv: &KvCache,
        scores: &mut Vec<f32>,
        out: &mut [f32],
    ) {
        let cfg = &self.cfg;
        let (hd, nkv) = (cfg.head_dim, cfg.num_kv_heads);
        let group = cfg.num_heads / nkv;
        let first = cfg.sliding_window.map_or(0, |w| (pos + 1).saturating_sub(w));
        let layer = &kv.layers[self.kv_index];
        let width = kv.slot_width();
        for (head, o) in out.chunks_exact_mut(hd).enumerate() {
            let kvh = head / group;
            let qh = &q[head * hd..(head + 1) * hd];
            scores.clear();
            let mut max = f32::NEG_INFINITY;
            for p in first..=pos {
                let at = kv.slot(seq.block_table, p) * width + kvh * hd;
                let s = cpu::dot(qh, &layer.k[at..at + hd]) * cfg.scale;
                max = max.max(s);
                scores.push(s);
            }
            let mut sum = 0.0f32;
            for s in scores.iter_mut() {
                *s = (*s - max).exp();
                sum += *s;
            }
            o.fill(0.0);
            for (p, &w) in (first..=pos).zip(scores.iter()) {
                let at = kv.slot(seq.block_table, p) * width + kvh * hd;
                let wp = w / sum;
                for (acc, &val) in o.iter_mut().zip(&layer.v[at..at + hd]) {
                    *acc += wp * val;
                }
            }
        }
    }
}

/// Rotary embedding in the "rotate half" layout: dims `i` and `i + d/2` form a pair.
fn apply_rope(x: &mut [f32], head_dim: usize, positions: &[usize], theta: f32) {
    let half = head_dim / 2;
    let inv_freq: Vec<f32> =
        (0..half).map(|i| 1.0 / theta.powf((2 * i) as f32 / head_dim as f32)).collect();
    let per_token = x.len() / positions.len();
    for (row, &pos) in x.chunks_exact_mut(per_token).zip(positions) {
        for head in row.chunks_exact_mut(head_dim) {
            for (i, &f) in inv_freq.iter().enumerate() {
                let angle = pos as f32 * f;
                let (sin, cos) = angle.sin_cos();
                let (a, b) = (head[i], head[i + half]);
                head[i] = a * cos - b * sin;
                head[i + half] = b * cos + a * sin;
            }
        }
    }
}
