//! Token sampling: logit bias and penalties, then greedy, or temperature with min-p, top-k and
//! top-p; logprobs of the raw distribution.
//!
//! A request's random numbers come from its own seed and the index of the token being sampled,
//! never from a shared generator, and every step of the choice reads only the request's own row
//! and history, so its samples do not depend on which requests share its batch or on preemption.

mod draw;
mod mass;

use routed_backend::cpu;
use routed_types::{SampledToken, SamplingParams, SeqContext, TokenCounts, TokenId, TokenMask};

/// Sampling scratch reused across tokens so the hot path does not allocate per token.
#[derive(Default)]
pub struct Sampler {
    /// The seeded draw's.
    draw: draw::Draw,
    /// The alternatives' order.
    order: Vec<u32>,
    /// The logits after bias and penalties, when a request asks for either.
    processed: Vec<f32>,
}

impl Sampler {
    /// Samples from one row of logits. `index` is the position of the token in the request's
    /// output (0 for the first generated token); it selects the random number. `history` holds the
    /// tokens before this one when the parameters need them (penalties); without it penalties
    /// see no history.
    pub fn sample(
        &mut self,
        logits: &[f32],
        params: &SamplingParams,
        index: u64,
        history: Option<&SeqContext>,
    ) -> SampledToken {
        let mut processed = std::mem::take(&mut self.processed);
        let choose_from = if params.processes_logits() {
            self.process(logits, params, history, &mut processed);
            &processed[..]
        } else {
            logits
        };
        let (token, drawn_log_z) = if params.is_greedy() {
            (cpu::argmax(choose_from) as TokenId, None)
        } else {
            let drawn = self.draw.choose(choose_from, params, uniform(params.seed, index));
            (drawn.token, drawn.log_z)
        };
        self.processed = processed;
        // Logprobs are logits shifted by one normaliser: computed for the few tokens reported,
        // never for the whole vocabulary. They are the raw model's, whatever changes the choice;
        // a draw over the raw row at temperature 1 has summed the normaliser's terms already.
        let log_z = match drawn_log_z {
            Some(log_z) if !params.processes_logits() => log_z,
            _ => cpu::log_sum_exp(logits),
        };
        let top_logprobs = match params.logprobs {
            Some(n) if n > 0 => self.top_logprobs(logits, log_z, n as usize),
            _ => Vec::new(),
        };
        let rank = params.logprobs.map(|_| rank(logits, token));
        let token_id_logprobs = match params.logprobs {
            Some(_) => logprobs_of(logits, log_z, &params.logprob_token_ids),
            None => Vec::new(),
        };
        let logprob = logits[token as usize] - log_z;
        SampledToken { token, logprob, top_logprobs, rank, token_id_logprobs }
    }

    /// The logprob and rank of `token` in one row of logits, with the `n` most likely
    /// alternatives and the logprobs of the tokens `ids` (prompt logprobs).
    pub fn score(
        &mut self,
        logits: &[f32],
        token: TokenId,
        n: u32,
        ids: &[TokenId],
    ) -> SampledToken {
        let log_z = cpu::log_sum_exp(logits);
        let top_logprobs =
            if n > 0 { self.top_logprobs(logits, log_z, n as usize) } else { Vec::new() };
        let rank = Some(rank(logits, token));
        let token_id_logprobs = logprobs_of(logits, log_z, ids);
        let logprob = logits[token as usize] - log_z;
        SampledToken { token, logprob, top_logprobs, rank, token_id_logprobs }
    }

    /// Logit bias, then the repetition, frequency and presence penalties (vLLM's order), then
    /// the output constraint's mask and the bad words' bans, into `out`. A ban that would leave
    /// no token at all (every token the constraint allows is banned) is lifted: the constraint
    /// must be met, and its answer is the output.
    fn process(
        &mut self,
        logits: &[f32],
        params: &SamplingParams,
        history: Option<&SeqContext>,
        out: &mut Vec<f32>,
    ) {
        out.clear();
        out.extend_from_slice(logits);
        for &(token, bias) in &params.logit_bias {
            if let Some(l) = out.get_mut(token as usize) {
                *l += bias;
            }
        }
        if let Some(counts) =
            history.filter(|_| params.needs_history()).and_then(|h| h.history.as_deref())
        {
            penalise(params, counts, out);
        }
        // An output constraint last: a token it rules out has no chance, whatever else applied.
        if let Some(allowed) = history.and_then(|h| h.allowed.as_deref()) {
            rule_out(allowed, out);
        }
        let banned = history.map_or(&[][..], |h| &h.banned[..]);
        let kept = |i: usize, l: &f32| {
            *l > f32::NEG_INFINITY && banned.binary_search(&(i as u32)).is_err()
        };
        if !banned.is_empty() && out.iter().enumerate().any(|(i, l)| kept(i, l)) {
            for &t in banned {
                if let Some(l) = out.get_mut(t as usize) {
                    *l = f32::NEG_INFINITY;
                }
            }
        }
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

/// The logprobs of the tokens `ids` (in the vocabulary: the request was checked), in order.
fn logprobs_of(logits: &[f32], log_z: f32, ids: &[TokenId]) -> Vec<f32> {
    ids.iter().map(|&t| logits[t as usize] - log_z).collect()
}

/// Sends every logit the mask does not allow to minus infinity, a word of 64 tokens at a time
/// (inside a JSON string nearly every word allows all of its tokens); rows longer than the mask
/// (a model's vocabulary padded past the tokenizer's) lose their tail.
fn rule_out(allowed: &TokenMask, row: &mut [f32]) {
    let mut chunks = row.chunks_mut(64);
    for (&word, chunk) in allowed.words().iter().zip(&mut chunks) {
        if word != u64::MAX {
            for (i, l) in chunk.iter_mut().enumerate() {
                if word >> i & 1 == 0 {
                    *l = f32::NEG_INFINITY;
                }
            }
        }
    }
    chunks.flatten().for_each(|l| *l = f32::NEG_INFINITY);
}

/// The repetition penalty over every distinct token of the prompt and the output, then the
/// frequency and presence penalties over the output's (vLLM's order).
fn penalise(params: &SamplingParams, counts: &TokenCounts, out: &mut [f32]) {
    let rp = params.repetition_penalty;
    if rp != 1.0 {
        // Every distinct token of the prompt and the output.
        for c in counts.entries() {
            if let Some(l) = out.get_mut(c.token as usize) {
                *l = if *l > 0.0 { *l / rp } else { *l * rp };
            }
        }
    }
    let (presence, frequency) = (params.presence_penalty, params.frequency_penalty);
    if presence != 0.0 || frequency != 0.0 {
        for c in counts.entries().iter().filter(|c| c.num_in_output > 0) {
            if let Some(l) = out.get_mut(c.token as usize) {
                *l -= frequency * c.num_in_output as f32;
                *l -= presence;
            }
        }
    }
}

/// The 1-based rank of `token` among `logits` in [`Sampler::top_logprobs`]' order (descending,
/// ties to the lower id): one pass, whatever the vocabulary size, and never a sort.
fn rank(logits: &[f32], token: TokenId) -> u32 {
    let x = logits[token as usize];
    let ahead = logits
        .iter()
        .enumerate()
        .filter(|&(i, l)| l.total_cmp(&x).then((token as usize).cmp(&i)).is_gt())
        .count();
    u32::try_from(ahead).map_or(u32::MAX, |a| a.saturating_add(1))
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
    use std::sync::Arc;

    #[test]
    fn greedy_takes_argmax_and_reports_logprobs() {
        let mut s = Sampler::default();
        let params = SamplingParams { logprobs: Some(2), ..SamplingParams::greedy(1) };
        let out = s.sample(&[0.0, 2.0, 1.0], &params, 0, None);
        assert_eq!(out.token, 1);
        assert_eq!(out.top_logprobs.iter().map(|t| t.0).collect::<Vec<_>>(), vec![1, 2]);
        assert!((out.logprob - out.top_logprobs[0].1).abs() < 1e-7);
        assert_eq!(out.rank, Some(1));
        let plain = s.sample(&[0.0, 2.0, 1.0], &SamplingParams::greedy(1), 0, None);
        assert_eq!(plain.rank, None, "no logprobs, no rank");
    }

    #[test]
    fn named_tokens_report_their_raw_logprobs_in_the_order_asked() {
        let logits = [0.5, 2.0, -1.0, 2.0, 1.0];
        let mut s = Sampler::default();
        let all = s.score(&logits, 0, 5, &[]).top_logprobs;
        let raw = |t: TokenId| all.iter().find(|a| a.0 == t).unwrap().1;
        let ids: Arc<[TokenId]> = vec![4, 2, 4].into();
        let scored = s.score(&logits, 0, 0, &ids);
        assert_eq!(scored.token_id_logprobs, [raw(4), raw(2), raw(4)]);
        // A sample reports them where it reports logprobs, whatever changes the choice.
        let params = SamplingParams {
            logprobs: Some(0),
            logprob_token_ids: Arc::clone(&ids),
            logit_bias: vec![(2, 50.0)],
            ..SamplingParams::greedy(1)
        };
        let out = s.sample(&logits, &params, 0, None);
        assert_eq!((out.token, out.token_id_logprobs), (2, scored.token_id_logprobs));
        let quiet = SamplingParams { logprobs: None, ..params };
        assert!(s.sample(&logits, &quiet, 0, None).token_id_logprobs.is_empty());
    }

    #[test]
    fn ranks_follow_the_order_of_the_alternatives() {
        // Token 1 and 3 tie for the lead: the lower id ranks first.
        let logits = [0.5, 2.0, -1.0, 2.0, 1.0];
        let mut s = Sampler::default();
        let ranks: Vec<_> = (0..5).map(|t| s.score(&logits, t, 0, &[]).rank).collect();
        assert_eq!(ranks, [Some(4), Some(1), Some(5), Some(2), Some(3)]);
        let top = s.score(&logits, 4, 5, &[]).top_logprobs;
        for (position, &(id, _)) in top.iter().enumerate() {
            assert_eq!(s.score(&logits, id, 0, &[]).rank, Some(position as u32 + 1));
        }
    }

    #[test]
    fn same_seed_and_index_give_the_same_sample() {
        let logits: Vec<f32> = (0..50).map(|i| (i as f32 * 0.37).sin()).collect();
        let params = SamplingParams { temperature: 1.0, seed: 7, ..Default::default() };
        let a: Vec<_> =
            (0..20).map(|i| Sampler::default().sample(&logits, &params, i, None).token).collect();
        let mut shared = Sampler::default();
        let b: Vec<_> = (0..20).map(|i| shared.sample(&logits, &params, i, None).token).collect();
        assert_eq!(a, b);
        assert!(a.iter().any(|&t| t != a[0]), "samples should vary across indices");
    }

    #[test]
    fn a_drawn_tokens_logprob_is_the_one_its_row_scores() {
        // Drawn over the whole row, the normaliser comes from the draw's own weights; biased, it
        // is computed apart. Either way, the logprob is the raw row's.
        let logits: Vec<f32> = (0..9000).map(|i| ((i * 7919) % 4001) as f32 * -0.004).collect();
        let plain = SamplingParams { temperature: 1.0, seed: 3, ..Default::default() };
        let biased = SamplingParams { logit_bias: vec![(17, 3.0)], ..plain.clone() };
        let mut s = Sampler::default();
        for params in [plain, biased] {
            for index in 0..20 {
                let out = s.sample(&logits, &params, index, None);
                let scored = Sampler::default().score(&logits, out.token, 0, &[]);
                assert_eq!(out.logprob.to_bits(), scored.logprob.to_bits(), "{params:?}");
            }
        }
    }

    #[test]
    fn top_k_one_is_greedy_and_top_p_keeps_the_head() {
        let logits = [0.0, 5.0, 1.0, 4.9];
        let k1 = SamplingParams { temperature: 1.0, top_k: Some(1), ..Default::default() };
        let p = SamplingParams { temperature: 1.0, top_p: 0.5, ..Default::default() };
        for i in 0..20 {
            assert_eq!(Sampler::default().sample(&logits, &k1, i, None).token, 1);
            assert_eq!(Sampler::default().sample(&logits, &p, i, None).token, 1);
        }
    }

    fn history(prompt: &[TokenId], output: &[TokenId]) -> SeqContext {
        SeqContext::new(prompt.to_vec(), output)
    }

    #[test]
    fn penalties_follow_the_openai_and_vllm_definitions() {
        let logits = [2.0, -1.0, 0.5, 3.0];
        let mut s = Sampler::default();
        let mut out = Vec::new();
        // Token 3 twice and token 0 once in the output; token 1 in the prompt.
        let h = history(&[1], &[3, 0, 3]);
        let p =
            SamplingParams { presence_penalty: 0.5, frequency_penalty: 0.25, ..Default::default() };
        s.process(&logits, &p, Some(&h), &mut out);
        assert_eq!(out, [2.0 - 0.25 - 0.5, -1.0, 0.5, 3.0 - 0.5 - 0.5]);
        let p = SamplingParams { repetition_penalty: 2.0, ..Default::default() };
        s.process(&logits, &p, Some(&h), &mut out);
        assert_eq!(out, [1.0, -2.0, 0.5, 1.5], "divides positive, multiplies negative");
        let p = SamplingParams { logit_bias: vec![(2, 10.0), (99, 1.0)], ..Default::default() };
        s.process(&logits, &p, None, &mut out);
        assert_eq!(out, [2.0, -1.0, 10.5, 3.0], "an id outside the vocabulary is ignored");
    }

    #[test]
    fn a_logit_bias_can_force_the_greedy_choice_and_logprobs_stay_raw() {
        let logits = [0.0, 5.0, 1.0];
        let p = SamplingParams { logit_bias: vec![(2, 100.0)], ..SamplingParams::greedy(1) };
        let out = Sampler::default().sample(&logits, &p, 0, None);
        assert_eq!(out.token, 2);
        let raw = Sampler::default().score(&logits, 2, 0, &[]);
        assert_eq!(out.logprob, raw.logprob, "the logprob is the raw model's");
    }

    #[test]
    fn min_p_keeps_only_tokens_near_the_most_likely() {
        let logits = [0.0, 5.0, 1.0, 4.5];
        let p = SamplingParams { temperature: 1.0, min_p: 0.5, ..Default::default() };
        // exp(4.5 - 5) = 0.61 >= 0.5 keeps token 3; exp(1 - 5) and exp(0 - 5) are cut.
        let picks: Vec<_> =
            (0..40).map(|i| Sampler::default().sample(&logits, &p, i, None).token).collect();
        assert!(picks.iter().all(|&t| t == 1 || t == 3));
        assert!(picks.contains(&1) && picks.contains(&3));
    }

    #[test]
    fn banned_tokens_are_never_chosen_unless_nothing_else_is_allowed() {
        use routed_types::{ResponseFormat, TokenMask};
        let logits = [0.5, 3.0, 2.0, 2.5];
        let p = SamplingParams { bad_words: vec![vec![1]], ..SamplingParams::greedy(1) };
        let banned = SeqContext { banned: Arc::from([1, 3]), ..history(&[0], &[]) };
        let out = Sampler::default().sample(&logits, &p, 0, Some(&banned));
        assert_eq!(out.token, 2, "the best token not banned");
        let raw = Sampler::default().score(&logits, 2, 0, &[]);
        assert_eq!(out.logprob.to_bits(), raw.logprob.to_bits(), "logprobs stay raw");
        let seeded = SamplingParams { temperature: 1.0, seed: 3, ..p.clone() };
        for index in 0..40 {
            let t = Sampler::default().sample(&logits, &seeded, index, Some(&banned)).token;
            assert!(t == 0 || t == 2, "{t}");
        }
        // A constraint that allows banned tokens only keeps them: it must be met.
        let mut allowed = TokenMask::none(logits.len());
        allowed.allow(1);
        allowed.allow(3);
        let both = SeqContext { allowed: Some(Arc::new(allowed)), ..banned };
        let json = SamplingParams { response_format: ResponseFormat::JsonObject, ..p };
        assert_eq!(Sampler::default().sample(&logits, &json, 0, Some(&both)).token, 1);
    }

    #[test]
    fn a_constrained_choice_is_among_the_allowed_tokens_and_its_logprob_stays_raw() {
        use routed_types::{ResponseFormat, TokenMask};
        let logits: Vec<f32> = (0..3000).map(|i| ((i * 7919) % 4001) as f32 * 0.004).collect();
        let mut allowed = TokenMask::none(logits.len());
        for t in [5, 17, 2999] {
            allowed.allow(t);
        }
        let context = SeqContext { allowed: Some(Arc::new(allowed)), ..history(&[1], &[]) };
        let json = ResponseFormat::JsonObject;
        let greedy = SamplingParams { response_format: json.clone(), ..SamplingParams::greedy(1) };
        let top_p = SamplingParams { top_p: 0.9, top_k: Some(40), ..Default::default() };
        let seeded = SamplingParams { seed: 11, response_format: json, ..top_p };
        let penalised = SamplingParams { repetition_penalty: 1.5, ..seeded.clone() };
        let seeded_params = seeded.clone();
        let mut s = Sampler::default();
        let mut seen = std::collections::BTreeSet::new();
        for params in [greedy, seeded, penalised] {
            for index in 0..40 {
                let out = s.sample(&logits, &params, index, Some(&context));
                assert!([5, 17, 2999].contains(&out.token), "{params:?}: {}", out.token);
                let raw = Sampler::default().score(&logits, out.token, 0, &[]);
                assert_eq!(out.logprob.to_bits(), raw.logprob.to_bits());
                seen.insert(out.token);
            }
        }
        assert!(seen.len() > 1, "seeded draws reach more than one allowed token");
        // A row longer than the mask (a padded vocabulary): the padding is never chosen.
        let mut padded = logits.clone();
        padded.extend([1e6; 100]);
        let out = s.sample(
            &padded,
            &SamplingParams { seed: 3, ..seeded_params.clone() },
            0,
            Some(&context),
        );
        assert!([5, 17, 2999].contains(&out.token), "{}", out.token);
        let free = s.sample(&logits, &SamplingParams::greedy(1), 0, None).token;
        assert!(![5, 17, 2999].contains(&free), "the mask, not the row, made the choices");
    }
}
