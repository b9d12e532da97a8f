//! A minimal single-threaded driver: gives each sequence its own contiguous blocks and runs
//! prefill (optionally chunked) and greedy decode, without the scheduler or the cache manager.

use routed_model::{KvCache, LogitsWanted, Model, RoutingBuffer, SeqInput};
use routed_types::{BlockId, TokenId};

/// The result of a prefill: logits for every prompt position and the routing of every prompt
/// token, `[T, L, K]`.
pub struct Prefill {
    /// `[T, vocab]`.
    pub logits: Vec<f32>,
    /// `[T, L, K]` expert ids.
    pub routing: Vec<i16>,
}

/// Runs a model on private block tables.
pub struct Driver<'m> {
    /// The model.
    pub model: &'m Model,
    /// Its KV cache.
    pub kv: KvCache,
    routing: RoutingBuffer,
    next_block: u32,
}

impl<'m> Driver<'m> {
    /// A driver with room for `num_blocks` blocks of 4 tokens.
    pub fn new(model: &'m Model, num_blocks: usize) -> Self {
        Self {
            model,
            kv: model.new_kv_cache(num_blocks, 4),
            routing: model.new_routing_buffer(4096),
            next_block: 0,
        }
    }

    /// A fresh block table long enough for `len` tokens.
    pub fn blocks(&mut self, len: usize) -> Vec<BlockId> {
        let n = len.div_ceil(self.kv.block_size()) as u32;
        let table = (self.next_block..self.next_block + n).map(BlockId).collect();
        self.next_block += n;
        assert!(self.next_block as usize <= self.kv.num_blocks(), "driver ran out of blocks");
        table
    }

    /// Runs a batch and returns, per sequence, its logits rows and its routing `[n, L, K]`.
    pub fn step(&mut self, seqs: &[SeqInput<'_>]) -> Vec<(Vec<f32>, Vec<i16>)> {
        let out = self.model.forward(seqs, &mut self.kv, &mut self.routing).expect("forward");
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

    /// Prefills `prompt` on `table` in chunks of `chunk` tokens, returning all logits and routing.
    pub fn prefill(&mut self, prompt: &[TokenId], table: &[BlockId], chunk: usize) -> Prefill {
        let mut result = Prefill { logits: Vec::new(), routing: Vec::new() };
        for (i, c) in prompt.chunks(chunk).enumerate() {
            let seq = SeqInput {
                token_ids: c,
                num_computed_tokens: i * chunk,
                num_prompt_tokens: prompt.len(),
                block_table: table,
                logits: LogitsWanted::All,
                state: None,
            };
            let (logits, routing) = self.step(&[seq]).pop().unwrap();
            result.logits.extend(logits);
            result.routing.extend(routing);
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
        let table = self.blocks(prompt.len() + n);
        let pre = self.prefill(prompt, &table, prompt.len());
        let mut step_logits = pre.logits[(prompt.len() - 1) * vocab..].to_vec();
        let mut routing = pre.routing;
        let mut tokens = vec![routing_model_argmax(&step_logits)];
        while tokens.len() < n {
            let last = [*tokens.last().unwrap()];
            let seq = SeqInput {
                token_ids: &last,
                num_computed_tokens: prompt.len() + tokens.len() - 1,
                num_prompt_tokens: prompt.len(),
                block_table: &table,
                logits: LogitsWanted::Last,
                state: None,
            };
            let (logits, r) = self.step(&[seq]).pop().unwrap();
            tokens.push(routing_model_argmax(&logits));
            step_logits.extend(logits);
            routing.extend(r);
        }
        (tokens, step_logits, routing)
    }
}

fn routing_model_argmax(logits: &[f32]) -> TokenId {
    let mut best = 0;
    for (i, &v) in logits.iter().enumerate() {
        if v > logits[best] {
            best = i;
        }
    }
    best as TokenId
}
