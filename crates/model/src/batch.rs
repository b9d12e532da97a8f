//! The inputs and outputs of one forward call: a ragged batch in which each sequence contributes a
//! prefill chunk or one decode token.

use routed_types::{BlockRef, SnapshotSlotId, TokenId};

/// Which logits a sequence wants back from a forward.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LogitsWanted {
    /// None (an intermediate prefill chunk).
    None,
    /// The last position only (sampling the next token).
    Last,
    /// Every position of the chunk (scoring, golden tests).
    All,
}

/// Where a hybrid sequence's recurrent state lives and which snapshots a forward reads or writes.
#[derive(Clone, Copy, Debug)]
pub struct StateIo<'a> {
    /// The sequence's private live state (conv + SSM per Mamba layer).
    pub live: LiveStateId,
    /// Copy this snapshot into the live state before the forward (the first chunk after a
    /// prefix-cache hit). Without it, a sequence whose `num_computed_tokens` is 0 starts from zeros.
    pub restore_from: Option<SnapshotSlotId>,
    /// `(position, slot)`: after the token at `position - 1` has been processed (so the state
    /// covers exactly `position` tokens), copy the live state into `slot`.
    pub snapshots: &'a [(usize, SnapshotSlotId)],
}

/// A live-state slot of the Mamba state pool: one per running hybrid sequence, plus scratch.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct LiveStateId(pub u32);

/// One sequence's part of a forward.
#[derive(Clone, Copy, Debug)]
pub struct SeqInput<'a> {
    /// The tokens fed this step (a prefill chunk, or the one token sampled last step).
    pub token_ids: &'a [TokenId],
    /// Tokens of this sequence already in the KV cache; `token_ids[0]` sits at this position.
    pub num_computed_tokens: usize,
    /// Prompt length: positions at or past it hold generated tokens (some families compute those
    /// slightly differently, see `docs/ARCHITECTURE.md`).
    pub num_prompt_tokens: usize,
    /// Physical KV blocks of the sequence, covering at least every position up to the chunk's end.
    pub block_table: &'a [BlockRef],
    /// Which logits to return.
    pub logits: LogitsWanted,
    /// Recurrent state, for hybrid models (`None` for attention-only models).
    pub state: Option<StateIo<'a>>,
}

/// Expert ids chosen by every MoE layer for every token of a step, laid out `(L, N, K)`.
///
/// The buffer is allocated once for the largest step and reused, so its storage never moves
/// (a fixed address is what CUDA graphs will need).
#[derive(Clone, Debug)]
pub struct RoutingBuffer {
    num_moe_layers: usize,
    top_k: usize,
    num_tokens: usize,
    ids: Vec<i16>,
}

impl RoutingBuffer {
    /// A buffer for up to `max_tokens` tokens per step.
    pub fn new(num_moe_layers: usize, top_k: usize, max_tokens: usize) -> Self {
        Self {
            num_moe_layers,
            top_k,
            num_tokens: 0,
            ids: vec![-1; num_moe_layers * top_k * max_tokens],
        }
    }

    /// Tokens of the last step.
    pub fn num_tokens(&self) -> usize {
        self.num_tokens
    }

    /// MoE layers (`L`).
    pub fn num_moe_layers(&self) -> usize {
        self.num_moe_layers
    }

    /// Experts per token (`K`).
    pub fn top_k(&self) -> usize {
        self.top_k
    }

    /// Largest step the buffer holds.
    pub fn max_tokens(&self) -> usize {
        self.ids.len() / (self.num_moe_layers * self.top_k).max(1)
    }

    /// The last step's ids, `(L, N, K)` row-major.
    pub fn ids(&self) -> &[i16] {
        &self.ids[..self.num_moe_layers * self.num_tokens * self.top_k]
    }

    /// The ids of token `t` at MoE layer `l`.
    pub fn get(&self, l: usize, t: usize) -> &[i16] {
        let at = (l * self.num_tokens + t) * self.top_k;
        &self.ids[at..at + self.top_k]
    }

    /// Starts a step of `num_tokens` tokens; `false` (and nothing changes) when they do not fit.
    pub fn begin_step(&mut self, num_tokens: usize) -> bool {
        if num_tokens > self.max_tokens() {
            return false;
        }
        self.num_tokens = num_tokens;
        true
    }

    /// MoE layer `l`'s ids of the current step, `[num_tokens, top_k]`, for writing.
    pub fn layer_mut(&mut self, l: usize) -> &mut [i16] {
        let n = self.num_tokens * self.top_k;
        &mut self.ids[l * n..(l + 1) * n]
    }
}

/// What a forward returns besides the routing (which it writes into the caller's buffer).
#[derive(Clone, Debug, Default)]
pub struct ForwardOutput {
    /// Logits rows, `vocab_size` each, in sequence order: for each sequence, nothing, its last
    /// position or all its positions, as it asked.
    pub logits: Vec<f32>,
    /// For each sequence, the range of rows of `logits` that belong to it.
    pub logits_rows: Vec<std::ops::Range<usize>>,
    /// The KV slot of every token of the step, in batch order: where its routing row is stored.
    pub slot_mapping: Vec<usize>,
}
