//! A worker's device pools, allocated once in one arena: the paged KV cache, the Mamba live and
//! snapshot states, the routing buffer `(L, N, K)`, the packed step inputs, the rotary table and
//! every activation buffer of the largest step. Plus the page-locked host buffers of a step: the
//! inputs' staging, the sampled ids and logprobs, and the logits rows the host finishes.

use crate::{
    config::{MixerKind, ModelConfig},
    error::Result,
    gpu::{
        exchange::Exchange,
        forward::ATTENTION_SPLIT_MAX_SEQS,
        weights::{GpuBlock, GpuWeights},
    },
};
use routed_backend::{
    collective::Collective,
    cuda::{
        ArenaLayout, CudaDevice, DeviceArena, Graph, Span,
        host::{PinnedBuffer, rope_table},
        launch::{ATTN_PARTITION_TILES, attention_parts},
        ops::AttentionSplit,
        pools::{KvPool, RoutingBuffer, StatePool},
    },
    step_inputs::{AttentionTiling, PackGeometry, StepCapacity, StepPacker},
};
use routed_types::MAX_LOGPROBS;
use std::{cell::RefCell, collections::HashMap, sync::Arc};

/// What a worker's pools are sized for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GpuCacheShape {
    /// KV blocks, the scratch block included.
    pub num_blocks: usize,
    /// Tokens per block.
    pub block_size: usize,
    /// Live Mamba state slots for sequences (a scratch slot is added).
    pub num_live_states: usize,
    /// Mamba snapshot slots.
    pub num_snapshot_slots: usize,
    /// Tokens, sequences, taps and table entries of the largest step.
    pub capacity: StepCapacity,
    /// Positions must be below this (rows of the rotary table).
    pub max_positions: usize,
    /// Logits rows computed at once; at least `capacity.max_seqs`, so every device-sampled row
    /// fits the first chunk.
    pub logits_chunk_rows: usize,
    /// Tokens and logprobs are computed on the device; `false` sends every row to the host.
    pub device_sampling: bool,
}

/// Activation buffers for the largest step.
pub(crate) struct Activations {
    pub x: Span<f32>,
    pub normed: Span<f32>,
    pub branch: Span<f32>,
    /// The fused projection's heads, `[tokens, num_heads + 2 * num_kv_heads, head_dim]`.
    pub qkv: Span<f32>,
    /// The queries normed and rotated, `[tokens, num_heads, head_dim]`.
    pub q: Span<f32>,
    pub attn: Span<f32>,
    /// Split attention's partition results, `[ATTENTION_SPLIT_MAX_SEQS, num_heads, parts,
    /// 2 + head_dim]` with the partitions of `max_positions`.
    pub attn_partials: Span<f32>,
    pub proj: Span<f32>,
    pub xbc: Span<f32>,
    pub y: Span<f32>,
    pub up: Span<f32>,
    pub gate: Span<f32>,
    pub moe: MoeScratch,
    /// The gathered final hidden rows of a logits chunk, `[chunk, hidden]`.
    pub selected: Span<f32>,
    /// `[chunk, vocab]`.
    pub logits: Span<f32>,
    pub sampled: Span<u32>,
    pub log_z: Span<f32>,
    pub logprobs: Span<f32>,
    /// Each device row's token's rank, `[chunk]`.
    pub ranks: Span<u32>,
    /// Each device row's most likely tokens and their logprobs, `[chunk, MAX_LOGPROBS]`.
    pub top_ids: Span<u32>,
    pub top_logprobs: Span<f32>,
    /// The raw logits the logit edits replace while a token is chosen, `[max_logit_edits]`.
    pub edit_saved: Span<f32>,
}

/// The MoE block's scratch (shared by every MoE layer).
pub(crate) struct MoeScratch {
    pub router_logits: Span<f32>,
    pub ids: Span<i32>,
    pub weights: Span<f32>,
    pub sorted_pairs: Span<i32>,
    pub pair_rows: Span<i32>,
    pub expert_starts: Span<i32>,
    pub act: Span<f32>,
    pub expert_out: Span<f32>,
    pub shared_out: Span<f32>,
}

/// What a decode graph's launches are fixed by: the padded batch, whether routing is captured,
/// whether attention is split, and the block tables' stride.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct GraphKey {
    pub batch: usize,
    pub capture_routing: bool,
    pub split: bool,
    pub table_stride: usize,
}

/// A worker's device pools and host buffers.
pub struct GpuCaches {
    /// The decode graphs captured so far, by [`GraphKey`]: they hold the addresses of the buffers
    /// below.
    pub(crate) graphs: HashMap<GraphKey, Graph>,
    pub(crate) shape: GpuCacheShape,
    pub(crate) arena: Arc<DeviceArena>,
    pub(crate) kv: KvPool,
    pub(crate) states: Option<StatePool>,
    pub(crate) routing: Option<RoutingBuffer>,
    pub(crate) inputs: Span<u32>,
    pub(crate) rope: Option<Span<f32>>,
    pub(crate) act: Activations,
    pub(crate) packer: StepPacker,
    pub(crate) staging: PinnedBuffer<u32>,
    pub(crate) sampled_host: PinnedBuffer<u32>,
    pub(crate) logprobs_host: PinnedBuffer<f32>,
    pub(crate) ranks_host: PinnedBuffer<u32>,
    pub(crate) top_ids_host: PinnedBuffer<u32>,
    pub(crate) top_logprobs_host: PinnedBuffer<f32>,
    pub(crate) logits_host: PinnedBuffer<f32>,
    /// The expert rows' way between the ranks of an expert-parallel group (none on one rank).
    pub(crate) exchange: Option<RefCell<Exchange>>,
}

/// The routing buffer and the arena that holds it, for the copy to the host.
pub struct RoutingSource {
    /// Keeps the buffer's memory alive while copies read it.
    pub arena: Arc<DeviceArena>,
    /// The buffer's planes.
    pub buffer: RoutingBuffer,
}

/// Every span of the pools, before allocation.
struct Reserved {
    layout: ArenaLayout,
    kv: KvPool,
    states: Option<StatePool>,
    routing: Option<RoutingBuffer>,
    inputs: Span<u32>,
    rope: Option<Span<f32>>,
    act: Activations,
    packer: StepPacker,
}

/// The packer's view of the model and pools.
fn geometry(config: &ModelConfig, shape: &GpuCacheShape) -> PackGeometry {
    let hybrid = config.is_hybrid();
    PackGeometry {
        vocab_size: config.vocab_size,
        block_size: shape.block_size,
        num_blocks: shape.num_blocks,
        max_positions: shape.max_positions,
        num_live_states: hybrid.then_some(shape.num_live_states),
        num_snapshot_slots: shape.num_snapshot_slots,
        attention: config.attention.as_ref().map(|a| AttentionTiling {
            group: a.num_heads / a.num_kv_heads.max(1),
            rows_per_item: routed_backend::cuda::launch::ATTN_ROWS,
        }),
        logits_chunk_rows: shape.logits_chunk_rows,
    }
}

fn count(config: &ModelConfig, kind: MixerKind) -> usize {
    config.layers.iter().filter(|l| l.mixer == kind).count()
}

fn reserve(config: &ModelConfig, weights: &GpuWeights, shape: &GpuCacheShape) -> Reserved {
    let mut l = ArenaLayout::new("caches");
    let n = shape.capacity.max_tokens;
    let attn_kv = config.attention.as_ref().map_or(0, |a| a.num_kv_heads * a.head_dim);
    let kv = KvPool::reserve(
        &mut l,
        count(config, MixerKind::Attention),
        shape.num_blocks,
        shape.block_size,
        attn_kv,
    );
    let states = config.mamba.as_ref().map(|m| {
        let layers = count(config, MixerKind::Mamba);
        let (conv, ssm) =
            (m.conv_dim() * (m.conv_kernel - 1), m.num_heads * m.head_dim * m.state_size);
        StatePool::reserve(
            &mut l,
            layers,
            conv,
            ssm,
            shape.num_live_states,
            shape.num_snapshot_slots,
        )
    });
    let routing = config.moe.as_ref().map(|m| {
        let layers = config.moe_layer_ids().len();
        RoutingBuffer::reserve(&mut l, layers, n, m.top_k)
    });
    let mut packer = StepPacker::new(shape.capacity, geometry(config, shape));
    if !shape.device_sampling {
        packer.sample_on_host();
    }
    let inputs = l.push::<u32>(packer.layout().num_words());
    let rope = config.attention.as_ref().filter(|a| a.rope_theta.is_some()).map(|a| {
        // `[max_positions, head_dim / 2, (cos, sin)]`.
        l.push::<f32>(shape.max_positions * a.head_dim)
    });
    let act = activations(&mut l, config, weights, shape);
    Reserved { layout: l, kv, states, routing, inputs, rope, act, packer }
}

/// Every activation buffer of a step of `shape.capacity.max_tokens` tokens.
fn activations(
    l: &mut ArenaLayout,
    config: &ModelConfig,
    weights: &GpuWeights,
    shape: &GpuCacheShape,
) -> Activations {
    let (n, h, v) = (shape.capacity.max_tokens, config.hidden_size, config.vocab_size);
    let (attn_q, attn_kv) = config
        .attention
        .as_ref()
        .map_or((0, 0), |a| (a.num_heads * a.head_dim, a.num_kv_heads * a.head_dim));
    let (proj, conv_dim, d_inner) = config.mamba.as_ref().map_or((0, 0, 0), |m| {
        (m.d_inner() + m.conv_dim() + m.num_heads, m.conv_dim(), m.d_inner())
    });
    // Dense blocks and shared experts share the MLP buffers.
    let mlp_inter = weights
        .blocks
        .iter()
        .filter_map(|(_, b)| match b {
            GpuBlock::Dense(m) => Some(m.inter),
            GpuBlock::Moe(m) => m.shared.as_ref().map(|s| s.inter),
            _ => None,
        })
        .max()
        .unwrap_or(0);
    let chunk = shape.logits_chunk_rows;
    Activations {
        x: l.push(n * h),
        normed: l.push(n * h),
        branch: l.push(n * h),
        qkv: l.push(n * (attn_q + 2 * attn_kv)),
        q: l.push(n * attn_q),
        attn: l.push(n * attn_q),
        attn_partials: l.push(config.attention.as_ref().map_or(0, |a| {
            let parts = attention_parts(shape.max_positions, ATTN_PARTITION_TILES);
            let seqs = ATTENTION_SPLIT_MAX_SEQS.min(n);
            AttentionSplit::partials_len(seqs, a.num_heads, a.head_dim, parts)
        })),
        proj: l.push(n * proj),
        xbc: l.push(n * conv_dim),
        y: l.push(n * d_inner),
        up: l.push(n * mlp_inter),
        gate: l.push(n * mlp_inter),
        moe: moe_scratch(l, config, n),
        selected: l.push(chunk * h),
        logits: l.push(chunk * v),
        sampled: l.push(chunk),
        log_z: l.push(chunk),
        logprobs: l.push(chunk),
        ranks: l.push(chunk),
        top_ids: l.push(chunk * MAX_LOGPROBS as usize),
        top_logprobs: l.push(chunk * MAX_LOGPROBS as usize),
        edit_saved: l.push(shape.capacity.max_logit_edits),
    }
}

fn moe_scratch(l: &mut ArenaLayout, config: &ModelConfig, n: usize) -> MoeScratch {
    let (e, k, inter) =
        config.moe.as_ref().map_or((0, 0, 0), |m| (m.num_experts, m.top_k, m.expert_intermediate));
    let h = config.hidden_size;
    let pairs = n * k;
    // The sorted layout: a row per pair.
    let rows = if e > 0 { pairs } else { 0 };
    MoeScratch {
        router_logits: l.push(n * e),
        ids: l.push(pairs),
        weights: l.push(pairs),
        sorted_pairs: l.push(rows),
        pair_rows: l.push(pairs),
        expert_starts: l.push(e + 1),
        act: l.push(rows * inter),
        expert_out: l.push(rows * h),
        shared_out: l.push(
            if config.moe.as_ref().is_some_and(|m| m.shared_intermediate.is_some()) {
                n * h
            } else {
                0
            },
        ),
    }
}

impl GpuCaches {
    /// Device bytes the pools of `shape` take.
    pub(crate) fn device_bytes(
        config: &ModelConfig,
        weights: &GpuWeights,
        shape: &GpuCacheShape,
    ) -> usize {
        reserve(config, weights, shape).layout.num_bytes()
    }

    /// Allocates the pools (zeroed) and the host buffers, and fills the rotary table.
    pub(crate) fn new(
        dev: &CudaDevice,
        config: &ModelConfig,
        weights: &GpuWeights,
        ranks: &Arc<dyn Collective>,
        shape: GpuCacheShape,
    ) -> Result<Self> {
        let r = reserve(config, weights, &shape);
        let mut arena = DeviceArena::new(dev, &r.layout)?;
        let exchange = match &config.moe {
            Some(m) if ranks.world_size() > 1 => {
                let expert_out = arena.get(r.act.moe.expert_out)?;
                let sizes = (m.num_experts, config.hidden_size);
                Some(RefCell::new(Exchange::new(dev, ranks.clone(), sizes, expert_out)?))
            }
            _ => None,
        };
        if let (Some(span), Some(a)) = (r.rope, config.attention.as_ref()) {
            let theta = a.rope_theta.expect("a rotary table only with rope_theta");
            arena.upload(span, &rope_table(theta, a.head_dim, shape.max_positions))?;
        }
        let chunk = shape.logits_chunk_rows;
        Ok(Self {
            graphs: HashMap::new(),
            staging: PinnedBuffer::new(dev, r.packer.layout().num_words())?,
            sampled_host: PinnedBuffer::new(dev, chunk)?,
            logprobs_host: PinnedBuffer::new(dev, chunk)?,
            ranks_host: PinnedBuffer::new(dev, chunk)?,
            top_ids_host: PinnedBuffer::new(dev, chunk * MAX_LOGPROBS as usize)?,
            top_logprobs_host: PinnedBuffer::new(dev, chunk * MAX_LOGPROBS as usize)?,
            logits_host: PinnedBuffer::new(dev, chunk * config.vocab_size)?,
            exchange,
            shape,
            arena: Arc::new(arena),
            kv: r.kv,
            states: r.states,
            routing: r.routing,
            inputs: r.inputs,
            rope: r.rope,
            act: r.act,
            packer: r.packer,
        })
    }

    /// What the pools are sized for.
    pub fn shape(&self) -> &GpuCacheShape {
        &self.shape
    }

    /// Drops the decode graphs captured so far (they hold the addresses of the weights and of
    /// these pools); the next decode steps capture them again. Returns how many were dropped.
    pub fn drop_graphs(&mut self) -> usize {
        let n = self.graphs.len();
        self.graphs.clear();
        n
    }

    /// The routing buffer, for the copy engine; `None` for a model without MoE layers.
    pub fn routing_source(&self) -> Option<RoutingSource> {
        let buffer = self.routing.clone()?;
        Some(RoutingSource { arena: self.arena.clone(), buffer })
    }

    /// Where each sequence of the last step has its logits rows.
    pub fn logit_uses(&self) -> &[routed_backend::step_inputs::LogitUse] {
        self.packer.logit_uses()
    }

    /// The prompt positions the last step scored on the device.
    pub fn score_uses(&self) -> &[routed_backend::step_inputs::ScoreUse] {
        self.packer.score_uses()
    }
}
