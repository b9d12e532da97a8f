//! A mixture-of-experts block with router capture.
//!
//! Tokens are grouped by expert so each expert runs one matrix product over its tokens; every row
//! of that product is computed exactly as it would be alone (see the backend's determinism rule),
//! and a token's expert outputs are combined in rank order, so a token's result does not depend on
//! the rest of the batch.

use super::{
    mlp::Mlp,
    router::{RouterScratch, route},
};
use crate::config::MoeConfig;
use rayon::prelude::*;
use routed_backend::cpu::{self, Matrix};

pub(crate) struct Moe {
    pub cfg: MoeConfig,
    /// `[num_experts, hidden]`.
    pub router: Matrix,
    /// Selection-only bias (Nemotron-H's `e_score_correction_bias`).
    pub router_bias: Option<Vec<f32>>,
    pub experts: Vec<Mlp>,
    pub shared: Option<Mlp>,
    pub hidden: usize,
}

impl Moe {
    /// Applies the block to `x` (`[n, hidden]`) into `out`, writing each token's expert ids
    /// (`[n, top_k]`, canonical order) into `routing`.
    pub fn forward(&self, x: &[f32], out: &mut [f32], routing: &mut [i16]) {
        let (h, k, num_experts) = (self.hidden, self.cfg.top_k, self.cfg.num_experts);
        let n = x.len() / h;
        let mut logits = vec![0.0; n * num_experts];
        cpu::linear(x, &self.router, &mut logits);
        let mut ids = vec![0usize; n * k];
        let mut weights = vec![0.0f32; n * k];
        let bias = self.router_bias.as_deref();
        logits
            .par_chunks_exact(num_experts)
            .zip(ids.par_chunks_exact_mut(k).zip(weights.par_chunks_exact_mut(k)))
            .for_each_init(RouterScratch::default, |scratch, (l, (i, w))| {
                route(&self.cfg.router, l, bias, scratch, i, w)
            });
        for (r, &e) in routing.iter_mut().zip(&ids) {
            *r = e as i16;
        }

        // Counting-sort the (token, rank) pairs by expert, then run every expert with work as one
        // task over its rows; its outputs land in its range of `sorted_out`.
        let mut starts = vec![0usize; num_experts + 1];
        for &e in &ids {
            starts[e + 1] += 1;
        }
        for e in 0..num_experts {
            starts[e + 1] += starts[e];
        }
        let mut fill = starts.clone();
        let mut order = vec![0usize; n * k];
        // `slot_of[pair]`: where the pair's output row sits in `sorted_out`.
        let mut slot_of = vec![0usize; n * k];
        for (pair, &e) in ids.iter().enumerate() {
            order[fill[e]] = pair / k;
            slot_of[pair] = fill[e];
            fill[e] += 1;
        }
        let mut sorted_out = vec![0.0f32; n * k * h];
        let mut tasks = Vec::with_capacity(num_experts);
        let mut rest = &mut sorted_out[..];
        for e in 0..num_experts {
            let (mine, tail) = rest.split_at_mut((starts[e + 1] - starts[e]) * h);
            if !mine.is_empty() {
                tasks.push((e, mine));
            }
            rest = tail;
        }
        let order = &order;
        tasks.par_iter_mut().for_each(|(e, y)| {
            let rows = &order[starts[*e]..starts[*e + 1]];
            self.experts[*e].forward_rows_serial(x, rows, y);
        });
        for t in 0..n {
            let o = &mut out[t * h..(t + 1) * h];
            o.fill(0.0);
            for j in 0..k {
                let w = weights[t * k + j];
                let at = slot_of[t * k + j] * h;
                o.iter_mut().zip(&sorted_out[at..at + h]).for_each(|(a, b)| *a += w * b);
            }
        }
        if let Some(shared) = &self.shared {
            let mut s = vec![0.0; n * h];
            shared.forward(x, &mut s);
            cpu::add_assign(out, &s);
        }
    }
}
