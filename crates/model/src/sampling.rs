//! Token sampling: greedy, temperature, top-k and top-p, with logprobs of the raw distribution.
//!
//! A request's random numbers come from its own seed and the index of the token being sampled,
//! never from a shared generator, so its samples do not depend on which requests share its batch
//! or on preemption.

use routed_backend::cpu;
use routed_types::{SampledToken, SamplingParams, TokenId};

/// Sampling scratch reused across tokens so the hot path does not allocate per token.
#[derive(Default)]
pub struct Sampler {
    order: Vec<u32>,
    probs: Vec<f32>,
}

impl Sampler {
    /// Samples from one row of logits. `index` is the position of the token in the request's
    /// output (0 for the first generated token); it selects the random number.
    pub fn sample(&mut self, logits: &[f32], params: &SamplingParams, index: u64) -> SampledToken {
        // Logprobs are logits shifted by one normaliser: computed for the few tokens reported,
        // never for the whole vocabulary.
        let log_z = cpu::log_sum_exp(logits);
        let token = if params.is_greedy() {
            cpu::argmax(logits) as TokenId
        } else {
            self.sample_random(logits, params, uniform(params.seed, index))
        };
        let top_logprobs = match params.logprobs {
            Some(n) if n > 0 => self.top_logprobs(logits, log_z, n as usize),
            _ => Vec::new(),
        };
        SampledToken { token, logprob: logits[token as usize] - log_z, top_logprobs }
    }

    fn sample_random(&mut self, logits: &[f32], params: &SamplingParams, u: f64) -> TokenId {
        // Candidates sorted by logit, descending, ties to the lower id: a fixed order for the CDF.
        self.order.clear();
        self.order.extend(0..logits.len() as u32);
        self.order
            .sort_by(|&a, &b| logits[b as usize].total_cmp(&logits[a as usize]).then(a.cmp(&b)));
        let keep = params.top_k.map_or(logits.len(), |k| (k as usize).clamp(1, logits.len()));
        self.order.truncate(keep);
        let inv_t = 1.0 / params.temperature;
        let max = logits[self.order[0] as usize];
        self.probs.clear();
        self.probs.extend(self.order.iter().map(|&i| ((logits[i as usize] - max) * inv_t).exp()));
        let total: f32 = self.probs.iter().sum();
        if params.top_p < 1.0 {
            let mut mass = 0.0;
            let mut cut = self.probs.len();
            for (i, p) in self.probs.iter().enumerate() {
                mass += p / total;
                if mass >= params.top_p {
                    cut = i + 1;
                    break;
                }
            }
            self.probs.truncate(cut);
            self.order.truncate(cut);
        }
        let total: f64 = self.probs.iter().map(|&p| p as f64).sum();
        let mut target = u * total;
        for (i, &p) in self.probs.iter().enumerate() {
            target -= p as f64;
            if target < 0.0 {
                return self.order[i];
            }
        }
        *self.order.last().expect("at least one candidate")
    }

    /// The `n` most likely tokens (ties to the lower id) with their logprobs; ranking logits
    /// ranks logprobs, which differ by a constant.
    fn top_logprobs(&mut self, logits: &[f32], log_z: f32, n: usize) -> Vec<(TokenId, f32)> {
        self.order.clear();
        self.order.extend(0..logits.len() as u32);
        let by_logit =
            |a: &u32, b: &u32| logits[*b as usize].total_cmp(&logits[*a as usize]).then(a.cmp(b));
        let n = n.min(logits.len());
        self.order.select_nth_unstable_by(n - 1, by_logit);
        self.order.truncate(n);
        self.order.sort_by(by_logit);
        self.order.iter().map(|&i| (i, logits[i as usize] - log_z)).collect()
    }
}

/// A uniform number in `[0, 1)` from `(seed, index)` (SplitMix64 finaliser): stateless, so a
/// token's randomness is fixed by its request and position alone.
fn uniform(seed: u64, index: u64) -> f64 {
    let mut z = seed.wrapping_add(index.wrapping_add(1).wrapping_mul(0x9E37_79B9_7F4A_7C15));
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^= z >> 31;
    (z >> 11) as f64 / (1u64 << 53) as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn greedy_takes_argmax_and_reports_logprobs() {
        let mut s = Sampler::default();
        let params = SamplingParams { logprobs: Some(2), ..SamplingParams::greedy(1) };
        let out = s.sample(&[0.0, 2.0, 1.0], &params, 0);
        assert_eq!(out.token, 1);
        assert_eq!(out.top_logprobs.iter().map(|t| t.0).collect::<Vec<_>>(), vec![1, 2]);
        assert!((out.logprob - out.top_logprobs[0].1).abs() < 1e-7);
    }

    #[test]
    fn same_seed_and_index_give_the_same_sample() {
        let logits: Vec<f32> = (0..50).map(|i| (i as f32 * 0.37).sin()).collect();
        let params = SamplingParams { temperature: 1.0, seed: 7, ..Default::default() };
        let a: Vec<_> =
            (0..20).map(|i| Sampler::default().sample(&logits, &params, i).token).collect();
        let mut shared = Sampler::default();
        let b: Vec<_> = (0..20).map(|i| shared.sample(&logits, &params, i).token).collect();
        assert_eq!(a, b);
        assert!(a.iter().any(|&t| t != a[0]), "samples should vary across indices");
    }

    #[test]
    fn top_k_one_is_greedy_and_top_p_keeps_the_head() {
        let logits = [0.0, 5.0, 1.0, 4.9];
        let k1 = SamplingParams { temperature: 1.0, top_k: Some(1), ..Default::default() };
        let p = SamplingParams { temperature: 1.0, top_p: 0.5, ..Default::default() };
        for i in 0..20 {
            assert_eq!(Sampler::default().sample(&logits, &k1, i).token, 1);
            assert_eq!(Sampler::default().sample(&logits, &p, i).token, 1);
        }
    }
}
