//! A loaded model and its forward pass over a ragged batch.

use crate::{
    batch::{ForwardOutput, LogitsWanted, RoutingBuffer, SeqInput},
    config::{MixerKind, ModelConfig},
    error::{ModelError, Result},
    kv::KvCache,
    layers::{StepTokens, attention::Attention, mamba::Mamba, mlp::Mlp, moe::Moe},
    shard::{ExpertShard, LoadStats},
    state::{StateCache, StateLayout},
    workspace::{Workspace, zeroed},
};
use routed_backend::collective::{Collective, SingleRank};
use routed_backend::cpu::{self, MatmulPrecision, Matrix};
use routed_types::RoutingMeta;
use std::sync::{Arc, Mutex};

/// A token mixer of a decoder layer.
pub(crate) enum Mixer {
    Attention(Attention),
    Mamba(Mamba),
}

/// A feed-forward block of a decoder layer.
pub(crate) enum Ffn {
    Dense(Mlp),
    Moe(Moe),
}

/// One decoder layer: an optional pre-normed mixer and an optional pre-normed feed-forward block,
/// each added to the residual stream.
pub(crate) struct Layer {
    pub mixer: Option<(Vec<f32>, Mixer)>,
    pub ffn: Option<(Vec<f32>, Ffn)>,
}

/// A model ready to run on the CPU backend: the whole model, or one rank's part of it under
/// expert parallelism (see [`ExpertShard`]).
pub struct Model {
    pub(crate) config: ModelConfig,
    pub(crate) embed: Matrix,
    pub(crate) layers: Vec<Layer>,
    pub(crate) final_norm: Vec<f32>,
    /// `None` when tied to the embedding.
    pub(crate) lm_head: Option<Matrix>,
    /// Activation buffers of finished forwards, taken by the next ones.
    pub(crate) workspaces: Mutex<Vec<Workspace>>,
    /// Logits buffers given back after sampling ([`Model::recycle_logits`]). A batch's logits
    /// are tens of MB: allocated afresh each step, the kernel would map and zero them each time.
    pub(crate) logits_buffers: Mutex<Vec<Vec<f32>>>,
    /// Which experts this rank holds.
    pub(crate) shard: ExpertShard,
    /// How the ranks exchange expert outputs.
    pub(crate) collective: Arc<dyn Collective>,
    /// What loading read.
    pub(crate) load_stats: LoadStats,
}

/// The caches a model needs depend on its configuration only: a worker whose weights are released
/// still sizes them.
impl ModelConfig {
    /// A KV cache of `num_blocks` blocks of `block_size` tokens for every attention layer.
    pub fn new_kv_cache(&self, num_blocks: usize, block_size: usize) -> KvCache {
        let num_attn = self.layers.iter().filter(|l| l.mixer == MixerKind::Attention).count();
        let width = self.attention.as_ref().map_or(0, |a| a.num_kv_heads * a.head_dim);
        KvCache::new(num_attn, num_blocks, block_size, width)
    }

    /// Recurrent-state storage: `num_live` live slots (plus a scratch slot for dummy forwards) and
    /// `num_snapshots` snapshot slots. Empty for models without Mamba layers.
    pub fn new_state_cache(&self, num_live: usize, num_snapshots: usize) -> StateCache {
        match &self.mamba {
            Some(m) => {
                let n = self.layers.iter().filter(|l| l.mixer == MixerKind::Mamba).count();
                StateCache::new(StateLayout::new(m, n), num_live, num_snapshots)
            }
            None => StateCache::empty(),
        }
    }
}

/// Bytes of an MLP's matrices.
fn mlp_bytes(m: &Mlp) -> usize {
    m.gate.as_ref().map_or(0, Matrix::bytes) + m.up.bytes() + m.down.bytes()
}

/// Bytes of a layer's matrices, its routed experts counted by `experts`.
fn layer_bytes(layer: &Layer, experts: impl Fn(&Moe) -> usize) -> usize {
    let mixer = match layer.mixer.as_ref().map(|m| &m.1) {
        Some(Mixer::Attention(a)) => {
            a.q_proj.bytes() + a.k_proj.bytes() + a.v_proj.bytes() + a.o_proj.bytes()
        }
        Some(Mixer::Mamba(m)) => m.in_proj.bytes() + m.out_proj.bytes(),
        None => 0,
    };
    let ffn = match layer.ffn.as_ref().map(|f| &f.1) {
        Some(Ffn::Dense(m)) => mlp_bytes(m),
        Some(Ffn::Moe(moe)) => {
            moe.router.bytes() + experts(moe) + moe.shared.as_ref().map_or(0, mlp_bytes)
        }
        None => 0,
    };
    mixer + ffn
}

impl Model {
    /// A whole (single-rank) model from its parts.
    pub(crate) fn new(
        config: ModelConfig,
        embed: Matrix,
        layers: Vec<Layer>,
        final_norm: Vec<f32>,
        lm_head: Option<Matrix>,
    ) -> Self {
        Self {
            config,
            embed,
            layers,
            final_norm,
            lm_head,
            workspaces: Mutex::default(),
            logits_buffers: Mutex::default(),
            shard: ExpertShard::WHOLE,
            collective: Arc::new(SingleRank),
            load_stats: LoadStats::default(),
        }
    }

    /// Which experts this rank holds.
    pub fn shard(&self) -> ExpertShard {
        self.shard
    }

    /// The expert-parallel group this rank belongs to.
    pub fn collective(&self) -> &Arc<dyn Collective> {
        &self.collective
    }

    /// What loading read from the checkpoint.
    pub fn load_stats(&self) -> LoadStats {
        self.load_stats
    }

    /// The normalised configuration.
    pub fn config(&self) -> &ModelConfig {
        &self.config
    }

    /// Bytes of weights one decoded token reads, in their in-memory dtype: every matrix except
    /// the embedding table (one row of it) and, in each MoE layer, only `top_k` experts. The
    /// memory-bandwidth roofline of batch-1 decode is bandwidth divided by this.
    pub fn weight_bytes_per_token(&self) -> usize {
        let embed_row = self.embed.bytes() / self.embed.rows().max(1);
        let head = self.lm_head.as_ref().unwrap_or(&self.embed).bytes();
        let layers = self.layers.iter().map(|layer| {
            layer_bytes(layer, |moe| moe.cfg.top_k * moe.experts.first().map_or(0, mlp_bytes))
        });
        embed_row + head + layers.sum::<usize>()
    }

    /// Bytes of the matrices this rank holds in memory (every expert of its shard; the norms,
    /// biases and convolution vectors beside them are a rounding error).
    pub fn weight_bytes(&self) -> usize {
        let (embed, head) = (self.embed.bytes(), self.lm_head.as_ref().map_or(0, Matrix::bytes));
        let layers = self
            .layers
            .iter()
            .map(|layer| layer_bytes(layer, |moe| moe.experts.iter().map(mlp_bytes).sum()));
        embed + head + layers.sum::<usize>()
    }

    /// Gives a step's logits buffer back for the next forward to fill (once sampled).
    pub fn recycle_logits(&self, logits: Vec<f32>) {
        let mut pool = self.logits_buffers.lock().unwrap_or_else(|e| e.into_inner());
        // One per forward in flight is all that is ever taken at once.
        if pool.len() < 2 {
            pool.push(logits);
        }
    }

    /// Sets the arithmetic of every product with bf16 weights: the projections, the experts
    /// and the LM head. Routers keep `f32` products whatever the precision, so that rounding
    /// the inputs never moves a routing decision that sits near a tie.
    pub fn set_matmul_precision(&mut self, precision: MatmulPrecision) {
        let mlp = |m: &mut Mlp| {
            for w in m.gate.iter_mut().chain([&mut m.up, &mut m.down]) {
                w.set_precision(precision);
            }
        };
        self.embed.set_precision(precision);
        if let Some(w) = &mut self.lm_head {
            w.set_precision(precision);
        }
        for layer in &mut self.layers {
            match layer.mixer.as_mut().map(|m| &mut m.1) {
                Some(Mixer::Attention(a)) => {
                    for w in [&mut a.q_proj, &mut a.k_proj, &mut a.v_proj, &mut a.o_proj] {
                        w.set_precision(precision);
                    }
                }
                Some(Mixer::Mamba(m)) => {
                    m.in_proj.set_precision(precision);
                    m.out_proj.set_precision(precision);
                }
                None => {}
            }
            match layer.ffn.as_mut().map(|f| &mut f.1) {
                Some(Ffn::Dense(m)) => mlp(m),
                Some(Ffn::Moe(moe)) => {
                    moe.experts.iter_mut().chain(moe.shared.as_mut()).for_each(mlp);
                }
                None => {}
            }
        }
    }

    /// The arithmetic of the products with bf16 weights (that of the LM head, which every
    /// setting covers).
    pub fn matmul_precision(&self) -> MatmulPrecision {
        self.lm_head.as_ref().unwrap_or(&self.embed).precision()
    }

    /// What a routing consumer needs to read this model's rows.
    pub fn routing_meta(&self) -> Option<RoutingMeta> {
        let moe = self.config.moe.as_ref()?;
        Some(RoutingMeta {
            num_layers: self.config.layers.len() as u32,
            moe_layer_ids: self.config.moe_layer_ids(),
            num_experts: moe.num_experts as u32,
            top_k: moe.top_k as u32,
        })
    }

    /// A KV cache sized for this model ([`ModelConfig::new_kv_cache`]).
    pub fn new_kv_cache(&self, num_blocks: usize, block_size: usize) -> KvCache {
        self.config.new_kv_cache(num_blocks, block_size)
    }

    /// Recurrent-state storage for this model ([`ModelConfig::new_state_cache`]).
    pub fn new_state_cache(&self, num_live: usize, num_snapshots: usize) -> StateCache {
        self.config.new_state_cache(num_live, num_snapshots)
    }

    /// A routing buffer for steps of up to `max_tokens` tokens.
    pub fn new_routing_buffer(&self, max_tokens: usize) -> RoutingBuffer {
        let (l, k) = self.routing_meta().map_or((0, 0), |m| (m.num_moe_layers(), m.top_k as usize));
        RoutingBuffer::new(l, k, max_tokens)
    }

    /// Runs one step over `seqs`: writes their keys and values into `kv`, advances their recurrent
    /// state in `states` (restoring and taking the snapshots each sequence names), writes their
    /// expert choices into `routing` (`(L, N, K)` over the step's tokens in sequence order) and
    /// returns the logits each sequence asked for.
    pub fn forward(
        &self,
        seqs: &[SeqInput<'_>],
        kv: &mut KvCache,
        states: &mut StateCache,
        routing: &mut RoutingBuffer,
    ) -> Result<ForwardOutput> {
        let tokens = self.step_tokens(seqs, kv)?;
        self.prepare_states(seqs, states)?;
        let n = tokens.positions.len();
        if !routing.begin_step(n) {
            return Err(ModelError::BadInput(format!(
                "{n} tokens exceed the routing buffer's {}",
                routing.max_tokens()
            )));
        }
        // One lock to take a workspace and one to give it back: per step, never per token.
        let pool = || self.workspaces.lock().unwrap_or_else(|e| e.into_inner());
        let mut ws = pool().pop().unwrap_or_default();
        let out = self.layers_forward(seqs, &tokens, kv, states, routing, &mut ws);
        pool().push(ws);
        let logits = out?;
        Ok(ForwardOutput { slot_mapping: tokens.slots, ..logits })
    }

    /// The embedding, every layer and the head, on the buffers of `ws`.
    fn layers_forward(
        &self,
        seqs: &[SeqInput<'_>],
        tokens: &StepTokens,
        kv: &mut KvCache,
        states: &mut StateCache,
        routing: &mut RoutingBuffer,
        ws: &mut Workspace,
    ) -> Result<ForwardOutput> {
        let (n, h) = (tokens.positions.len(), self.config.hidden_size);
        let Workspace { x, normed, branch, attention, mamba, moe, mlp } = ws;
        let x = zeroed(x, n * h);
        let ids = seqs.iter().flat_map(|s| s.token_ids.iter());
        for (row, &id) in x.chunks_exact_mut(h).zip(ids) {
            self.embed.row_into(id as usize, row);
        }
        let mult = self.config.multipliers;
        if mult.embedding != 1.0 {
            cpu::scale_inplace(x, mult.embedding);
        }
        let normed = zeroed(normed, n * h);
        let branch = zeroed(branch, n * h);
        let mut moe_index = 0;
        for layer in &self.layers {
            if let Some((norm, mixer)) = &layer.mixer {
                cpu::rms_norm(x, norm, self.config.norm_eps, normed);
                match mixer {
                    Mixer::Attention(a) => a.forward(normed, tokens, seqs, kv, branch, attention),
                    Mixer::Mamba(m) => m.forward(normed, tokens, seqs, states, branch, mamba),
                }
                add_residual(x, branch, mult.residual);
            }
            if let Some((norm, ffn)) = &layer.ffn {
                cpu::rms_norm(x, norm, self.config.norm_eps, normed);
                match ffn {
                    Ffn::Dense(m) => m.forward(normed, branch, mlp),
                    Ffn::Moe(m) => {
                        let ids = routing.layer_mut(moe_index);
                        m.forward(normed, branch, ids, moe, self.collective.as_ref())?;
                        moe_index += 1;
                    }
                }
                add_residual(x, branch, mult.residual);
            }
        }
        Ok(self.logits(seqs, tokens, x))
    }

    fn logits(&self, seqs: &[SeqInput<'_>], tokens: &StepTokens, x: &[f32]) -> ForwardOutput {
        let h = self.config.hidden_size;
        let mut rows = Vec::new();
        let mut logits_rows = Vec::with_capacity(seqs.len());
        for (seq, range) in seqs.iter().zip(&tokens.seq_ranges) {
            let start = rows.len();
            match seq.logits {
                LogitsWanted::None => {}
                LogitsWanted::Last => rows.push(range.end - 1),
                LogitsWanted::All => rows.extend(range.clone()),
            }
            logits_rows.push(start..rows.len());
        }
        let mut normed = vec![0.0f32; rows.len() * h];
        for (o, &r) in normed.chunks_exact_mut(h).zip(&rows) {
            cpu::rms_norm(&x[r * h..(r + 1) * h], &self.final_norm, self.config.norm_eps, o);
        }
        let head = self.lm_head.as_ref().unwrap_or(&self.embed);
        let mut logits = self.logits_buffers.lock().unwrap_or_else(|e| e.into_inner()).pop();
        let logits = logits.get_or_insert_default();
        zeroed(logits, rows.len() * self.config.vocab_size);
        let mut logits = std::mem::take(logits);
        cpu::linear(&normed, head, &mut logits);
        let scaling = self.config.multipliers.logits_scaling;
        if scaling != 1.0 {
            cpu::scale_inplace(&mut logits, 1.0 / scaling);
        }
        ForwardOutput { logits, logits_rows, slot_mapping: Vec::new() }
    }

    /// Checks every sequence's state slots, then restores snapshots and clears the live state of
    /// sequences that start from position 0.
    fn prepare_states(&self, seqs: &[SeqInput<'_>], states: &mut StateCache) -> Result<()> {
        if !self.config.is_hybrid() {
            return Ok(());
        }
        for (i, seq) in seqs.iter().enumerate() {
            let io = seq.state.ok_or_else(|| {
                ModelError::BadInput(format!("sequence {i} of a hybrid model has no state slot"))
            })?;
            if !states.check_live(io.live) {
                return Err(ModelError::BadInput(format!(
                    "sequence {i}: live state slot {} outside the pool",
                    io.live.0
                )));
            }
            let end = seq.num_computed_tokens + seq.token_ids.len();
            for &(pos, slot) in io
                .snapshots
                .iter()
                .chain(io.restore_from.map(|s| (seq.num_computed_tokens, s)).iter())
            {
                if !states.check_snapshot(slot) || pos < seq.num_computed_tokens || pos > end {
                    return Err(ModelError::BadInput(format!(
                        "sequence {i}: bad snapshot {slot:?} at position {pos}"
                    )));
                }
            }
            if seqs[..i].iter().any(|s| s.state.is_some_and(|o| o.live == io.live)) {
                return Err(ModelError::BadInput(format!(
                    "sequence {i} shares live state slot {}",
                    io.live.0
                )));
            }
        }
        for seq in seqs {
            let io = seq.state.expect("checked above");
            match io.restore_from {
                Some(slot) => states.restore(slot, io.live),
                None if seq.num_computed_tokens == 0 => states.clear_live(io.live),
                None => {}
            }
        }
        Ok(())
    }

    /// Validates the batch and lays out each token's position, sequence and KV slot.
    fn step_tokens(&self, seqs: &[SeqInput<'_>], kv: &KvCache) -> Result<StepTokens> {
        let n: usize = seqs.iter().map(|s| s.token_ids.len()).sum();
        let mut tokens = StepTokens {
            positions: Vec::with_capacity(n),
            seq_of: Vec::with_capacity(n),
            slots: Vec::with_capacity(n),
            seq_ranges: Vec::with_capacity(seqs.len()),
        };
        for (i, seq) in seqs.iter().enumerate() {
            // Every sequence has blocks for its positions, attention or not: routing rows are
            // stored per KV block.
            if seq.token_ids.is_empty() {
                return Err(ModelError::BadInput(format!("sequence {i} has no tokens")));
            }
            if let Some(&bad) =
                seq.token_ids.iter().find(|&&t| t as usize >= self.config.vocab_size)
            {
                return Err(ModelError::BadInput(format!(
                    "token id {bad} is outside the vocabulary of {}",
                    self.config.vocab_size
                )));
            }
            let end = seq.num_computed_tokens + seq.token_ids.len();
            if seq.block_table.len() * kv.block_size() < end {
                return Err(ModelError::BadInput(format!(
                    "sequence {i}: {} blocks cannot hold {end} tokens",
                    seq.block_table.len()
                )));
            }
            if let Some(b) = seq.block_table.iter().find(|b| b.block.index() >= kv.num_blocks()) {
                return Err(ModelError::BadInput(format!(
                    "sequence {i}: block {b:?} outside the pool"
                )));
            }
            let first = tokens.positions.len();
            for p in seq.num_computed_tokens..end {
                tokens.positions.push(p);
                tokens.seq_of.push(i);
                tokens.slots.push(kv.slot(seq.block_table, p));
            }
            tokens.seq_ranges.push(first..tokens.positions.len());
        }
        Ok(tokens)
    }
}

fn add_residual(x: &mut [f32], branch: &[f32], scale: f32) {
    if scale == 1.0 {
        cpu::add_assign(x, branch);
    } else {
        x.iter_mut().zip(branch).for_each(|(a, b)| *a += scale * b);
    }
}
