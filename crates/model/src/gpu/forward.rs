//! One step on the device: the packed inputs uploaded in a few copies, the state copies, the
//! embedding, every block with its residual add fused into the next block's norm, and the final
//! norm over every row. All launches go on the compute stream; nothing here waits for the device.
//!
//! The order of operations is the CPU model's (`model.rs`, `layers/`), block by block, so the
//! kernels' per-op equalities carry over to the whole forward (see `docs/gpu.md`).

use super::{
    GpuModel,
    caches::{Activations, GpuCaches, GraphKey},
    weights::{GpuAttention, GpuBlock, GpuMamba, GpuMatrix, GpuMatrixData, GpuMlp, GpuMoe},
};
use crate::{
    config::FfnActivation,
    error::{ModelError, Result},
};
use routed_backend::{
    cuda::{
        DevSlice, DeviceArena, DeviceElem, Span,
        host::SampleParams,
        launch::{ATTN_PARTITION_TILES, ATTN_TILE, attention_parts},
        ops::{
            AttentionBuffers, AttentionParams, AttentionSplit, ConvParams, ExpertActivation,
            MambaSeqs, MoeSortBuffers, QkvHeadsBuffers, QkvHeadsParams, RouterParams, ScanParams,
            ScanWeights, Weights,
        },
    },
    step_inputs::{PackedStep, Section, StepInputLayout},
};
use routed_types::{ScheduledSeq, StepPlan};

/// Decode steps of up to this many sequences split attention over the keys' partitions: their
/// CTAs would otherwise be one per sequence and KV head, each reading its whole context alone
/// (4 CTAs for one sequence of a model with 4 KV heads, on a GPU of 132 SMs). On an H100
/// (`routed bench kernels`, qwen3_moe's 4 KV heads, `docs/performance.md`) split steps were 2.9x
/// faster at 64 sequences over 2048 positions and no faster at 256, so 64 is where splitting
/// stops. Either way a row's bits are the same.
pub(crate) const ATTENTION_SPLIT_MAX_SEQS: usize = 64;

/// Whether a step splits attention: a decode step of a few sequences, one of which has keys in
/// more than one partition.
fn splits_attention(plan: &StepPlan, num_seqs: usize) -> bool {
    let decode = plan.seqs.iter().all(|s| s.token_ids.len() == 1);
    let partition = ATTN_TILE * ATTN_PARTITION_TILES;
    decode
        && num_seqs <= ATTENTION_SPLIT_MAX_SEQS
        && plan.seqs.iter().any(|s| s.num_computed_tokens >= partition)
}

/// The sections of the uploaded step inputs as the kernels read them.
pub(crate) struct StepViews<'a> {
    pub token_ids: DevSlice<'a, u32>,
    pub positions: DevSlice<'a, i32>,
    pub slot_mapping: DevSlice<'a, i32>,
    pub seq_starts: DevSlice<'a, i32>,
    pub num_prompt: DevSlice<'a, i32>,
    pub attention_items: DevSlice<'a, i32>,
    pub live_slots: DevSlice<'a, i32>,
    pub state_copies: DevSlice<'a, i32>,
    pub tap_starts: DevSlice<'a, i32>,
    pub taps: DevSlice<'a, i32>,
    pub logit_rows: DevSlice<'a, i32>,
    pub sample_params: DevSlice<'a, SampleParams>,
    pub score_targets: DevSlice<'a, u32>,
    pub edit_starts: DevSlice<'a, i32>,
    pub logit_edits: DevSlice<'a, u32>,
    pub block_tables: DevSlice<'a, i32>,
}

fn memory(what: &str) -> ModelError {
    ModelError::Device(routed_backend::BackendError::Memory(format!("step inputs: {what}")))
}

impl<'a> StepViews<'a> {
    pub fn new(arena: &'a DeviceArena, inputs: Span<u32>, l: &StepInputLayout) -> Result<Self> {
        let words = arena.get(inputs)?;
        let view = |s: Section| -> Result<DevSlice<'a, u32>> {
            words.sub(s.offset, s.len).ok_or_else(|| memory("a section outside the buffer"))
        };
        fn cast<'a, U: DeviceElem>(s: DevSlice<'a, u32>) -> Result<DevSlice<'a, U>> {
            s.cast::<U>().ok_or_else(|| memory("a misaligned section"))
        }
        Ok(Self {
            token_ids: view(l.token_ids)?,
            positions: cast(view(l.positions)?)?,
            slot_mapping: cast(view(l.slot_mapping)?)?,
            seq_starts: cast(view(l.seq_starts)?)?,
            num_prompt: cast(view(l.num_prompt)?)?,
            attention_items: cast(view(l.attention_items)?)?,
            live_slots: cast(view(l.live_slots)?)?,
            state_copies: cast(view(l.state_copies)?)?,
            tap_starts: cast(view(l.tap_starts)?)?,
            taps: cast(view(l.taps)?)?,
            logit_rows: cast(view(l.logit_rows)?)?,
            sample_params: cast(view(l.sample_params)?)?,
            score_targets: view(l.score_targets)?,
            edit_starts: cast(view(l.edit_starts)?)?,
            logit_edits: view(l.logit_edits)?,
            block_tables: cast(view(l.block_tables)?)?,
        })
    }
}

/// Everything a block's launches read.
struct Ctx<'a> {
    model: &'a GpuModel,
    arena: &'a DeviceArena,
    caches: &'a GpuCaches,
    act: &'a Activations,
    v: StepViews<'a>,
    step: PackedStep,
    capture_routing: bool,
    /// Partitions attention is split over (`None`: every CTA takes all of its rows').
    split_parts: Option<usize>,
}

impl GpuModel {
    /// Packs `plan` into the staging buffer, uploads it and queues the forward up to the final
    /// norm of every row. Every MoE layer writes its plane of the routing buffer when
    /// `capture_routing`; `wants_logits` is false on ranks whose samples are not used.
    pub fn forward(
        &self,
        caches: &mut GpuCaches,
        plan: &StepPlan,
        wants_logits: bool,
        capture_routing: bool,
    ) -> Result<PackedStep> {
        let step = self.upload_step(caches, plan, None, wants_logits)?;
        let arena = caches.arena.clone();
        let mut ctx = Ctx::new(self, &arena, caches, step, capture_routing)?;
        if splits_attention(plan, step.num_seqs) {
            // Only the partitions the step's positions reach.
            let end = plan.seqs.iter().map(|s| s.num_computed_tokens + 1).max().unwrap_or(1);
            ctx.split_parts = Some(attention_parts(end, ATTN_PARTITION_TILES));
        }
        ctx.run()?;
        Ok(step)
    }

    /// [`GpuModel::forward`] of a decode step (one token per sequence, no state copy, no
    /// snapshot) through the CUDA graph of its batch size, captured on the first step of that
    /// size. `pad` is the sequence the batch is padded with up to the graph's size (one token
    /// without logits on the scratch block and scratch state), so a handful of graphs serve
    /// every decode step; a replay gives the eager forward's bits, since every kernel argument
    /// is a function of the batch size and the block tables' stride (the graph's key) and every
    /// input sits at a fixed address.
    pub fn forward_graph(
        &self,
        caches: &mut GpuCaches,
        plan: &StepPlan,
        pad: (&ScheduledSeq, usize),
        wants_logits: bool,
        capture_routing: bool,
    ) -> Result<PackedStep> {
        if caches.exchange.is_some() {
            return Err(ModelError::BadInput(
                "a rank of an expert-parallel group meets the other ranks on the host inside a \
                 step, which no graph holds: its steps run eagerly"
                    .into(),
            ));
        }
        let step = self.upload_step(caches, plan, Some(pad), wants_logits)?;
        if step.num_seqs != step.num_tokens || step.num_state_copies > 0 || step.num_taps > 0 {
            return Err(ModelError::BadInput(
                "a graph replays decode steps only: one token per sequence, no state copy or \
                 snapshot"
                    .into(),
            ));
        }
        // A graph's grid is fixed: split, it spans every partition its steps' positions can reach.
        let split = splits_attention(plan, step.num_seqs);
        let key = GraphKey {
            batch: step.num_tokens,
            capture_routing,
            split,
            table_stride: step.block_table_stride,
        };
        if !caches.graphs.contains_key(&key) {
            let arena = caches.arena.clone();
            let mut ctx = Ctx::new(self, &arena, caches, step, capture_routing)?;
            // Every position of the graph's steps lies in its sequence's table, so within the
            // stride's blocks: the split spans their partitions, not those of the longest context
            // the engine takes (80 at 40k positions, most of whose CTAs would only return).
            let reach = step.block_table_stride * caches.kv.block_size;
            let parts =
                attention_parts(reach.min(caches.shape.max_positions), ATTN_PARTITION_TILES);
            ctx.split_parts = split.then_some(parts);
            let graph = self.dev.capture(|| ctx.run())?;
            caches.graphs.insert(key, graph);
        }
        self.dev.replay(&caches.graphs[&key])?;
        Ok(step)
    }

    /// Packs `plan` into the staging buffer and queues its upload into the step inputs; for a
    /// graph, padded with `pad.0` to `pad.1` sequences.
    fn upload_step(
        &self,
        caches: &mut GpuCaches,
        plan: &StepPlan,
        pad: Option<(&ScheduledSeq, usize)>,
        wants_logits: bool,
    ) -> Result<PackedStep> {
        // Waits until the previous step's upload has read the staging buffer.
        let words = caches.staging.host_mut()?;
        let packed = match pad {
            Some((seq, batch)) => {
                caches.packer.pack_for_graph(plan, seq, batch, wants_logits, words)
            }
            None => caches.packer.pack(plan, wants_logits, words),
        };
        let step = packed.map_err(|e| ModelError::BadInput(e.to_string()))?;
        let arena = caches.arena.clone();
        let inputs = arena.get(caches.inputs)?;
        let stream = self.dev.compute_stream();
        for &s in caches.packer.uploads() {
            let to = inputs.sub(s.offset, s.len).expect("packed in place");
            if let Err(e) = caches.staging.copy_to_at(to, s.offset, stream) {
                // Some block-table rows may not have reached the device.
                caches.packer.forget_tables();
                return Err(e.into());
            }
        }
        #[cfg(debug_assertions)]
        {
            let num_pad = step.num_seqs - plan.seqs.len();
            let pads = pad.map(|(seq, _)| std::iter::repeat_n(seq, num_pad)).into_iter().flatten();
            check_tables(caches, plan.seqs.iter().chain(pads), step.block_table_stride)?;
        }
        Ok(step)
    }
}

/// Reads the block tables back from the device and checks that each row holds its sequence's
/// table, then -1: the rows a step did not upload must still be there from earlier steps (debug
/// builds, so every test on the simulator or a GPU checks it, a step's whole tables at a time).
#[cfg(debug_assertions)]
fn check_tables<'a>(
    caches: &GpuCaches,
    seqs: impl Iterator<Item = &'a ScheduledSeq>,
    stride: usize,
) -> Result<()> {
    let section = caches.packer.layout().block_tables;
    let seqs: Vec<_> = seqs.collect();
    let rows = caches.inputs.sub(section.offset, seqs.len() * stride).expect("in the section");
    let on_device = caches.arena.download(rows)?;
    for (i, (row, s)) in on_device.chunks(stride).zip(seqs).enumerate() {
        let table = s.block_table.iter().map(|b| b.block.index() as u32);
        let want = table.chain(std::iter::repeat(u32::MAX)).take(stride);
        assert!(row.iter().copied().eq(want), "block-table row {i} on the device: {row:?}");
    }
    Ok(())
}

impl<'a> Ctx<'a> {
    fn new(
        model: &'a GpuModel,
        arena: &'a DeviceArena,
        caches: &'a GpuCaches,
        step: PackedStep,
        capture_routing: bool,
    ) -> Result<Self> {
        let v = StepViews::new(arena, caches.inputs, caches.packer.layout())?;
        Ok(Ctx {
            model,
            arena,
            caches,
            act: &caches.act,
            v,
            step,
            capture_routing,
            split_parts: None,
        })
    }
}

impl Ctx<'_> {
    fn f32(&self, s: Span<f32>) -> Result<DevSlice<'_, f32>> {
        Ok(self.arena.get(s)?)
    }

    fn weight<T: DeviceElem>(&self, s: Span<T>) -> Result<DevSlice<'_, T>> {
        self.model.weights.get(s)
    }

    /// A matrix's values for the kernels that take any storage and arithmetic.
    fn weights(&self, d: GpuMatrixData) -> Result<Weights<'_>> {
        self.model.weights.values(d)
    }

    /// `out[m, rows] = x[m, cols] . w`, whatever the matrix's storage and arithmetic.
    fn gemm(&self, x: DevSlice<'_, f32>, w: &GpuMatrix, out: DevSlice<'_, f32>) -> Result<()> {
        let m = self.step.num_tokens;
        Ok(self.model.dev.gemm(x, self.weights(w.data)?, out, (m, w.rows, w.cols))?)
    }

    fn run(&self) -> Result<()> {
        let (dev, cfg, act) = (&self.model.dev, &self.model.config, self.act);
        let (n, h, eps) = (self.step.num_tokens, cfg.hidden_size, cfg.norm_eps);
        // Restores after a prefix hit and clears of sequences starting at 0, before any token.
        if let Some(pool) = self.caches.states.as_ref().filter(|_| self.step.num_state_copies > 0) {
            let (live, snapshots) = (self.f32(pool.live)?, self.f32(pool.snapshots)?);
            let pairs = self.v.state_copies;
            dev.state_copy(snapshots, live, pairs, self.step.num_state_copies, pool.slot_len())?;
        }
        let (x, normed, branch) = (self.f32(act.x)?, self.f32(act.normed)?, self.f32(act.branch)?);
        let w = &self.model.weights;
        let embed = self.weights(w.embed)?;
        dev.embed_gather(embed, self.v.token_ids, x, n, h, cfg.multipliers.embedding)?;
        let blocks = &w.blocks;
        let first_norm = blocks.first().map_or(w.final_norm, |(norm, _)| *norm);
        dev.rms_norm(x, self.weight(first_norm)?, normed, n, h, h, eps)?;
        for (i, (_, block)) in blocks.iter().enumerate() {
            match block {
                GpuBlock::Attention(a) => self.attention(a, normed, branch)?,
                GpuBlock::Mamba(m) => self.mamba(m, normed, branch)?,
                GpuBlock::Dense(m) => self.mlp(m, normed, branch)?,
                GpuBlock::Moe(m) => self.moe(m, normed, branch)?,
            }
            // The residual add, fused with the next block's norm (the final norm after the last).
            let next = blocks.get(i + 1).map_or(w.final_norm, |(norm, _)| *norm);
            let scale = cfg.multipliers.residual;
            dev.add_rms_norm(x, branch, self.weight(next)?, normed, n, h, scale, eps)?;
        }
        Ok(())
    }

    fn attention(
        &self,
        b: &GpuAttention,
        normed: DevSlice<'_, f32>,
        out: DevSlice<'_, f32>,
    ) -> Result<()> {
        let (dev, act, n) = (&self.model.dev, self.act, self.step.num_tokens);
        let c = &b.cfg;
        let (q, heads) = (self.f32(act.q)?, self.f32(act.attn)?);
        let kv = &self.caches.kv;
        let (kc, vc) = (self.arena.get(kv.k[b.kv_index])?, self.arena.get(kv.v[b.kv_index])?);
        self.heads(b, normed, q, (kc, vc))?;
        let params = AttentionParams {
            num_heads: c.num_heads,
            num_kv_heads: c.num_kv_heads,
            head_dim: c.head_dim,
            block_size: kv.block_size,
            max_blocks_per_seq: self.step.block_table_stride,
            sliding_window: c.sliding_window,
            scale: c.scale,
            partition_tiles: ATTN_PARTITION_TILES,
        };
        let buffers = AttentionBuffers {
            q,
            k_cache: kc,
            v_cache: vc,
            block_tables: self.v.block_tables,
            positions: self.v.positions,
            seq_starts: self.v.seq_starts,
            items: self.v.attention_items,
            out: heads,
        };
        let s = &self.step;
        let split = match self.split_parts {
            Some(num_parts) => {
                Some(AttentionSplit { partials: self.f32(act.attn_partials)?, num_parts })
            }
            None => None,
        };
        dev.paged_attention(&params, &buffers, (n, s.num_seqs, s.num_attention_items), split)?;
        self.gemm(heads, &b.o, out)
    }

    /// The step's heads: the fused q/k/v product of `normed`, then the queries normed and rotated
    /// into `q`, the keys and values into this layer's caches.
    fn heads(
        &self,
        b: &GpuAttention,
        normed: DevSlice<'_, f32>,
        q: DevSlice<'_, f32>,
        (k_cache, v_cache): (DevSlice<'_, half::bf16>, DevSlice<'_, half::bf16>),
    ) -> Result<()> {
        let c = &b.cfg;
        let qkv = self.f32(self.act.qkv)?;
        self.gemm(normed, &b.qkv, qkv)?;
        let rope = self.caches.rope.filter(|_| c.rope_theta.is_some());
        let params = QkvHeadsParams {
            num_heads: c.num_heads,
            num_kv_heads: c.num_kv_heads,
            head_dim: c.head_dim,
            rot_dim: c.head_dim,
            eps: b.eps,
        };
        let buffers = QkvHeadsBuffers {
            qkv,
            q_norm: b.q_norm.map(|s| self.weight(s)).transpose()?,
            k_norm: b.k_norm.map(|s| self.weight(s)).transpose()?,
            cos_sin: rope.map(|s| self.f32(s)).transpose()?,
            positions: self.v.positions,
            slots: self.v.slot_mapping,
            q,
            k_cache,
            v_cache,
        };
        Ok(self.model.dev.qkv_heads(&params, &buffers, self.step.num_tokens)?)
    }

    fn mamba(&self, b: &GpuMamba, normed: DevSlice<'_, f32>, out: DevSlice<'_, f32>) -> Result<()> {
        let (dev, act, n) = (&self.model.dev, self.act, self.step.num_tokens);
        let pool = self.caches.states.as_ref().expect("a hybrid model has state pools");
        let c = &b.cfg;
        let (d_inner, conv_dim) = (c.d_inner(), c.conv_dim());
        let proj_dim = b.in_proj.rows;
        let (proj, xbc, y) = (self.f32(act.proj)?, self.f32(act.xbc)?, self.f32(act.y)?);
        self.gemm(normed, &b.in_proj, proj)?;
        let states = (self.f32(pool.live)?, self.f32(pool.snapshots)?);
        let seqs = MambaSeqs {
            seq_starts: self.v.seq_starts,
            positions: self.v.positions,
            live_slots: self.v.live_slots,
            tap_starts: self.v.tap_starts,
            taps: self.v.taps,
            num_seqs: self.step.num_seqs,
            num_tokens: n,
        };
        let conv = ConvParams {
            proj_dim,
            xbc_offset: d_inner,
            conv_dim,
            conv_kernel: c.conv_kernel,
            slot_len: pool.slot_len(),
            conv_offset: pool.conv_offset(b.index),
        };
        let bias = b.conv_bias.map(|s| self.weight(s)).transpose()?;
        dev.mamba_conv1d(&conv, proj, self.weight(b.conv_weight_t)?, bias, states, &seqs, xbc)?;
        let scan = ScanParams {
            proj_dim: proj_dim as i32,
            dt_offset: (d_inner + conv_dim) as i32,
            conv_dim: conv_dim as i32,
            num_heads: c.num_heads as i32,
            head_dim: c.head_dim as i32,
            num_groups: c.num_groups as i32,
            state_size: c.state_size as i32,
            slot_len: pool.slot_len() as i32,
            ssm_offset: pool.ssm_offset(b.index) as i32,
            dt_min: c.dt_min_prompt.unwrap_or(f32::NEG_INFINITY),
            dt_max: c.dt_max_prompt.unwrap_or(f32::INFINITY),
        };
        let weights = ScanWeights {
            dt_bias: self.weight(b.dt_bias)?,
            a: self.weight(b.a)?,
            d: self.weight(b.d)?,
        };
        dev.mamba_scan(&scan, &weights, (xbc, proj), self.v.num_prompt, states, &seqs, y)?;
        let group = d_inner / c.norm_groups.max(1);
        let norm = self.weight(b.norm)?;
        dev.mamba_gated_norm(y, proj, norm, n, (d_inner, proj_dim), group, c.norm_eps)?;
        self.gemm(y, &b.out_proj, out)
    }

    fn mlp(&self, b: &GpuMlp, x: DevSlice<'_, f32>, out: DevSlice<'_, f32>) -> Result<()> {
        let (dev, act, n) = (&self.model.dev, self.act, self.step.num_tokens);
        let up = self.f32(act.up)?;
        self.gemm(x, &b.up, up)?;
        match (&b.gate, b.activation) {
            (Some(g), FfnActivation::SwiGlu) => {
                let gate = self.f32(act.gate)?;
                self.gemm(x, g, gate)?;
                dev.silu_mul(up, gate, n * b.inter)?;
            }
            (_, FfnActivation::Relu2) => dev.relu2(up, n * b.inter)?,
            (None, FfnActivation::SwiGlu) => unreachable!("SwiGLU blocks are built with a gate"),
        }
        self.gemm(up, &b.down, out)
    }

    fn moe(&self, b: &GpuMoe, normed: DevSlice<'_, f32>, out: DevSlice<'_, f32>) -> Result<()> {
        let (dev, n) = (&self.model.dev, self.step.num_tokens);
        let (h, e, k) = (self.model.config.hidden_size, b.shard.num_experts, b.top_k);
        let s = &self.act.moe;
        let logits = self.f32(s.router_logits)?;
        self.gemm(normed, &b.router, logits)?;
        let (ids, weights) = (self.arena.get(s.ids)?, self.f32(s.weights)?);
        let plane = match (&self.caches.routing, self.capture_routing) {
            (Some(r), true) => {
                let plane = r.plane(b.index).expect("one plane per MoE layer");
                Some(self.arena.get(plane)?)
            }
            _ => None,
        };
        let params = RouterParams { kind: b.kind, num_experts: e, top_k: k };
        let bias = b.router_bias.map(|s| self.weight(s)).transpose()?;
        dev.moe_router(&params, logits, bias, ids, weights, plane, n)?;
        let sort = MoeSortBuffers {
            sorted_pairs: self.arena.get(s.sorted_pairs)?,
            pair_rows: self.arena.get(s.pair_rows)?,
            expert_starts: self.arena.get(s.expert_starts)?,
        };
        dev.moe_sort(ids, &sort, n * k, e)?;
        let (act, expert_out) = (self.f32(s.act)?, self.f32(s.expert_out)?);
        let activation = match b.activation {
            FfnActivation::SwiGlu => ExpertActivation::SwiGlu,
            FfnActivation::Relu2 => ExpertActivation::Relu2,
        };
        let (up, gate) = (self.weights(b.up)?, b.gate.map(|g| self.weights(g)).transpose()?);
        dev.moe_expert_up(normed, up, gate, &sort, act, activation, (n, k), b.shard, (h, b.inter))?;
        let down = self.weights(b.down)?;
        dev.moe_expert_down(act, down, &sort, expert_out, (n * k, b.shard), (h, b.inter))?;
        if let Some(exchange) = &self.caches.exchange {
            // The other ranks' experts' rows.
            let mut exchange = exchange.borrow_mut();
            exchange.all_gather(dev, sort.expert_starts, expert_out, (n * k, b.shard), h)?;
        }
        let shared = match &b.shared {
            Some(m) => {
                let shared_out = self.f32(s.shared_out)?;
                self.mlp(m, normed, shared_out)?;
                Some(shared_out)
            }
            None => None,
        };
        dev.moe_combine(expert_out, sort.pair_rows, weights, shared, out, (n, k), h)?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use routed_types::{BlockGeneration, BlockId, BlockRef, SeqId};

    /// A sequence with `computed` tokens cached and `len` to compute.
    fn seq(computed: usize, len: usize) -> ScheduledSeq {
        let table = vec![BlockRef::new(BlockId(0), BlockGeneration(0))];
        ScheduledSeq::prompt_chunk(SeqId(computed as u64), vec![1; len], computed, table)
    }

    fn plan(seqs: Vec<ScheduledSeq>) -> StepPlan {
        StepPlan { seqs, ..StepPlan::default() }
    }

    #[test]
    fn decode_of_a_few_long_sequences_splits_attention() {
        let partition = ATTN_TILE * ATTN_PARTITION_TILES;
        // One sequence past the first partition, alone or beside short ones.
        assert!(splits_attention(&plan(vec![seq(partition, 1)]), 1));
        assert!(splits_attention(&plan(vec![seq(3, 1), seq(partition + 90, 1)]), 2));
        // Within the first partition there is nothing to split.
        assert!(!splits_attention(&plan(vec![seq(partition - 1, 1)]), 1));
        // A prefill chunk in the step, or more sequences than the threshold: every CTA takes all
        // its rows' partitions.
        assert!(!splits_attention(&plan(vec![seq(partition, 1), seq(0, 5)]), 2));
        let many = vec![seq(partition, 1); ATTENTION_SPLIT_MAX_SEQS + 1];
        assert!(!splits_attention(&plan(many), ATTENTION_SPLIT_MAX_SEQS + 1));
        // The padded batch of a graph counts.
        assert!(!splits_attention(&plan(vec![seq(partition, 1)]), ATTENTION_SPLIT_MAX_SEQS + 1));
    }
}
