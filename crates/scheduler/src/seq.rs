//! One sequence (one sampled continuation) as the scheduler tracks it.

use crate::json_mode::JsonConstraint;
use routed_types::{
    BlockRef, SampledToken, SamplingParams, SeqId, StepTokens, TokenCounts, TokenId,
};
use std::{ops::Range, sync::Arc};

/// Where a sequence is in its life.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SeqStatus {
    /// Waiting for admission (new, or preempted).
    Waiting,
    /// Admitted: holds blocks (and a live state slot on hybrid models).
    Running,
    /// Done generating; holds its blocks until its routing rows have been read.
    Finishing,
}

/// A sequence to add.
#[derive(Clone, Debug)]
pub struct NewSeq {
    /// Its id.
    pub id: SeqId,
    /// The prompt (shared between the continuations of one request).
    pub prompt: Arc<Vec<TokenId>>,
    /// Sampling and stop parameters (seed already offset for continuation `i`).
    pub params: Arc<SamplingParams>,
    /// Prefix-cache salt.
    pub cache_salt: Option<String>,
}

/// A sequence's state.
#[derive(Clone, Debug)]
pub struct Seq {
    /// Its id.
    pub id: SeqId,
    /// The prompt.
    pub prompt: Arc<Vec<TokenId>>,
    /// Generated tokens.
    pub output: Vec<TokenId>,
    /// The distinct tokens of the prompt and the output with their counts, kept when the
    /// sampling parameters' penalties need them.
    pub history: Option<Arc<TokenCounts>>,
    /// Sampling and stop parameters.
    pub params: Arc<SamplingParams>,
    /// Lifecycle state.
    pub status: SeqStatus,
    /// Block table with each block's generation (empty while waiting). Replaced, never
    /// changed in place, when blocks are added: each step's plan shares it.
    pub blocks: Arc<[BlockRef]>,
    /// Tokens in the KV cache (computed or skipped).
    pub num_computed_tokens: usize,
    /// Prompt tokens skipped by a prefix hit at the latest admission.
    pub num_cached_tokens: usize,
    /// Live Mamba state slot while running (hybrid models).
    pub live_state: Option<u32>,
    /// Whether any forward has computed part of it (else an abort returns no routing).
    pub ever_computed: bool,
    /// When the request asked for prompt logprobs: entry `i` is prompt token `i + 1`'s.
    pub prompt_logprobs: Vec<SampledToken>,
    /// The output read so far and the tokens allowed next, for a `json_object` response format.
    pub json: Option<JsonConstraint>,
    /// The tokens its bad words ruled out when it last sampled (shared with that step's plan).
    pub banned: Arc<[TokenId]>,
}

impl Seq {
    /// A new sequence, waiting with nothing computed or generated.
    pub fn waiting(new: NewSeq, history: Option<Arc<TokenCounts>>) -> Self {
        Self {
            id: new.id,
            prompt: new.prompt,
            output: Vec::new(),
            history,
            params: new.params,
            status: SeqStatus::Waiting,
            blocks: Arc::from([]),
            num_computed_tokens: 0,
            num_cached_tokens: 0,
            live_state: None,
            ever_computed: false,
            prompt_logprobs: Vec::new(),
            json: None,
            banned: Arc::default(),
        }
    }

    /// Prompt plus generated tokens.
    pub fn num_tokens(&self) -> usize {
        self.prompt.len() + self.output.len()
    }

    /// Token at `position` (prompt or generated).
    pub fn token(&self, position: usize) -> TokenId {
        let p = self.prompt.len();
        if position < p { self.prompt[position] } else { self.output[position - p] }
    }

    /// The tokens at `positions`, for a step to feed: a range of the shared prompt or the one
    /// token a decode feeds, copied only when a chunk reaches into the output past its first
    /// token (recomputed after a preemption).
    pub fn tokens(&self, positions: Range<usize>) -> StepTokens {
        if positions.end <= self.prompt.len() {
            StepTokens::Prompt { prompt: Arc::clone(&self.prompt), range: positions }
        } else if positions.len() == 1 {
            StepTokens::One(self.token(positions.start))
        } else {
            StepTokens::Owned(positions.map(|p| self.token(p)).collect())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use routed_types::RequestId;

    fn seq(prompt: Vec<TokenId>, output: Vec<TokenId>) -> Seq {
        let new = NewSeq {
            id: SeqId::new(RequestId(1), 0),
            prompt: Arc::new(prompt),
            params: Arc::new(SamplingParams::greedy(8)),
            cache_salt: None,
        };
        Seq { output, ..Seq::waiting(new, None) }
    }

    #[test]
    fn step_tokens_are_the_positions_tokens_copied_only_past_the_prompt() {
        let s = seq(vec![10, 11, 12, 13], vec![20, 21, 22]);
        for start in 0..s.num_tokens() {
            for end in start + 1..=s.num_tokens() {
                let tokens = s.tokens(start..end);
                let expected: Vec<TokenId> = (start..end).map(|p| s.token(p)).collect();
                assert_eq!(*tokens, expected, "positions {start}..{end}");
                match tokens {
                    StepTokens::Prompt { prompt, .. } => {
                        assert!(end <= 4 && Arc::ptr_eq(&prompt, &s.prompt), "shared prompt");
                    }
                    StepTokens::One(_) => assert!(end > 4 && end - start == 1),
                    StepTokens::Owned(_) => assert!(end > 4 && end - start > 1),
                }
            }
        }
    }
}
