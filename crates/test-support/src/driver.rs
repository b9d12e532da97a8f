//! A minimal single-threaded driver: gives each sequence its own contiguous blocks and live state
//! slot and runs prefill (optionally chunked, optionally from a snapshot) and greedy decode,
//! without the scheduler or the cache manager.

use routed_model::{
    KvCache, LiveStateId, LogitsWanted, Model, RoutingBuffer, SeqInput, StateCache, StateIo,
};
use routed_types::{BlockGeneration, BlockId, BlockRef, SnapshotSlotId, TokenId};

/// The result of a prefill: logits for every computed position and the routing of every computed
/// token, `[T, L, K]`.
pub struct Prefill {
    /// `[T, vocab]`.
    pub logits: Vec<f32>,
    /// `[T, L, K]` expert ids.
    pub routing: Vec<i16>,
}

/// A sequence's private resources.
#[derive(Clone, Debug)]
pub struct Seq {
    /// Its block table.
    pub table: Vec<BlockRef>,
    /// Its live state slot (unused by attention-only models).
    pub live: LiveStateId,
}

/// Runs a model on private block tables and state slots.
pub struct Driver<'m> {
    /// The model.
    pub model: &'m Model,
    /// Its KV cache.
    pub kv: KvCache,
    /// Its recurrent states: 16 live slots and 16 snapshot slots.
    pub states: StateCache,
    routing: RoutingBuffer,
    next_block: u32,
    next_live: u32,
}

impl<'m> Driver<'m> {
    /// A driver with room for `num_blocks` blocks of 4 tokens.
    pub fn new(model: &'m Model, num_blocks: usize) -> Self {
        Self {
            model,
            kv: model.new_kv_cache(num_blocks, 4),
            states: model.new_state_cache(16, 16),
            routing: model.new_routing_buffer(4096),
            next_block: 0,
            next_live: 0,
        }
    }

    /// A fresh sequence with blocks for `len` tokens and its own live state slot.
    pub fn seq(&mut self, len: usize) -> Seq {
        let n = len.div_ceil(self.kv.block_size()) as u32;
        let table = (self.next_block..self.next_block + n)
            .map(|b| BlockRef::new(BlockId(b), BlockGeneration(0)))
            .collect();
        self.next_block += n;
        assert!(self.next_block as usize <= self.kv.num_blocks(), "driver ran out of blocks");
        let live = LiveStateId(self.next_live);
        self.next_live += 1;
        Seq { table, live }
    }

    /// The state binding of `seq` for one forward, `None` for attention-only models.
    pub fn state<'a>(
        &self,
        seq: &Seq,
        restore_from: Option<SnapshotSlotId>,
        snapshots: &'a [(usize, SnapshotSlotId)],
    ) -> Option<StateIo<'a>> {
        self.model.config().is_hybrid().then_some(StateIo {
            live: seq.live,
            restore_from,
            snapshots,
        })
    }

    /// Runs a batch and returns, per sequence, its logits rows and its routing `[n, L, K]`.
    pub fn step(&mut self, seqs: &[SeqInput<'_>]) -> Vec<(Vec<f32>, Vec<i16>)> {
        let out = self
            .model
            .forward(seqs, &mut self.kv, &mut self.states, &mut self.routing)
            .expect("forward");
        let vocab = self.model.config().vocab_size;
        let mut first = 0;
        seqs.iter()
            .zip(&out.logits_rows)
            .map(|(s, rows)| {
                let n = s.token_ids.len();
                let routing = self.routing_rows(first, n);
                first += n;
                (out.logits[rows.start * vocab..rows.end * vocab].to_vec(), routing)
            })
            .collect()
    }

    /// Routing of step tokens `[first, first + n)` transposed from `(L, N, K)` to `[n, L, K]`.
    fn routing_rows(&self, first: usize, n: usize) -> Vec<i16> {
        let (l, k) = (self.routing.num_moe_layers(), self.routing.top_k());
        let mut rows = Vec::with_capacity(n * l * k);
        for t in first..first + n {
            for layer in 0..l {
                rows.extend_from_slice(self.routing.get(layer, t));
            }
        }
        rows
    }

    /// Prefills `prompt` in chunks of `chunk` tokens, returning all logits and routing.
    pub fn prefill(&mut self, prompt: &[TokenId], seq: &Seq, chunk: usize) -> Prefill {
        self.prefill_from(prompt, seq, 0, None, chunk, &[])
    }

    /// Prefills `prompt[start..]` in chunks of `chunk` tokens on a sequence whose first `start`
    /// tokens are already in its KV blocks, restoring its state from `restore` first and taking
    /// `snapshots` on the way.
    pub fn prefill_from(
        &mut self,
        prompt: &[TokenId],
        seq: &Seq,
        start: usize,
        restore: Option<SnapshotSlotId>,
        chunk: usize,
        snapshots: &[(usize, SnapshotSlotId)],
    ) -> Prefill {
        let mut result = Prefill { logits: Vec::new(), routing: Vec::new() };
        let mut at = start;
        while at < prompt.len() {
            let end = (at + chunk).min(prompt.len());
            let restore_from = if at == start { restore } else { None };
            let here: Vec<_> =
                snapshots.iter().copied().filter(|&(p, _)| p > at && p <= end).collect();
            let input = SeqInput {
                token_ids: &prompt[at..end],
                num_computed_tokens: at,
                num_prompt_tokens: prompt.len(),
                block_table: &seq.table,
                logits: LogitsWanted::All,
                state: self.state(seq, restore_from, &here),
            };
            let (logits, routing) = self.step(&[input]).pop().unwrap();
            result.logits.extend(logits);
            result.routing.extend(routing);
            at = end;
        }
        result
    }

    /// Greedy generation of `n` tokens after `prompt`: returns the tokens, the logits each was
    /// picked from (`[n, vocab]`) and the routing of every token fed to the model
    /// (`[prompt + n - 1, L, K]`).
    pub fn generate_greedy(
        &mut self,
        prompt: &[TokenId],
        n: usize,
    ) -> (Vec<TokenId>, Vec<f32>, Vec<i16>) {
        let vocab = self.model.config().vocab_size;
        let seq = self.seq(prompt.len() + n);
        let pre = self.prefill(prompt, &seq, prompt.len());
        let mut step_logits = pre.logits[(prompt.len() - 1) * vocab..].to_vec();
        let mut routing = pre.routing;
        let mut tokens = vec![argmax(&step_logits)];
        while tokens.len() < n {
            let last = [*tokens.last().unwrap()];
            let input = SeqInput {
                token_ids: &last,
                num_computed_tokens: prompt.len() + tokens.len() - 1,
                num_prompt_tokens: prompt.len(),
                block_table: &seq.table,
                logits: LogitsWanted::Last,
                state: self.state(&seq, None, &[]),
            };
            let (logits, r) = self.step(&[input]).pop().unwrap();
            tokens.push(argmax(&logits));
            step_logits.extend(logits);
            routing.extend(r);
        }
        (tokens, step_logits, routing)
    }
}

fn argmax(logits: &[f32]) -> TokenId {
    let mut best = 0;
    for (i, &v) in logits.iter().enumerate() {
        if v > logits[best] {
            best = i;
        }
    }
    best as TokenId
}
