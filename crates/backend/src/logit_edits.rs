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

use routed_types::{SamplingParams, SeqContext, TokenId};

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
    /// `(token, source)` before sorting: 0 bias (with its index), 1 history, 2 output.
    keys: Vec<(TokenId, u8, u32)>,
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
        self.keys.clear();
        for (i, &(token, _)) in params.logit_bias.iter().enumerate() {
            if (token as usize) < vocab_size {
                self.keys.push((token, 0, i as u32));
            }
        }
        if let Some(h) = history.filter(|_| params.needs_history()) {
            if params.repetition_penalty != 1.0 {
                self.keys.extend(h.prompt.iter().map(|&t| (t, 1, 0)));
                self.keys.extend(h.output.iter().map(|&t| (t, 1, 0)));
            }
            if params.presence_penalty != 0.0 || params.frequency_penalty != 0.0 {
                self.keys.extend(h.output.iter().map(|&t| (t, 2, 0)));
            }
        }
        self.keys.sort_unstable();
        let start = out.len();
        for run in self.keys.chunk_by(|a, b| a.0 == b.0) {
            let mut edit = LogitEdit {
                token: run[0].0,
                ops: 0,
                bias: 0.0,
                repetition: params.repetition_penalty,
                frequency: 0.0,
                presence: params.presence_penalty,
            };
            let mut count = 0u32;
            for &(_, source, index) in run {
                match source {
                    0 if edit.ops & EDIT_BIAS != 0 => {
                        out.truncate(start);
                        return false;
                    }
                    0 => {
                        edit.ops |= EDIT_BIAS;
                        edit.bias = params.logit_bias[index as usize].1;
                    }
                    1 => edit.ops |= EDIT_REPETITION,
                    _ => {
                        edit.ops |= EDIT_PENALTIES;
                        count += 1;
                    }
                }
            }
            // The CPU's `frequency * run.len() as f32`.
            edit.frequency = params.frequency_penalty * count as f32;
            out.push(edit);
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    fn history(prompt: &[TokenId], output: &[TokenId]) -> SeqContext {
        SeqContext { prompt: Arc::new(prompt.to_vec()), output: output.to_vec() }
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
