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

        // Group (token, rank) pairs by expert, then run each expert over its rows.
        let mut by_expert: Vec<Vec<usize>> = vec![Vec::new(); num_experts];
        for (pair, &e) in ids.iter().enumerate() {
            by_expert[e].push(pair);
        }
        let mut expert_out = vec![0.0f32; n * k * h];
        let results: Vec<(usize, Vec<f32>)> = by_expert
            .par_iter()
            .enumerate()
            .filter(|(_, pairs)| !pairs.is_empty())
            .map(|(e, pairs)| {
                let rows: Vec<usize> = pairs.iter().map(|p| p / k).collect();
                let mut y = vec![0.0; rows.len() * h];
                self.experts[e].forward_rows(x, &rows, &mut y);
                (e, y)
            })
            .collect();
        for (e, y) in results {
            for (&pair, yr) in by_expert[e].iter().zip(y.chunks_exact(h)) {
                expert_out[pair * h..(pair + 1) * h].copy_from_slice(yr);
            }
        }
        for t in 0..n {
            let o = &mut out[t * h..(t + 1) * h];
            o.fill(0.0);
            for j in 0..k {
                let w = weights[t * k + j];
                let y = &expert_out[(t * k + j) * h..(t * k + j + 1) * h];
                o.iter_mut().zip(y).for_each(|(a, b)| *a += w * b);
            }
        }
        if let Some(shared) = &self.shared {
            let mut s = vec![0.0; n * h];
            shared.forward(x, &mut s);
            cpu::add_assign(out, &s);
        }
    }
}
