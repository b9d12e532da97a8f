//! The scheduler <-> model runner contract: what one engine step computes ([`StepPlan`]) and what
//! it returns ([`StepOutput`]). Names follow vLLM v1 (`num_computed_tokens`, block tables, slot
//! mapping) so a reader who knows it can read ours cold.

use crate::{BlockRef, SamplingParams, SeqId, SnapshotSlotId, TokenCounts, TokenId, TokenMask};
use std::{ops::Range, sync::Arc};

/// Numbers engine steps in order; the routing host-cache's watermark is a step id.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct StepId(pub u64);

/// One sequence's share of a step.
#[derive(Clone, Debug)]
pub struct ScheduledSeq {
    /// The sequence.
    pub seq_id: SeqId,
    /// Tokens fed this step: a prefill chunk, or the token sampled last step.
    pub token_ids: StepTokens,
    /// Tokens already in the KV cache (computed or skipped); `token_ids[0]` sits here.
    pub num_computed_tokens: usize,
    /// Prompt length (positions at or past it are generated tokens).
    pub num_prompt_tokens: usize,
    /// The sequence's whole block table; the generations key the routing rows the step writes.
    /// Shared with the scheduler's copy: a step hands it on without copying it (a long
    /// sequence's table is thousands of blocks, and every decode step carries it).
    pub block_table: Arc<[BlockRef]>,
    /// Live Mamba state slot (hybrid models).
    pub live_state: Option<u32>,
    /// Copy this snapshot into the live state before the forward.
    pub restore_from: Option<SnapshotSlotId>,
    /// `(position, slot)`: snapshot the live state after `position` tokens.
    pub snapshots: Vec<(usize, SnapshotSlotId)>,
    /// Sample the next token from the last position, with these parameters, as the
    /// `sample_index`-th generated token. `None` for an intermediate prefill chunk.
    pub sample: Option<(Arc<SamplingParams>, u64)>,
    /// The tokens before this step, for sequences whose sampling or prompt logprobs need them
    /// (penalties, prompt logprobs); `None` otherwise, so most steps carry nothing extra.
    pub context: Option<SeqContext>,
    /// Return the logprobs of the prompt tokens this chunk predicts, with this many top
    /// alternatives (the request asked for prompt logprobs and the chunk covers prompt
    /// positions).
    pub prompt_logprobs: Option<u32>,
}

impl ScheduledSeq {
    /// Prompt tokens `token_ids` after `num_computed_tokens` cached ones, on `block_table`: no
    /// state slot, snapshot, sampling, context or prompt logprobs (set those after, as needed).
    pub fn prompt_chunk(
        seq_id: SeqId,
        token_ids: impl Into<StepTokens>,
        num_computed_tokens: usize,
        block_table: impl Into<Arc<[BlockRef]>>,
    ) -> Self {
        let token_ids = token_ids.into();
        Self {
            seq_id,
            num_prompt_tokens: num_computed_tokens + token_ids.len(),
            token_ids,
            num_computed_tokens,
            block_table: block_table.into(),
            live_state: None,
            restore_from: None,
            snapshots: Vec::new(),
            sample: None,
            context: None,
            prompt_logprobs: None,
        }
    }
}

/// The tokens a step feeds one sequence, held without a copy where they can be: every decode
/// step feeds each sequence one token, and a prefill chunk is a range of the prompt the scheduler
/// already shares, so a plan allocates nothing per sequence for its tokens. Reads as a slice.
#[derive(Clone, Debug)]
pub enum StepTokens {
    /// The token sampled last step (a decode).
    One(TokenId),
    /// A range of the prompt (a prefill chunk).
    Prompt {
        /// The whole prompt, shared with the scheduler.
        prompt: Arc<Vec<TokenId>>,
        /// The positions fed.
        range: Range<usize>,
    },
    /// Tokens of their own: a chunk that reaches into generated tokens (recomputed after a
    /// preemption), or a plan made by hand.
    Owned(Vec<TokenId>),
}

impl std::ops::Deref for StepTokens {
    type Target = [TokenId];

    fn deref(&self) -> &[TokenId] {
        match self {
            Self::One(token) => std::slice::from_ref(token),
            Self::Prompt { prompt, range } => &prompt[range.clone()],
            Self::Owned(tokens) => tokens,
        }
    }
}

impl PartialEq for StepTokens {
    /// The same tokens, however held.
    fn eq(&self, other: &Self) -> bool {
        **self == **other
    }
}

impl From<Vec<TokenId>> for StepTokens {
    fn from(tokens: Vec<TokenId>) -> Self {
        Self::Owned(tokens)
    }
}

/// A sequence's tokens beyond the step's own, for the samplers and prompt logprobs that need them.
#[derive(Clone, Debug, Default)]
pub struct SeqContext {
    /// The whole prompt.
    pub prompt: Arc<Vec<TokenId>>,
    /// The prompt's and the tokens generated before this step's distinct tokens with their
    /// counts, when the sequence's penalties need them (shared with the scheduler, which adds
    /// each sampled token).
    pub history: Option<Arc<TokenCounts>>,
    /// The tokens the request's output constraint allows next (`response_format`), when it has
    /// one; the samplers choose among them only.
    pub allowed: Option<Arc<TokenMask>>,
    /// The tokens the request's bad words rule out next, sorted (empty for most requests).
    pub banned: Arc<[TokenId]>,
    /// The tokens whose logprobs each scored prompt position reports (the request's
    /// `logprob_token_ids`).
    pub logprob_token_ids: Arc<[TokenId]>,
}

impl SeqContext {
    /// The context of a sequence that generated `output` after `prompt`, with its counts.
    pub fn new(prompt: Vec<TokenId>, output: &[TokenId]) -> Self {
        let history = Some(Arc::new(TokenCounts::new(&prompt, output)));
        Self { prompt: Arc::new(prompt), history, ..Self::default() }
    }
}

/// Everything a runner needs to execute one engine step.
#[derive(Clone, Debug, Default)]
pub struct StepPlan {
    /// The step.
    pub step_id: StepId,
    /// Sequences in batch order.
    pub seqs: Vec<ScheduledSeq>,
    /// Whether to hand the step's routing to the copy worker.
    pub capture_routing: bool,
}

impl StepPlan {
    /// Tokens computed by the step.
    pub fn num_tokens(&self) -> usize {
        self.seqs.iter().map(|s| s.token_ids.len()).sum()
    }
}

/// One sampled token and its logprobs.
#[derive(Clone, Debug, PartialEq)]
pub struct SampledToken {
    /// The chosen token.
    pub token: TokenId,
    /// Its logprob under the raw model distribution (before temperature, top-k, top-p).
    pub logprob: f32,
    /// The most likely alternatives with their logprobs, when the request asked for them.
    pub top_logprobs: Vec<(TokenId, f32)>,
    /// The token's 1-based rank in the raw distribution, in the order of `top_logprobs`
    /// (descending, ties to the lower id), so a token among the alternatives has its position
    /// there. Computed whenever logprobs are (vLLM reports it with prompt logprobs); `None`
    /// otherwise.
    pub rank: Option<u32>,
    /// The logprobs of the tokens the request names (`logprob_token_ids`), in its order, when it
    /// asked for logprobs here; empty otherwise.
    pub token_id_logprobs: Vec<f32>,
}

/// What a runner returns for a step.
#[derive(Clone, Debug, Default)]
pub struct StepOutput {
    /// The step.
    pub step_id: StepId,
    /// Per scheduled sequence, in plan order: the sampled token when the plan asked for one.
    pub sampled: Vec<Option<SampledToken>>,
    /// Prompt logprobs, for the scheduled sequences that asked for them (none: empty).
    pub prompt_logprobs: Vec<PromptLogprobs>,
}

/// The prompt logprobs one chunk computed: for prompt positions `first_position..`, each prompt
/// token's logprob given the tokens before it (`token` is the prompt token).
#[derive(Clone, Debug, PartialEq)]
pub struct PromptLogprobs {
    /// The sequence's index in the plan.
    pub seq_index: usize,
    /// The prompt position of `entries[0]` (at least 1: the first token has no logprob).
    pub first_position: usize,
    /// One per predicted prompt token, in order.
    pub entries: Vec<SampledToken>,
}
