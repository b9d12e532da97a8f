//! A mixture-of-experts block with router capture.
//!
//! Tokens are grouped by expert so each expert runs one matrix product over its tokens; every row
//! of that product is computed exactly as it would be alone (see the backend's determinism rule),
//! and a token's expert outputs are combined in rank order, so a token's result does not depend on
//! the rest of the batch.
//!
//! Under expert parallelism a rank holds a contiguous slice of the experts. Sorting pairs by
//! expert puts each rank's rows in one contiguous range, so after every rank has run its own
//! experts one all-gather fills in the rest, and every rank combines exactly the rows a single
//! rank would have computed, in the same order: the result is bitwise the same for any number of
//! ranks.

use super::{
    mlp::Mlp,
    router::{RouterScratch, route},
};
use crate::{
    config::MoeConfig,
    error::Result,
    workspace::{MoeWork, zeroed},
};
use rayon::prelude::*;
use routed_backend::collective::Collective;
use routed_backend::cpu::{self, Matrix};
use std::ops::Range;

pub(crate) struct Moe {
    pub cfg: MoeConfig,
    /// `[num_experts, hidden]`.
    pub router: Matrix,
    /// Selection-only bias (Nemotron-H's `e_score_correction_bias`).
    pub router_bias: Option<Vec<f32>>,
    /// The experts this rank holds (all of them on a single rank).
    pub local: Range<usize>,
    /// Expert `local.start + i` is `experts[i]`.
    pub experts: Vec<Mlp>,
    pub shared: Option<Mlp>,
    pub hidden: usize,
}

impl Moe {
    /// Applies the block to `x` (`[n, hidden]`) into `out`, writing each token's expert ids
    /// (`[n, top_k]`, canonical order) into `routing`. Every rank of `ranks` calls this with the
    /// same `x`; the other ranks' expert outputs arrive through it.
    pub fn forward(
        &self,
        x: &[f32],
        out: &mut [f32],
        routing: &mut [i16],
        work: &mut MoeWork,
        ranks: &dyn Collective,
    ) -> Result<()> {
        let n = x.len() / self.hidden;
        self.route(x, routing, work);
        sort_by_expert(work, self.cfg.num_experts, self.cfg.top_k);
        self.run_local_experts(x, n, work);
        if ranks.world_size() > 1 {
            // Rank r's experts are one contiguous run of sorted rows.
            let (h, starts) = (self.hidden, &work.starts);
            let per_rank = self.cfg.num_experts / ranks.world_size();
            work.segments.clear();
            work.segments.extend(
                (0..ranks.world_size())
                    .map(|r| starts[r * per_rank] * h..starts[(r + 1) * per_rank] * h),
            );
            ranks.all_gather(&mut work.sorted_out, &work.segments)?;
        }
        self.combine(out, work);
        if let Some(shared) = &self.shared {
            let s = zeroed(&mut work.shared_out, n * self.hidden);
            shared.forward(x, s, &mut work.mlp);
            cpu::add_assign(out, s);
        }
        Ok(())
    }

    /// Router logits, then each token's experts and weights (`work.ids`, `work.weights`), the ids
    /// also into `routing`.
    fn route(&self, x: &[f32], routing: &mut [i16], work: &mut MoeWork) {
        let (k, num_experts) = (self.cfg.top_k, self.cfg.num_experts);
        let n = x.len() / self.hidden;
        let logits = zeroed(&mut work.logits, n * num_experts);
        cpu::linear(x, &self.router, logits);
        let ids = zeroed(&mut work.ids, n * k);
        let weights = zeroed(&mut work.weights, n * k);
        let bias = self.router_bias.as_deref();
        logits
            .par_chunks_exact(num_experts)
            .zip(ids.par_chunks_exact_mut(k).zip(weights.par_chunks_exact_mut(k)))
            .for_each(|(l, (i, w))| {
                RouterScratch::with(|scratch| route(&self.cfg.router, l, bias, scratch, i, w))
            });
        for (r, &e) in routing.iter_mut().zip(ids.iter()) {
            *r = e as i16;
        }
    }

    /// Runs every expert of this rank that has rows, one task each over its rows, into its range
    /// of `work.sorted_out`.
    fn run_local_experts(&self, x: &[f32], n: usize, work: &mut MoeWork) {
        let (h, k, num_experts) = (self.hidden, self.cfg.top_k, self.cfg.num_experts);
        let inter = self.experts.first().map_or(0, |m| m.inter);
        let gated = self.experts.first().is_some_and(|m| m.gate.is_some());
        let sorted_out = zeroed(&mut work.sorted_out, n * k * h);
        let up = zeroed(&mut work.mlp.up, n * k * inter);
        let gate = zeroed(&mut work.mlp.gate, if gated { n * k * inter } else { 0 });
        let (order, starts) = (&work.order, &work.starts);
        let mut tasks = Vec::with_capacity(num_experts);
        let (mut out_rest, mut up_rest, mut gate_rest) = (sorted_out, up, gate);
        for e in 0..num_experts {
            let rows = starts[e + 1] - starts[e];
            let (o, o_tail) = out_rest.split_at_mut(rows * h);
            let (u, u_tail) = up_rest.split_at_mut(rows * inter);
            let (g, g_tail) = gate_rest.split_at_mut(if gated { rows * inter } else { 0 });
            if rows > 0 && self.local.contains(&e) {
                tasks.push((e, o, u, g));
            }
            (out_rest, up_rest, gate_rest) = (o_tail, u_tail, g_tail);
        }
        tasks.par_iter_mut().for_each(|(e, y, up, gate)| {
            let rows = &order[starts[*e]..starts[*e + 1]];
            self.experts[*e - self.local.start].forward_rows_serial(x, rows, y, up, gate);
        });
    }

    /// Each token's output: its experts' rows weighted in rank order, tokens in parallel.
    fn combine(&self, out: &mut [f32], work: &MoeWork) {
        let (h, k) = (self.hidden, self.cfg.top_k);
        let (sorted_out, weights, slot_of) = (&work.sorted_out, &work.weights, &work.slot_of);
        out.par_chunks_exact_mut(h).enumerate().for_each(|(t, o)| {
            o.fill(0.0);
            for j in 0..k {
                let w = weights[t * k + j];
                let at = slot_of[t * k + j] * h;
                o.iter_mut().zip(&sorted_out[at..at + h]).for_each(|(a, b)| *a += w * b);
            }
        });
    }
}

/// Counting-sorts the (token, rank) pairs of `work.ids` by expert, so that each expert runs one
/// product over its rows: `starts[e]..starts[e + 1]` are expert `e`'s sorted rows, `order[row]`
/// the token of a sorted row, and `slot_of[pair]` the sorted row of a pair's output.
fn sort_by_expert(work: &mut MoeWork, num_experts: usize, k: usize) {
    let ids = &work.ids;
    let starts = zeroed(&mut work.starts, num_experts + 1);
    for &e in ids.iter() {
        starts[e + 1] += 1;
    }
    for e in 0..num_experts {
        starts[e + 1] += starts[e];
    }
    let fill = zeroed(&mut work.fill, num_experts + 1);
    fill.copy_from_slice(starts);
    let order = zeroed(&mut work.order, ids.len());
    let slot_of = zeroed(&mut work.slot_of, ids.len());
    for (pair, &e) in ids.iter().enumerate() {
        order[fill[e]] = pair / k;
        slot_of[pair] = fill[e];
        fill[e] += 1;
    }
}
