//! A row's logit bias and penalties as a short list of per-token edits, for the device to apply
//! before it picks the token (the kernel `logit_edits_f32`).
//!
//! The CPU sampler (`routed_model::Sampler`) changes a row in three passes, in vLLM's order: the
//! logit bias, the repetition penalty over every distinct token of the prompt and the output, then
//! the frequency and presence penalties over the output's distinct tokens with their counts. Each
//! pass touches a token independently of the others, so the same result comes from one edit per
//! distinct token that applies, in that order, exactly the operations the CPU applies to it, with
//! the same f32 arithmetic (the frequency term `frequency * count` is computed here, as there).
//! Only the touched tokens change, so the device saves their raw values and puts them back after
//! the choice: logprobs stay those of the raw distribution, as on the CPU.

use routed_types::{SamplingParams, SeqContext, TokenCount, TokenId};

/// Words of one edit as the kernel's `LogitEdit` reads it: token, operations, bias, repetition
/// penalty, frequency term, presence penalty.
pub const LOGIT_EDIT_WORDS: usize = 6;

/// The edit adds the logit bias.
pub const EDIT_BIAS: u32 = 1;
/// The edit applies the repetition penalty (the token is in the prompt or the output).
pub const EDIT_REPETITION: u32 = 2;
/// The edit subtracts the frequency term and the presence penalty (the token is in the output).
pub const EDIT_PENALTIES: u32 = 4;

/// One token's edit.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LogitEdit {
    /// The token whose logit changes.
    pub token: TokenId,
    /// Which of [`EDIT_BIAS`], [`EDIT_REPETITION`] and [`EDIT_PENALTIES`] apply, in that order.
    pub ops: u32,
    /// Added first.
    pub bias: f32,
    /// Divides a positive logit, multiplies any other.
    pub repetition: f32,
    /// `frequency_penalty * count`, subtracted.
    pub frequency: f32,
    /// Subtracted last.
    pub presence: f32,
}

impl LogitEdit {
    /// The kernel's words.
    pub fn write(&self, out: &mut [u32]) {
        out[..LOGIT_EDIT_WORDS].copy_from_slice(&[
            self.token,
            self.ops,
            self.bias.to_bits(),
            self.repetition.to_bits(),
            self.frequency.to_bits(),
            self.presence.to_bits(),
        ]);
    }

    /// The edited logit: what the CPU sampler's passes make of `logit` (the kernel's arithmetic,
    /// for tests).
    pub fn apply(&self, logit: f32) -> f32 {
        let mut l = logit;
        if self.ops & EDIT_BIAS != 0 {
            l += self.bias;
        }
        if self.ops & EDIT_REPETITION != 0 {
            l = if l > 0.0 { l / self.repetition } else { l * self.repetition };
        }
        if self.ops & EDIT_PENALTIES != 0 {
            l -= self.frequency;
            l -= self.presence;
        }
        l
    }
}

/// Builds rows' edits; keeps its scratch between rows so that building allocates nothing once
/// warm.
#[derive(Debug, Default)]
pub struct EditBuilder {
    /// The logit bias's `(token, index)`, sorted.
    bias: Vec<(TokenId, u32)>,
}

impl EditBuilder {
    /// Appends the edits of a row sampled with `params` after `history` (the tokens before this
    /// one, when the parameters need them) to `out`, sorted by token, one per distinct token.
    /// Bias entries for tokens outside the vocabulary are dropped, as the CPU drops them.
    /// Returns `false`, with `out` as it was, when the row cannot be expressed as one edit per
    /// token: a token biased twice (the CPU adds the two biases one after the other).
    pub fn build(
        &mut self,
        params: &SamplingParams,
        history: Option<&SeqContext>,
        vocab_size: usize,
        out: &mut Vec<LogitEdit>,
    ) -> bool {
        if !self.sort_bias(params, vocab_size) {
            return false;
        }
        let counts = history.filter(|_| params.needs_history()).and_then(|h| h.history.as_deref());
        let entries = counts.map_or(&[][..], |c| c.entries());
        // The bias and the history, both sorted by token, merged.
        let (mut b, mut e) = (0, 0);
        loop {
            let (next_bias, next_seen) = (self.bias.get(b), entries.get(e));
            let token = match (next_bias, next_seen) {
                (None, None) => break,
                (Some(&(t, _)), None) => t,
                (None, Some(c)) => c.token,
                (Some(&(t, _)), Some(c)) => t.min(c.token),
            };
            let bias = next_bias.filter(|&&(t, _)| t == token);
            let seen = next_seen.filter(|c| c.token == token);
            b += usize::from(bias.is_some());
            e += usize::from(seen.is_some());
            let bias = bias.map(|&(_, index)| params.logit_bias[index as usize].1);
            out.extend(edit_of(params, token, bias, seen));
        }
        true
    }

    /// The logit bias's entries inside the vocabulary, as `(token, index)` sorted by token;
    /// `false` when a token is biased twice.
    fn sort_bias(&mut self, params: &SamplingParams, vocab_size: usize) -> bool {
        self.bias.clear();
        let biased = params.logit_bias.iter().enumerate();
        self.bias.extend(
            biased
                .filter(|(_, (t, _))| (*t as usize) < vocab_size)
                .map(|(i, &(t, _))| (t, i as u32)),
        );
        self.bias.sort_unstable();
        !self.bias.windows(2).any(|w| w[0].0 == w[1].0)
    }
}

/// `token`'s edit: its `bias`, then the penalties its entry in the history (`seen`) calls for;
/// `None` when nothing applies.
fn edit_of(
    params: &SamplingParams,
    token: TokenId,
    bias: Option<f32>,
    seen: Option<&TokenCount>,
) -> Option<LogitEdit> {
    let mut edit = LogitEdit {
        token,
        ops: if bias.is_some() { EDIT_BIAS } else { 0 },
        bias: bias.unwrap_or(0.0),
        repetition: params.repetition_penalty,
        frequency: 0.0,
        presence: params.presence_penalty,
    };
    if let Some(c) = seen {
        if params.repetition_penalty != 1.0 {
            edit.ops |= EDIT_REPETITION;
        }
        let penalties = params.presence_penalty != 0.0 || params.frequency_penalty != 0.0;
        if penalties && c.num_in_output > 0 {
            edit.ops |= EDIT_PENALTIES;
            // The CPU's `frequency * count as f32`.
            edit.frequency = params.frequency_penalty * c.num_in_output as f32;
        }
    }
    (edit.ops != 0).then_some(edit)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn history(prompt: &[TokenId], output: &[TokenId]) -> SeqContext {
        SeqContext::new(prompt.to_vec(), output)
    }

    fn build(params: &SamplingParams, h: Option<&SeqContext>) -> Option<Vec<LogitEdit>> {
        let mut out = vec![];
        EditBuilder::default().build(params, h, 100, &mut out).then_some(out)
    }

    #[test]
    fn one_edit_per_distinct_token_in_token_order() {
        let params = SamplingParams {
            logit_bias: vec![(9, 2.5), (3, -1.0), (500, 7.0)],
            repetition_penalty: 1.5,
            frequency_penalty: 0.25,
            presence_penalty: 0.5,
            ..SamplingParams::default()
        };
        let h = history(&[3, 4, 4], &[4, 7, 7, 7]);
        let edits = build(&params, Some(&h)).unwrap();
        let tokens: Vec<_> = edits.iter().map(|e| (e.token, e.ops)).collect();
        let (b, r, p) = (EDIT_BIAS, EDIT_REPETITION, EDIT_PENALTIES);
        // 500 is outside the vocabulary: dropped, as the CPU's `get_mut` drops it.
        assert_eq!(tokens, [(3, b | r), (4, r | p), (7, r | p), (9, b)]);
        assert_eq!(edits[0].bias, -1.0);
        assert_eq!(edits[1].frequency, 0.25);
        assert_eq!(edits[2].frequency, 0.75, "three 7s in the output");
        assert_eq!(edits[3].bias, 2.5);
    }

    #[test]
    fn edits_are_the_definition_over_the_whole_history() {
        let mut state = 3u64;
        let mut below = |n: usize| {
            state = state
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            ((state >> 33) % n as u64) as usize
        };
        for trial in 0..300 {
            let lens = [below(12), below(12), below(4)];
            // Tokens of a small alphabet, so that they repeat; bias also past the vocabulary (100).
            let mut tokens =
                |n: usize, of: usize| (0..n).map(|_| below(of) as TokenId).collect::<Vec<_>>();
            let (prompt, output, biased) =
                (tokens(lens[0], 40), tokens(lens[1], 40), tokens(lens[2], 110));
            let pick = |on: bool, value: f32| if on { value } else { 0.0 };
            let params = SamplingParams {
                logit_bias: biased.iter().map(|&t| (t, 0.5 + t as f32)).collect(),
                repetition_penalty: if below(2) == 0 { 1.0 } else { 1.25 },
                frequency_penalty: pick(below(2) == 0, -0.75),
                presence_penalty: pick(below(2) == 0, 0.5),
                ..SamplingParams::default()
            };
            let got = build(&params, Some(&history(&prompt, &output)));
            // By definition: every token of the vocabulary, the operations that touch it.
            let in_vocab: Vec<_> = biased.iter().filter(|&&t| (t as usize) < 100).collect();
            let twice =
                in_vocab.iter().any(|&&t| in_vocab.iter().filter(|&&&u| u == t).count() > 1);
            let want = (!twice).then(|| {
                let penalties = params.presence_penalty != 0.0 || params.frequency_penalty != 0.0;
                (0..100)
                    .filter_map(|token: TokenId| {
                        let bias = params.logit_bias.iter().find(|b| b.0 == token).map(|b| b.1);
                        let seen = prompt.contains(&token) || output.contains(&token);
                        let count = output.iter().filter(|&&t| t == token).count() as u32;
                        let count = if penalties { count } else { 0 };
                        let ops = bias.map_or(0, |_| EDIT_BIAS)
                            | if seen && params.repetition_penalty != 1.0 {
                                EDIT_REPETITION
                            } else {
                                0
                            }
                            | if count > 0 { EDIT_PENALTIES } else { 0 };
                        (ops != 0).then(|| LogitEdit {
                            token,
                            ops,
                            bias: bias.unwrap_or(0.0),
                            repetition: params.repetition_penalty,
                            frequency: params.frequency_penalty * count as f32,
                            presence: params.presence_penalty,
                        })
                    })
                    .collect::<Vec<_>>()
            });
            assert_eq!(got, want, "trial {trial}: {params:?} after {prompt:?} {output:?}");
        }
    }

    #[test]
    fn edits_apply_the_cpu_passes_in_order() {
        let e = LogitEdit {
            token: 0,
            ops: EDIT_BIAS | EDIT_REPETITION | EDIT_PENALTIES,
            bias: 1.0,
            repetition: 2.0,
            frequency: 0.5,
            presence: 0.25,
        };
        // (3 + 1) / 2 - 0.5 - 0.25, and (-3 + 1) * 2 - 0.5 - 0.25.
        assert_eq!(e.apply(3.0), 1.25);
        assert_eq!(e.apply(-3.0), -4.75);
        let mut words = [0u32; LOGIT_EDIT_WORDS];
        e.write(&mut words);
        assert_eq!(words[1], 7);
        assert_eq!(f32::from_bits(words[3]), 2.0);
    }

    #[test]
    fn no_history_means_no_penalty_edits() {
        let params = SamplingParams { repetition_penalty: 1.2, ..SamplingParams::default() };
        assert_eq!(build(&params, None).unwrap(), []);
        // Penalties off: the history is not looked at.
        let h = history(&[1, 2], &[3]);
        let bias = SamplingParams { logit_bias: vec![(5, 1.0)], ..SamplingParams::default() };
        assert_eq!(build(&bias, Some(&h)).unwrap().len(), 1);
    }

    #[test]
    fn a_token_biased_twice_is_refused_and_leaves_the_list_as_it_was() {
        let params =
            SamplingParams { logit_bias: vec![(5, 1.0), (5, 2.0)], ..SamplingParams::default() };
        let mut out = vec![LogitEdit {
            token: 1,
            ops: EDIT_BIAS,
            bias: 1.0,
            repetition: 1.0,
            frequency: 0.0,
            presence: 0.0,
        }];
        assert!(!EditBuilder::default().build(&params, None, 100, &mut out));
        assert_eq!(out.len(), 1);
    }
}
