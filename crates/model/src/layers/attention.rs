//! Grouped-query self-attention over the paged KV cache, with optional RoPE and q/k norms.
//!
//! A query's arithmetic is fixed by its absolute position alone: scores are dot products in the
//! kernels' order, the softmax sums a query's keys from its first one in a fixed lane order, and the
//! values sum gives every key the lane of its position. Earlier chunks' keys come from the cache, so the output does not depend on how
//! the prompt was chunked or batched, nor on whether the query ran in a prompt block (two matrix
//! products) or a decode step (keys and values read in place).

use super::StepTokens;
use crate::{
    batch::SeqInput,
    config::AttentionConfig,
    kv::KvCache,
    workspace::{AttentionWork, zeroed},
};
use rayon::prelude::*;
use routed_backend::cpu::{self, Matrix};
use std::cell::RefCell;

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
        work: &mut AttentionWork,
    ) {
        let cfg = &self.cfg;
        let n = tokens.positions.len();
        let (hd, nh, nkv) = (cfg.head_dim, cfg.num_heads, cfg.num_kv_heads);
        let q = zeroed(&mut work.q, n * nh * hd);
        let k = zeroed(&mut work.k, n * nkv * hd);
        let v = zeroed(&mut work.v, n * nkv * hd);
        cpu::linear(h, &self.q_proj, q);
        cpu::linear(h, &self.k_proj, k);
        cpu::linear(h, &self.v_proj, v);
        if let (Some(qn), Some(kn)) = (&self.q_norm, &self.k_norm) {
            cpu::rms_norm_inplace(q, qn, self.norm_eps);
            cpu::rms_norm_inplace(k, kn, self.norm_eps);
        }
        if let Some(theta) = cfg.rope_theta {
            apply_rope([q, k], hd, &tokens.positions, theta);
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
        // One work item per (sequence, KV head): its group of query heads over its tokens. Item
        // outputs are laid out `[seq][kv head][token][group][head_dim]`, then permuted.
        let group = nh / nkv;
        let by_item = zeroed(&mut work.by_item, n * nh * hd);
        let mut items = Vec::with_capacity(seqs.len() * nkv);
        let mut rest = by_item;
        for (s, range) in tokens.seq_ranges.iter().enumerate() {
            for kvh in 0..nkv {
                let (mine, tail) = rest.split_at_mut(range.len() * group * hd);
                items.push((s, kvh, mine));
                rest = tail;
            }
        }
        let (kv_ro, q): (&KvCache, &[f32]) = (kv, q);
        items.par_iter_mut().for_each(|(s, kvh, out)| {
            let range = tokens.seq_ranges[*s].clone();
            Scratch::with(|scratch| {
                self.attend(q, tokens, range, &seqs[*s], *kvh, kv_ro, scratch, out);
            });
        });
        let heads = zeroed(&mut work.heads, n * nh * hd);
        for (s, kvh, item) in &items {
            let range = tokens.seq_ranges[*s].clone();
            for (t, rows) in range.zip(item.chunks_exact(group * hd)) {
                let at = (t * nh + kvh * group) * hd;
                heads[at..at + group * hd].copy_from_slice(rows);
            }
        }
        cpu::linear(heads, &self.o_proj, out);
    }

    /// The first key position a query at `pos` attends to.
    fn first_key(&self, pos: usize) -> usize {
        self.cfg.sliding_window.map_or(0, |w| (pos + 1).saturating_sub(w))
    }

    /// The query heads of KV head `kvh` for the step tokens `range` (one sequence), into `out`
    /// (`[token][group][head_dim]`), a block of queries at a time.
    ///
    /// Scores are one matrix product of the block's queries with its keys, each query's
    /// probabilities are normalised over exactly its own keys, and the values product gives each key the lane of its absolute
    /// position (keys are laid out from a multiple of [`KEY_ALIGN`], masked keys weigh exactly
    /// zero), so a query's result is the same whatever block, chunk or batch it ran in.
    #[allow(clippy::too_many_arguments)]
    fn attend(
        &self,
        q: &[f32],
        tokens: &StepTokens,
        range: std::ops::Range<usize>,
        seq: &SeqInput<'_>,
        kvh: usize,
        kv: &KvCache,
        scratch: &mut Scratch,
        out: &mut [f32],
    ) {
        let cfg = &self.cfg;
        let (hd, nh) = (cfg.head_dim, cfg.num_heads);
        let group = nh / cfg.num_kv_heads;
        let layer = &kv.layers[self.kv_index];
        let width = kv.slot_width();
        let mut start = range.start;
        while start < range.end {
            let end = (start + QUERY_BLOCK).min(range.end);
            if end - start <= DIRECT_MAX_QUERIES {
                let out = &mut out[(start - range.start) * group * hd..];
                self.attend_direct(q, tokens, start..end, seq, kvh, kv, scratch, out);
                start = end;
                continue;
            }
            let last = tokens.positions[end - 1];
            let base = self.first_key(tokens.positions[start]) / KEY_ALIGN * KEY_ALIGN;
            let nk = last + 1 - base;
            let Scratch { keys, values_t, rows, scores } = scratch;
            keys.clear();
            values_t.resize(hd * nk, 0.0);
            for p in base..=last {
                let at = kv.slot(seq.block_table, p) * width + kvh * hd;
                keys.extend_from_slice(&layer.k[at..at + hd]);
                for (d, &v) in layer.v[at..at + hd].iter().enumerate() {
                    values_t[d * nk + p - base] = v;
                }
            }
            rows.clear();
            rows.extend(
                (start..end).flat_map(|t| (0..group).map(move |g| t * nh + kvh * group + g)),
            );
            scores.resize(rows.len() * nk, 0.0);
            cpu::linear_rows_f32(q, rows, keys, hd, scores);
            for (i, row) in scores.chunks_exact_mut(nk).enumerate() {
                let pos = tokens.positions[start + i / group];
                let (lo, hi) = (self.first_key(pos) - base, pos + 1 - base);
                row[..lo].fill(0.0);
                row[hi..].fill(0.0);
                cpu::softmax_scaled_inplace(&mut row[lo..hi], cfg.scale);
            }
            rows.clear();
            rows.extend(0..(end - start) * group);
            let block_out =
                &mut out[(start - range.start) * group * hd..(end - range.start) * group * hd];
            cpu::linear_rows_f32(scores, rows, values_t, nk, block_out);
            start = end;
        }
    }

    /// [`Self::attend`] for a few queries, reading the paged keys and values where they lie: each
    /// score is the [`cpu::dot`] the scores product computes, and the values sum gives each key
    /// the lane of its position, so the bits are those of the product path.
    #[allow(clippy::too_many_arguments)]
    fn attend_direct(
        &self,
        q: &[f32],
        tokens: &StepTokens,
        block: std::ops::Range<usize>,
        seq: &SeqInput<'_>,
        kvh: usize,
        kv: &KvCache,
        scratch: &mut Scratch,
        out: &mut [f32],
    ) {
        let cfg = &self.cfg;
        let (hd, nh) = (cfg.head_dim, cfg.num_heads);
        let group = nh / cfg.num_kv_heads;
        let layer = &kv.layers[self.kv_index];
        let width = kv.slot_width();
        let at = |p: usize| kv.slot(seq.block_table, p) * width + kvh * hd;
        let Scratch { keys: lanes, scores, .. } = scratch;
        for (i, t) in block.enumerate() {
            let pos = tokens.positions[t];
            let first = self.first_key(pos);
            let nk = pos + 1 - first;
            scores.resize(group * nk, 0.0);
            for p in first..=pos {
                let key = &layer.k[at(p)..at(p) + hd];
                for g in 0..group {
                    let head = kvh * group + g;
                    let qh = &q[(t * nh + head) * hd..(t * nh + head + 1) * hd];
                    scores[g * nk + p - first] = cpu::dot(qh, key);
                }
            }
            for (g, probs) in scores.chunks_exact_mut(nk).enumerate() {
                cpu::softmax_scaled_inplace(probs, cfg.scale);
                let o = &mut out[(i * group + g) * hd..(i * group + g + 1) * hd];
                let value = |j: usize| &layer.v[at(first + j)..at(first + j) + hd];
                cpu::lane_weighted_sum(probs, value, first % KEY_ALIGN, lanes, o);
            }
        }
    }
}

/// Blocks of at most this many queries (decode steps) read keys and values in place instead of
/// gathering them for the two products.
const DIRECT_MAX_QUERIES: usize = 2;

/// Queries per block of the scores product: bounds the scratch and the work spent above the
/// causal diagonal.
const QUERY_BLOCK: usize = 64;

/// Keys are laid out from a position that is a multiple of this (the matrix kernel's lane count),
/// so in the values product a key's lane is its position modulo 16 in every block.
const KEY_ALIGN: usize = 16;

/// Per-thread buffers of [`Attention::attend`], reused across its blocks, and kept on each pool
/// thread across work items, layers and steps, so that a decode step allocates none.
#[derive(Default)]
struct Scratch {
    /// `[keys, head_dim]`.
    keys: Vec<f32>,
    /// `[head_dim, keys]`.
    values_t: Vec<f32>,
    rows: Vec<usize>,
    /// `[rows, keys]`: scores, then probabilities.
    scores: Vec<f32>,
}

thread_local! {
    static SCRATCH: RefCell<Scratch> = RefCell::default();
}

/// Floats a thread's scratch keeps between work items: a decode's scores at 64k positions and
/// a few query heads. A long prompt's blocks need more (keys and values of every position), which
/// are given back after the item rather than held by every pool thread.
const SCRATCH_KEPT: usize = 1 << 20;

impl Scratch {
    /// Runs `f` with this thread's scratch, or with a fresh one when this thread's is in use: a
    /// long prompt block's products run on the pool, which may start another item on this thread
    /// while the first waits for them.
    fn with<R>(f: impl FnOnce(&mut Scratch) -> R) -> R {
        SCRATCH.with(|cell| match cell.try_borrow_mut() {
            Ok(mut scratch) => {
                let scratch = &mut *scratch;
                let r = f(scratch);
                for v in [&mut scratch.keys, &mut scratch.values_t, &mut scratch.scores] {
                    if v.capacity() > SCRATCH_KEPT {
                        v.clear();
                        v.shrink_to(SCRATCH_KEPT);
                    }
                }
                r
            }
            Err(_) => f(&mut Scratch::default()),
        })
    }
}

/// Rotary embedding in the "rotate half" layout (dims `i` and `i + d/2` form a pair), applied to
/// the queries and the keys. Each token's angles are computed once for all their heads.
fn apply_rope(xs: [&mut [f32]; 2], head_dim: usize, positions: &[usize], theta: f32) {
    let half = head_dim / 2;
    let inv_freq: Vec<f32> =
        (0..half).map(|i| 1.0 / theta.powf((2 * i) as f32 / head_dim as f32)).collect();
    let mut rotation = vec![(0.0f32, 0.0f32); half];
    let [q, k] = xs;
    let (q_width, k_width) = (q.len() / positions.len(), k.len() / positions.len());
    let rows = q.chunks_exact_mut(q_width).zip(k.chunks_exact_mut(k_width));
    for ((q_row, k_row), &pos) in rows.zip(positions) {
        for (r, &f) in rotation.iter_mut().zip(&inv_freq) {
            *r = (pos as f32 * f).sin_cos();
        }
        for head in q_row.chunks_exact_mut(head_dim).chain(k_row.chunks_exact_mut(head_dim)) {
            let (lo, hi) = head.split_at_mut(half);
            for ((a, b), &(sin, cos)) in lo.iter_mut().zip(hi).zip(&rotation) {
                let (x0, x1) = (*a, *b);
                *a = x0 * cos - x1 * sin;
                *b = x1 * cos + x0 * sin;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scratch_is_kept_on_the_thread_and_a_nested_use_gets_its_own() {
        Scratch::with(|outer| outer.scores.resize(1_000, 1.0));
        Scratch::with(|outer| {
            assert!(outer.scores.capacity() >= 1_000, "kept between uses");
            // A pool thread that runs another item while waiting inside this one.
            Scratch::with(|inner| {
                assert_eq!(inner.scores.capacity(), 0, "a fresh scratch");
                inner.scores.push(2.0);
            });
            assert_eq!(outer.scores[0], 1.0);
        });
        Scratch::with(|big| big.keys.resize(SCRATCH_KEPT * 4, 0.0));
        Scratch::with(|after| assert!(after.keys.capacity() <= SCRATCH_KEPT, "given back"));
    }
}
