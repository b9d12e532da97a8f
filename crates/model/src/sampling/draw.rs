//! The seeded draw: which token a uniform number picks from a row of logits.
//!
//! The definition, shared with the CUDA kernel `sample_f32`: candidates are ranked by logit,
//! descending, ties to the lower id; each has the weight `exp((logit - max) / temperature)` (the
//! most likely token's is 1). The candidates are the first `top_k` in rank order that weigh at
//! least `min_p` (the most likely token always), then the shortest head of them whose mass reaches
//! `top_p` of theirs; the token is the first whose cumulative mass exceeds `u` times the kept
//! mass. Masses are exact sums ([`Mass`]), rounded to `f64` only to be compared, so the token does
//! not depend on how the candidates are visited.
//!
//! That freedom is what makes the draw cheap on a whole vocabulary: instead of sorting 150 000
//! tokens for every sample, the candidates are spread over buckets of logit ranges (bucket order
//! is rank order), the search sums bucket after bucket from the top, and only the bucket where the
//! cumulative mass crosses its target is sorted and walked. A top-k of up to [`SORT_WHOLE`]
//! candidates is sorted and walked directly, which gives the same token.

use super::mass::{ExponentSums, Mass};
use routed_backend::cpu;
use routed_types::{SamplingParams, TokenId};
use std::cmp::Ordering;

/// Candidate sets up to this size are sorted whole.
const SORT_WHOLE: usize = 4096;
/// Buckets of the logit range for larger sets.
const NUM_BUCKETS: usize = 4096;
/// A token that is no candidate, in [`Draw::bucket_of`].
const NO_BUCKET: u16 = u16::MAX;

/// Scratch of the draw, reused across rows so that no row allocates.
#[derive(Default)]
pub(super) struct Draw {
    /// The candidates: in rank order when sorted whole, else grouped by bucket.
    order: Vec<u32>,
    /// Every token's weight (bucketed path).
    weights: Vec<f32>,
    /// Every token's bucket, or [`NO_BUCKET`].
    bucket_of: Vec<u16>,
    bucket_mass: Vec<Mass>,
    /// Where each bucket's candidates start in `order`, and the end.
    bucket_start: Vec<u32>,
    /// The counting sort's next free position per bucket.
    cursor: Vec<u32>,
}

/// A logit as an integer in `f32::total_cmp`'s order.
fn rank_key(l: f32) -> u32 {
    let b = l.to_bits();
    if b >> 31 == 1 { !b } else { b | 1 << 31 }
}

/// `a` before `b` in rank order: higher logit first, then the lower id.
fn by_rank(logits: &[f32], a: u32, b: u32) -> Ordering {
    logits[b as usize].total_cmp(&logits[a as usize]).then(a.cmp(&b))
}

/// The row's shared quantities.
struct Row<'a> {
    logits: &'a [f32],
    /// The most likely token and its logit.
    top: u32,
    max: f32,
    inv_t: f32,
}

impl Row<'_> {
    /// Token `i`'s weight: `exp((logit - max) / temperature)` by the CPU kernels' polynomial
    /// (as [`cpu::exp_below`] computes a whole row). The top token weighs 1 even where
    /// `0 * inv_t` is not 0 (an infinite inverse temperature).
    #[inline]
    fn weight(&self, i: usize) -> f32 {
        let l = self.logits[i];
        if l == self.max { 1.0 } else { cpu::exp_nonpositive((l - self.max) * self.inv_t) }
    }

    /// Every token's weight into `out`, as [`Row::weight`] gives them; at temperature 1, with a
    /// finite max, also the row's log-sum-exp, bitwise `cpu::log_sum_exp(logits)` (the same
    /// terms summed in the same order).
    fn weights(&self, out: &mut Vec<f32>) -> Option<f32> {
        out.clear();
        out.resize(self.logits.len(), 0.0);
        let sum = cpu::exp_below(self.logits, self.max, self.inv_t, out);
        // exp(0) is 1 already, unless `l - max` or `0 * inv_t` is NaN.
        if !(self.max.is_finite() && self.inv_t.is_finite()) {
            for (w, &l) in out.iter_mut().zip(self.logits) {
                if l == self.max {
                    *w = 1.0;
                }
            }
            return None;
        }
        (self.inv_t == 1.0).then(|| self.max + sum.ln())
    }
}

/// Whether the cumulative mass `cum` (rounded) reaches `target` or, `strict`, exceeds it.
fn crosses(cum: &Mass, target: f64, strict: bool) -> bool {
    let c = cum.to_f64();
    if strict { c > target } else { c >= target }
}

/// What a draw gives.
pub(super) struct Drawn {
    /// The token.
    pub token: TokenId,
    /// The row's log-sum-exp when the draw weighed every token at temperature 1 (bitwise
    /// `cpu::log_sum_exp` of the row), so that the logprob need not weigh them again.
    pub log_z: Option<f32>,
}

impl Draw {
    /// The token `u` (in `[0, 1)`) picks from `logits` under `params`' temperature, top-k, min-p
    /// and top-p.
    pub(super) fn choose(&mut self, logits: &[f32], params: &SamplingParams, u: f64) -> Drawn {
        self.choose_with(logits, params, u, SORT_WHOLE)
    }

    /// [`Draw::choose`], sorting candidate sets of up to `sort_whole` tokens whole.
    fn choose_with(
        &mut self,
        logits: &[f32],
        params: &SamplingParams,
        u: f64,
        sort_whole: usize,
    ) -> Drawn {
        let v = logits.len() as u32;
        // The first token in rank order, and the lowest finite logit (the buckets' range).
        let (mut top, mut top_key, mut lowest) = (0, rank_key(logits[0]), f32::INFINITY);
        for (i, &l) in logits.iter().enumerate() {
            let key = rank_key(l);
            if key > top_key {
                (top, top_key) = (i as u32, key);
            }
            if l > f32::NEG_INFINITY && l < lowest {
                lowest = l;
            }
        }
        let row = Row { logits, top, max: logits[top as usize], inv_t: 1.0 / params.temperature };
        let k = params.top_k.map_or(v, |k| k.clamp(1, v));
        // The k-th token in rank order: the candidates rank at or before it.
        let kth = (k < v).then(|| {
            self.order.clear();
            self.order.extend(0..v);
            let (_, &mut kth, _) =
                self.order.select_nth_unstable_by(k as usize - 1, |&a, &b| by_rank(logits, a, b));
            kth
        });
        if k as usize <= sort_whole {
            // The first k in some order, or every token.
            if kth.is_none() {
                self.order.clear();
                self.order.extend(0..v);
            }
            self.order.truncate(k as usize);
            self.order.retain(|&i| {
                let w = row.weight(i as usize);
                i == top || (weighs(w) && w >= params.min_p)
            });
            self.order.sort_unstable_by(|&a, &b| by_rank(logits, a, b));
            return Drawn { token: self.walk_sorted(&row, params, u), log_z: None };
        }
        self.walk_buckets(&row, params, (kth, lowest), u)
    }

    /// The draw over candidates in `order`, sorted in rank order.
    fn walk_sorted(&self, row: &Row<'_>, params: &SamplingParams, u: f64) -> TokenId {
        let mut total = Mass::default();
        self.order.iter().for_each(|&i| total.add(row.weight(i as usize)));
        let mut kept = (self.order.len(), total);
        if params.top_p < 1.0 {
            let target = params.top_p as f64 * total.to_f64();
            let mut cum = Mass::default();
            for (n, &i) in self.order.iter().enumerate() {
                cum.add(row.weight(i as usize));
                if crosses(&cum, target, false) {
                    kept = (n + 1, cum);
                    break;
                }
            }
        }
        let (num_kept, mass) = kept;
        let target = u * mass.to_f64();
        let mut cum = Mass::default();
        for &i in &self.order[..num_kept] {
            cum.add(row.weight(i as usize));
            if crosses(&cum, target, true) {
                return i;
            }
        }
        // Rounding left the target at the kept mass: the last kept token, or the top one.
        self.order[..num_kept].last().copied().unwrap_or(row.top)
    }

    /// The draw over every token ranked at or before `kth` that weighs at least `min_p`,
    /// through buckets of the logit range `[lowest, max]`.
    fn walk_buckets(
        &mut self,
        row: &Row<'_>,
        params: &SamplingParams,
        (kth, lowest): (Option<u32>, f32),
        u: f64,
    ) -> Drawn {
        let logits = row.logits;
        let log_z = row.weights(&mut self.weights);
        // A lower logit never lands in an earlier bucket: every step of the arithmetic is
        // monotone. The top token's bucket is 0.
        let span = row.max - lowest;
        let scale = if span.is_finite() && span > 0.0 { NUM_BUCKETS as f32 / span } else { 0.0 };
        self.bucket_start.clear();
        self.bucket_start.resize(NUM_BUCKETS + 1, 0);
        self.bucket_of.clear();
        self.bucket_of.resize(logits.len(), NO_BUCKET);
        let mut total = ExponentSums::default();
        for (i, (&w, bucket)) in self.weights.iter().zip(&mut self.bucket_of).enumerate() {
            let candidate = i == row.top as usize
                || (weighs(w)
                    && w >= params.min_p
                    && kth.is_none_or(|t| by_rank(logits, i as u32, t) != Ordering::Greater));
            if candidate {
                let b = (((row.max - logits[i]) * scale) as usize).min(NUM_BUCKETS - 1);
                *bucket = b as u16;
                self.bucket_start[b + 1] += 1;
                total.add(w);
            }
        }
        for b in 0..NUM_BUCKETS {
            self.bucket_start[b + 1] += self.bucket_start[b];
        }
        // Counting sort: each bucket's candidates in id order, buckets in rank order.
        self.order.clear();
        self.order.resize(self.bucket_start[NUM_BUCKETS] as usize, 0);
        self.cursor.clear();
        self.cursor.extend_from_slice(&self.bucket_start);
        for (i, &b) in self.bucket_of.iter().enumerate() {
            if b != NO_BUCKET {
                self.order[self.cursor[b as usize] as usize] = i as u32;
                self.cursor[b as usize] += 1;
            }
        }
        self.bucket_mass.clear();
        let total = Mass::from_exponent_sums(&total);
        // The kept head ends at position `end` of `order`.
        let (mut end, mut kept) = (self.order.len(), total);
        if params.top_p < 1.0 {
            let target = params.top_p as f64 * total.to_f64();
            if let Some((at, cum)) = self.find(row, target, false, self.order.len()) {
                (end, kept) = (at + 1, cum);
            }
        }
        let target = u * kept.to_f64();
        let token = match self.find(row, target, true, end) {
            Some((at, _)) => self.order[at],
            None => self.order[..end].last().copied().unwrap_or(row.top),
        };
        Drawn { token, log_z }
    }

    /// The first position of `order` before `end` whose cumulative mass crosses `target`, and
    /// that mass. Buckets are summed from the top (their sums kept in `bucket_mass` for the next
    /// search) and skipped whole until one crosses; that one is sorted in rank order (once:
    /// sorting it again leaves it as it is) and walked. Mass usually sits in the first few
    /// buckets, so the search rarely reads far.
    fn find(
        &mut self,
        row: &Row<'_>,
        target: f64,
        strict: bool,
        end: usize,
    ) -> Option<(usize, Mass)> {
        let mut cum = Mass::default();
        for b in 0..NUM_BUCKETS {
            let (start, stop) = (self.bucket_start[b] as usize, self.bucket_start[b + 1] as usize);
            if start >= end {
                break;
            }
            if b == self.bucket_mass.len() {
                let mut mass = Mass::default();
                self.order[start..stop].iter().for_each(|&i| mass.add(self.weights[i as usize]));
                self.bucket_mass.push(mass);
            }
            let mut after = cum;
            after.add_mass(&self.bucket_mass[b]);
            if stop <= end && !crosses(&after, target, strict) {
                cum = after;
                continue;
            }
            let members = &mut self.order[start..stop];
            members.sort_unstable_by(|&a, &b| by_rank(row.logits, a, b));
            for (at, &i) in members.iter().enumerate().take(end - start) {
                cum.add(self.weights[i as usize]);
                if crosses(&cum, target, strict) {
                    return Some((start + at, cum));
                }
            }
            return None;
        }
        None
    }
}

/// Whether a weight counts: positive and at most 1 (NaN does not). Every path uses this one test.
fn weighs(w: f32) -> bool {
    w > 0.0 && w <= 1.0
}

#[cfg(test)]
mod tests {
    use super::*;

    /// SplitMix64 in `[0, 1)`.
    struct Rng(u64);

    impl Rng {
        fn next(&mut self) -> f64 {
            self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = self.0;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            ((z ^ (z >> 31)) >> 11) as f64 / (1u64 << 53) as f64
        }
    }

    /// A language-model-like row: a wide low floor, a few dozen likely tokens, ties, and
    /// tokens masked to -inf.
    fn row(rng: &mut Rng, v: usize) -> Vec<f32> {
        let mut logits: Vec<f32> = (0..v).map(|_| (rng.next() * 14.0 - 7.0) as f32).collect();
        for _ in 0..30 {
            let t = (rng.next() * v as f64) as usize;
            logits[t] = (6.0 + rng.next() * 6.0) as f32;
        }
        for t in 0..v / 50 {
            logits[t * 50 + 1] = logits[t * 50]; // ties
        }
        for t in 0..v / 97 {
            logits[t * 97 + 3] = f32::NEG_INFINITY;
        }
        logits
    }

    fn settings() -> Vec<SamplingParams> {
        let base = SamplingParams { temperature: 1.0, ..SamplingParams::greedy(1) };
        vec![
            base.clone(),
            SamplingParams { temperature: 0.3, ..base.clone() },
            SamplingParams { temperature: 2.5, ..base.clone() },
            SamplingParams { top_p: 0.9, ..base.clone() },
            SamplingParams { top_p: 0.3, temperature: 1.7, ..base.clone() },
            SamplingParams { top_k: Some(40), ..base.clone() },
            SamplingParams { top_k: Some(6000), top_p: 0.95, ..base.clone() },
            SamplingParams { min_p: 0.01, ..base.clone() },
            SamplingParams { min_p: 1e-6, top_p: 0.99, temperature: 3.0, ..base.clone() },
            SamplingParams { temperature: 1e-30, ..base },
        ]
    }

    #[test]
    fn buckets_pick_the_token_a_whole_sort_picks() {
        let mut rng = Rng(11);
        let (mut sorted, mut bucketed) = (Draw::default(), Draw::default());
        for v in [5, 300, 9000, 20_000] {
            let logits = row(&mut rng, v);
            for params in settings() {
                for _ in 0..60 {
                    let u = rng.next();
                    let want = sorted.choose_with(&logits, &params, u, usize::MAX).token;
                    let got = bucketed.choose_with(&logits, &params, u, 0).token;
                    assert_eq!(got, want, "v {v}, u {u}, {params:?}");
                }
            }
        }
    }

    #[test]
    fn the_draw_inverts_the_cumulative_distribution() {
        // u on an even grid picks each token in proportion to its probability.
        let v = 12_000;
        let mut logits = vec![-30.0f32; v];
        let likely = [(17usize, 3.0f32), (4000, 2.0), (9999, 2.0), (500, 0.0)];
        for &(t, l) in &likely {
            logits[t] = l;
        }
        let params = SamplingParams { temperature: 1.0, ..SamplingParams::greedy(1) };
        let weight = |l: f32| ((l - 3.0) as f64).exp();
        let total: f64 = likely.iter().map(|&(_, l)| weight(l)).sum::<f64>()
            + (v - likely.len()) as f64 * weight(-30.0);
        let n = 20_000;
        let mut counts = std::collections::HashMap::new();
        let mut draw = Draw::default();
        for j in 0..n {
            let u = (j as f64 + 0.5) / n as f64;
            *counts.entry(draw.choose(&logits, &params, u).token).or_insert(0usize) += 1;
        }
        for &(t, l) in &likely {
            let want = weight(l) / total * n as f64;
            let got = counts.get(&(t as u32)).copied().unwrap_or(0) as f64;
            assert!((got - want).abs() <= 1.0, "token {t}: {got} draws, expected {want:.2}");
        }
        // Ties rank the lower id first: tokens 4000 and 9999 split their mass in that order.
        let first = (0..n).find(|&j| {
            let u = (j as f64 + 0.5) / n as f64;
            let t = draw.choose(&logits, &params, u).token;
            t == 4000 || t == 9999
        });
        let u = (first.unwrap() as f64 + 0.5) / n as f64;
        assert_eq!(draw.choose(&logits, &params, u).token, 4000);
    }

    #[test]
    fn cuts_keep_their_heads() {
        let mut rng = Rng(5);
        let logits = row(&mut rng, 10_000);
        let mut ranked: Vec<u32> = (0..10_000).collect();
        ranked.sort_by(|&a, &b| by_rank(&logits, a, b));
        let mut draw = Draw::default();
        let base = SamplingParams { temperature: 1.0, ..SamplingParams::greedy(1) };
        for _ in 0..200 {
            let u = rng.next();
            let k = SamplingParams { top_k: Some(7), ..base.clone() };
            assert!(ranked[..7].contains(&draw.choose(&logits, &k, u).token));
            let one = SamplingParams { top_p: 1e-9, ..base.clone() };
            assert_eq!(draw.choose(&logits, &one, u).token, ranked[0], "top_p keeps the top token");
            let min_p = SamplingParams { min_p: 0.5, ..base.clone() };
            let t = draw.choose(&logits, &min_p, u).token;
            assert!(logits[t as usize] >= logits[ranked[0] as usize] - 0.5f32.ln().abs());
        }
    }

    #[test]
    fn a_draw_over_the_whole_row_at_temperature_one_gives_its_normaliser() {
        let mut rng = Rng(9);
        let mut draw = Draw::default();
        let base = SamplingParams { temperature: 1.0, ..SamplingParams::greedy(1) };
        for v in [6000, 20_000] {
            let mut logits = row(&mut rng, v);
            // Both zeros at the top: the normaliser's max may be either.
            logits.iter_mut().for_each(|l| *l -= 16.0);
            let top = (0..v).max_by(|&a, &b| logits[a].total_cmp(&logits[b])).unwrap();
            logits[top] = 0.0;
            logits[v - 1] = -0.0;
            logits[v - 2] = -f32::NAN;
            let want = cpu::log_sum_exp(&logits);
            let drawn = draw.choose(&logits, &base, rng.next());
            assert_eq!(drawn.log_z.map(f32::to_bits), Some(want.to_bits()), "{v} tokens");
            let hot = SamplingParams { temperature: 1.5, ..base.clone() };
            assert_eq!(draw.choose(&logits, &hot, 0.5).log_z, None, "another temperature");
            let k = SamplingParams { top_k: Some(50), ..base.clone() };
            assert_eq!(draw.choose(&logits, &k, 0.5).log_z, None, "a head sorted whole");
        }
    }

    #[test]
    fn odd_rows_still_pick_a_token() {
        let mut draw = Draw::default();
        let base = SamplingParams { temperature: 1.0, ..SamplingParams::greedy(1) };
        let nan = vec![f32::NAN; 5000];
        let inf = [vec![0.0f32; 4999], vec![f32::INFINITY]].concat();
        let masked = vec![f32::NEG_INFINITY; 5000];
        for u in [0.0, 0.5, 1.0 - f64::EPSILON] {
            assert!(draw.choose(&nan, &base, u).token < 5000);
            assert_eq!(draw.choose(&inf, &base, u).token, 4999, "an infinite logit takes the mass");
            assert!(draw.choose(&masked, &base, u).token < 5000);
        }
    }
}
