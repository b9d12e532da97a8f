//! The CUDA worker (feature `cuda`): one rank's model on a GPU.
//!
//! The weights are uploaded once from the host model the loader built; the KV blocks, the Mamba
//! live and snapshot states, the routing buffer and every activation live in pools allocated once
//! ([`GpuCaches`]). A step is an upload, from page-locked memory, of what the step changed of the
//! packed step inputs, the forward on the compute stream, and the sampled ids with their logprobs
//! back; a row's bias and penalties are applied on the device as per-token edits, min-p inside the
//! sampling kernel, and prompt logprobs are scored there too. Rows that need the host (edits past
//! the step's list, every row with `device_sampling` off) come back as logits and go through the
//! CPU sampler. Prefix caching follows the CPU rules: snapshots at the positions the plan names
//! (taps in the conv and scan kernels), restores by copy, and the dummy forward on the scratch
//! block and scratch state only.
//!
//! Routing: every MoE layer's router writes its plane of the routing buffer `(L, N, K)` int16 at
//! a fixed address. [`CudaCopyEngine`] copies a step's rows on the copy stream into page-locked
//! slots: an event recorded behind the forward orders the copy, each slot's event is recorded
//! after its copy, and the compute stream waits on that event before the next forward writes the
//! buffer again: the copy worker waits on the slot's event on its own thread, compute never
//! waits on the host.
//!
//! Decode steps replay CUDA graphs, one per padded batch size ([`graph_batch`]) and block-table
//! stride, padded with one token on the scratch block and scratch state; everything else runs
//! eagerly.
//!
//! Memory given back between rollout steps ([`Worker::release_memory`]): the weights' arena is
//! freed with its layout kept and allocated again on resume, where the checkpoint's values are
//! written into it (its address may change, so the decode graphs are dropped and captured again);
//! the KV cache goes with every other pool, the copy engine letting go of the routing buffer
//! while its host slots stay, and comes back as new pools of the same shape.
//!
//! Under expert parallelism each rank is a worker on its own device holding a slice of every MoE
//! layer's experts; the ranks exchange expert rows through the host inside every MoE layer
//! (`routed_model::gpu`'s exchange), so their steps run eagerly. Only rank 0 computes logits and
//! captures routing.
//!
//! CI runs all of it on the CUDA simulator; `docs/gpu.md` records its runs on an H100.

use super::{
    AbortOnExit, CacheShape, CudaLimits, ExecutedStep, LockstepId, Worker, WorkerError,
    cuda_copy::CudaCopyEngine, sampling, written_blocks,
};
use crate::{MemoryTags, routing_ring::CopyEngine};
use routed_backend::{
    cpu::MatmulPrecision,
    cuda::{CudaDevice, Event},
    step_inputs::{LogitUse, ScoreUse, StepCapacity},
};
use routed_model::{
    Model, ModelConfig, Sampler,
    gpu::{GpuCacheShape, GpuCaches, GpuModel, LogitsOut},
};
use routed_types::{
    BlockGeneration, BlockId, BlockRef, PromptLogprobs, RoutingMeta, SampledToken, ScheduledSeq,
    SeqId, StepOutput, StepPlan,
};
use std::{ops::Range, path::Path, sync::Arc, time::Duration};

/// Device memory the KV cache leaves free for what is allocated later (cuBLAS handles, the
/// driver's own), in bytes.
const HEADROOM_BYTES: usize = 512 << 20;

/// Logit edits (one per token a row's bias or penalties touch) the device applies in one step;
/// rows past them are finished on the host, a row of logits copied back and sampled there each,
/// which would make a step several times slower. A penalised row touches every distinct token of
/// its prompt and output (about 2,000 after a few thousand tokens of text), so a batch of 64 such
/// rows needs some 128k: this holds 16 times the 64k it held before, as 24 MiB of step inputs on
/// the device and in pinned memory, of which a step uploads only what it uses.
const MAX_LOGIT_EDITS: usize = 1 << 20;

/// Snapshot taps one sequence may ask for in one step: the last complete prompt block, the
/// aligned exact-repeat point, the divergence point and a chunk end.
const TAPS_PER_SEQ: usize = 4;

/// A model rank computing on a CUDA device.
pub struct CudaWorker {
    model: GpuModel,
    meta: Option<RoutingMeta>,
    weight_bytes_per_token: usize,
    limits: CudaLimits,
    /// The arithmetic of the matrices, which updated weights keep.
    precision: MatmulPrecision,
    /// Updated weights loaded on the host by [`Worker::stage_weights`], not on the device yet.
    staged: Option<Model>,
    /// The pools; `None` before [`Worker::initialize_cache`] and while released.
    caches: Option<Caches>,
    /// What the pools are sized for, once initialised (to allocate them again after a release).
    shape: Option<CacheShape>,
    /// The routing buffer's copy engine. It outlives the pools: the runner's slot ring holds it,
    /// and pools allocated again are attached to it.
    routing: Option<Arc<CudaCopyEngine>>,
    sampler: Sampler,
    logits: LogitsOut,
    /// The events around each step's device work.
    timer: StepTimer,
}

/// Two timing events: recorded before a step's upload and after its sampled tokens.
struct StepTimer {
    start: Event,
    end: Event,
}

struct Caches {
    gpu: GpuCaches,
    block_size: usize,
    /// The dummy forward's plan: one token on the scratch block and the scratch state slot.
    dummy: StepPlan,
    /// What a decode batch is padded with up to its graph's size: one token at position 1 of the
    /// scratch block, on the scratch state slot, without logits. `None` without graphs.
    graph_pad: Option<ScheduledSeq>,
    /// The largest padded batch the step inputs hold (sequences and tokens).
    graph_capacity: usize,
}

pub(super) fn device_err(e: impl std::fmt::Display) -> WorkerError {
    WorkerError::Device(e.to_string())
}

impl CudaWorker {
    /// Uploads `model` (loaded on the host by the checkpoint loader; it can be dropped after) to
    /// `dev`. `limits` bound the pools that [`Worker::initialize_cache`] allocates later, so the
    /// memory left for KV blocks is known before.
    pub fn new(dev: CudaDevice, model: &Model, limits: CudaLimits) -> Result<Self, WorkerError> {
        let timer = StepTimer { start: dev.new_timing_event()?, end: dev.new_timing_event()? };
        Ok(Self {
            timer,
            meta: model.routing_meta(),
            weight_bytes_per_token: model.weight_bytes_per_token(),
            model: GpuModel::upload(model, dev)?,
            limits,
            precision: model.matmul_precision(),
            staged: None,
            caches: None,
            shape: None,
            routing: None,
            sampler: Sampler::default(),
            logits: LogitsOut::default(),
        })
    }

    /// The pools of `shape`, with the routing buffer attached to the copy engine (made on the
    /// first call).
    fn new_caches(&mut self, shape: &CacheShape) -> Result<Caches, WorkerError> {
        let gpu = self.model.new_caches(self.cache_shape(shape))?;
        match (&self.meta, gpu.routing_source(), &self.routing) {
            (Some(_), Some(source), Some(engine)) => engine.attach(source),
            (Some(_), Some(source), None) => {
                let dev = self.model.device().clone();
                let engine = CudaCopyEngine::new(dev, source, shape.num_routing_slots)?;
                self.routing = Some(Arc::new(engine));
            }
            _ => {}
        }
        let dummy = dummy_plan(shape, self.model.config().is_hybrid());
        // The padding sits at position 1 so that it is no sequence start (which would clear its
        // state, a copy the graph does not hold); that needs two slots in the scratch block.
        // A rank of an expert-parallel group waits on the host in every MoE layer: no graphs.
        let single = self.model.collective().world_size() == 1;
        let graph_pad = (self.limits.cuda_graphs && single && shape.block_size >= 2).then(|| {
            let mut seq = dummy.seqs[0].clone();
            seq.num_computed_tokens = 1;
            seq
        });
        let capacity = self.cache_shape(shape).capacity;
        let graph_capacity = capacity.max_seqs.min(capacity.max_tokens).min(MAX_GRAPH_BATCH);
        let block_size = shape.block_size;
        Ok(Caches { gpu, block_size, dummy, graph_pad, graph_capacity })
    }

    fn cache_shape(&self, shape: &CacheShape) -> GpuCacheShape {
        let max_seqs = shape.num_live_states.max(1);
        GpuCacheShape {
            num_blocks: shape.num_blocks,
            block_size: shape.block_size,
            num_live_states: shape.num_live_states,
            num_snapshot_slots: shape.num_snapshot_slots,
            capacity: StepCapacity {
                max_tokens: shape.max_tokens_per_step,
                max_seqs,
                max_blocks_per_seq: shape.max_model_len.div_ceil(shape.block_size.max(1)) + 1,
                max_taps: TAPS_PER_SEQ * max_seqs,
                max_logit_edits: MAX_LOGIT_EDITS,
            },
            max_positions: shape.max_model_len,
            logits_chunk_rows: max_seqs.max(64),
            device_sampling: self.limits.device_sampling,
        }
    }
}

/// The pools, for a forward of `model`'s weights: an error when either is released (or the pools
/// were never allocated). Over the worker's fields, so that the caller can go on using the model.
fn ready<'a>(
    model: &GpuModel,
    caches: &'a mut Option<Caches>,
    shape: &Option<CacheShape>,
) -> Result<&'a mut Caches, WorkerError> {
    if model.weights_released() {
        return Err(WorkerError::Released("weights"));
    }
    match (caches, shape) {
        (Some(caches), _) => Ok(caches),
        (None, Some(_)) => Err(WorkerError::Released("KV cache")),
        (None, None) => Err(WorkerError::NotInitialized),
    }
}

/// The step's sampled tokens and prompt logprobs from the device rows (`l`) and the host rows,
/// which go through the CPU worker's sampling code; `uses` and `scores` say where each sequence's
/// rows are (the packer's).
fn outputs(
    plan: &StepPlan,
    (uses, scores): (&[LogitUse], &[ScoreUse]),
    l: &LogitsOut,
    sampler: &mut Sampler,
    vocab: usize,
    device_sampling: bool,
) -> StepOutput {
    let num_greedy = uses.iter().filter(|u| matches!(u, LogitUse::Greedy { .. })).count();
    let device_rows = l.sampled.len();
    // Host rows through the CPU worker's own sampling code, over the rows fetched.
    let mut host_rows: Vec<Range<usize>> = uses
        .iter()
        .map(|u| match *u {
            LogitUse::Host { first, len } => first - device_rows..first - device_rows + len,
            _ => 0..0,
        })
        .collect();
    let host = &l.host_logits;
    let mut sampled = sampling::sample(plan, host, &host_rows, vocab, sampler);
    // The chunks the device scored, then those it left to the host (every chunk without device
    // sampling; else a request's that names tokens for their logprobs): a host chunk's rows
    // are all its positions.
    let mut prompt_logprobs: Vec<PromptLogprobs> = match device_sampling {
        true => scores.iter().map(|u| prompt_logprobs(plan, u, l)).collect(),
        false => Vec::new(),
    };
    // A sequence the device scored has no prompt rows left on the host.
    for u in scores {
        host_rows[u.seq] = 0..0;
    }
    prompt_logprobs.extend(sampling::prompt_logprobs(plan, host, &host_rows, vocab));
    for ((out, used), seq) in sampled.iter_mut().zip(uses).zip(&plan.seqs) {
        let row = match *used {
            LogitUse::Greedy { row } => row,
            LogitUse::Sampled { row } => num_greedy + row,
            _ => continue,
        };
        // The rank and alternatives only where the request asked for logprobs, as on the CPU.
        let asked = seq.sample.as_ref().and_then(|(params, _)| params.logprobs);
        let (top_logprobs, rank) = match asked {
            Some(n) => {
                let alternatives = &l.top[row * l.num_top..][..(n as usize).min(l.num_top)];
                (alternatives.to_vec(), Some(l.ranks[row]))
            }
            None => (Vec::new(), None),
        };
        *out = Some(SampledToken {
            token: l.sampled[row],
            logprob: l.logprobs[row],
            top_logprobs,
            rank,
            token_id_logprobs: Vec::new(),
        });
    }
    StepOutput { step_id: plan.step_id, sampled, prompt_logprobs }
}

/// A sequence's prompt logprobs as the device scored them: entry `r` is prompt token
/// `first_position + r` with its logprob, rank and the alternatives the request asked for.
fn prompt_logprobs(plan: &StepPlan, u: &ScoreUse, l: &LogitsOut) -> PromptLogprobs {
    let prompt = &plan.seqs[u.seq].context.as_ref().expect("scored rows have a context").prompt;
    let first = u.first - l.sampled.len();
    let entries = (first..first + u.len)
        .zip(&prompt[u.first_position..])
        .map(|(row, &token)| SampledToken {
            token,
            logprob: l.score_logprobs[row],
            top_logprobs: l.score_top[row * l.num_score_top..][..u.num_top].to_vec(),
            rank: Some(l.score_ranks[row]),
            token_id_logprobs: Vec::new(),
        })
        .collect();
    PromptLogprobs { seq_index: u.seq, first_position: u.first_position, entries }
}

/// The KV slot of every token of the step, in batch order.
fn slot_mapping(plan: &StepPlan, block_size: usize) -> Vec<usize> {
    let mut slots = Vec::with_capacity(plan.num_tokens());
    for s in &plan.seqs {
        let positions = s.num_computed_tokens..s.num_computed_tokens + s.token_ids.len();
        slots
            .extend(positions.map(|p| {
                s.block_table[p / block_size].block.index() * block_size + p % block_size
            }));
    }
    slots
}

/// Decode batches up to this size replay CUDA graphs: larger ones are compute bound, where the
/// launches' host cost no longer shows.
const MAX_GRAPH_BATCH: usize = 256;

/// The graph size a decode step is padded to: 1, 2, 4, then multiples of 8, so that a few graphs
/// serve every batch. `None` when the step is no pure decode step (a prefill chunk, a restore, a
/// snapshot) or the padded batch exceeds `largest`.
fn graph_batch(plan: &StepPlan, largest: usize) -> Option<usize> {
    let n = plan.seqs.len();
    let decode = plan.seqs.iter().all(|s| {
        s.token_ids.len() == 1
            && s.num_computed_tokens > 0
            && s.restore_from.is_none()
            && s.snapshots.is_empty()
    });
    let batch = match n {
        0 => return None,
        1 | 2 => n,
        3 | 4 => 4,
        _ => n.next_multiple_of(8),
    };
    (decode && batch <= largest).then_some(batch)
}

/// One token at position 0 on the scratch block (and the scratch state slot of a hybrid model).
fn dummy_plan(shape: &CacheShape, hybrid: bool) -> StepPlan {
    let table = vec![BlockRef::new(shape.scratch_block, BlockGeneration(0))];
    let seq = ScheduledSeq {
        live_state: hybrid.then_some(shape.num_live_states as u32),
        ..ScheduledSeq::prompt_chunk(SeqId(0), vec![0], 0, table)
    };
    StepPlan { seqs: vec![seq], ..StepPlan::default() }
}

impl Worker for CudaWorker {
    fn device(&self) -> String {
        let dev = self.model.device();
        if dev.is_simulated() {
            return "cuda-sim".to_owned();
        }
        format!("cuda:{} ({})", dev.ordinal(), dev.name())
    }

    fn rank(&self) -> usize {
        self.model.collective().rank()
    }

    fn config(&self) -> &ModelConfig {
        self.model.config()
    }

    fn routing_meta(&self) -> Option<RoutingMeta> {
        self.meta.clone()
    }

    fn weight_bytes_per_token(&self) -> usize {
        self.weight_bytes_per_token
    }

    fn kv_block_bytes(&self, block_size: usize) -> usize {
        self.model.kv_block_bytes(block_size)
    }

    fn kv_memory_limit(&self, block_size: usize) -> Option<usize> {
        let (free, _total) = self.model.device().mem_get_info().ok()?;
        let l = &self.limits;
        let without_kv = CacheShape {
            num_blocks: 0,
            block_size,
            num_live_states: l.max_num_seqs,
            num_snapshot_slots: l.num_snapshot_slots,
            scratch_block: BlockId(0),
            max_tokens_per_step: l.max_tokens_per_step,
            max_model_len: l.max_model_len,
            num_routing_slots: 0,
        };
        let pools = self.model.caches_bytes(&self.cache_shape(&without_kv));
        Some(free.saturating_sub(pools + HEADROOM_BYTES))
    }

    fn initialize_cache(&mut self, shape: &CacheShape) -> Result<(), WorkerError> {
        self.caches = Some(self.new_caches(shape)?);
        self.shape = Some(shape.clone());
        Ok(())
    }

    fn routing_engine(&self) -> Option<Arc<dyn CopyEngine>> {
        let engine = self.routing.clone()?;
        Some(engine)
    }

    fn execute(&mut self, plan: &StepPlan, unit: LockstepId) -> Result<ExecutedStep, WorkerError> {
        let ranks = self.model.collective().clone();
        let guard = AbortOnExit::new(ranks.clone(), unit);
        let rank = ranks.rank();
        #[cfg(feature = "fault-injection")]
        super::faults::before_step(plan, rank, ranks.world_size())?;
        let caches = ready(&self.model, &mut self.caches, &self.shape)?;
        if plan.num_tokens() == 0 {
            // Nothing to launch (the kernels take no empty grids), nothing to exchange.
            guard.disarm();
            let sampled = vec![None; plan.seqs.len()];
            let output = StepOutput { step_id: plan.step_id, sampled, prompt_logprobs: Vec::new() };
            let (slot_mapping, blocks) = (Vec::new(), Vec::new());
            return Ok(ExecutedStep { output, slot_mapping, blocks, device_time: None });
        }
        ranks.begin(unit.0).map_err(routed_model::ModelError::from)?;
        // Only rank 0's samples and routing are used: the other ranks skip the LM head.
        let (lead, capture) = (rank == 0, rank == 0 && plan.capture_routing);
        let largest = caches.graph_capacity;
        let batch =
            caches.graph_pad.as_ref().and_then(|pad| Some((pad, graph_batch(plan, largest)?)));
        // The device's clock from the step's upload to its sampled tokens, between two events on
        // the compute stream (recorded outside any graph capture).
        let stream = self.model.device().compute_stream();
        self.timer.start.record(stream)?;
        let step = match batch {
            Some(pad) => self.model.forward_graph(&mut caches.gpu, plan, pad, lead, capture)?,
            None => self.model.forward(&mut caches.gpu, plan, lead, capture)?,
        };
        #[cfg(feature = "fault-injection")]
        super::faults::inside_step(plan);
        self.model.finish_logits(&mut caches.gpu, &step, &mut self.logits)?;
        self.timer.end.record(self.model.device().compute_stream())?;
        // Steps without logits (intermediate chunks) end here too, so a device error is this
        // step's, not the next one's.
        self.model.synchronize()?;
        guard.disarm();
        let device_time = self.timer.end.seconds_since(&self.timer.start)?;
        let block_size = caches.block_size;
        let uses = (caches.gpu.logit_uses(), caches.gpu.score_uses());
        let vocab = self.model.config().vocab_size;
        let device_sampling = self.limits.device_sampling;
        let output = outputs(plan, uses, &self.logits, &mut self.sampler, vocab, device_sampling);
        Ok(ExecutedStep {
            output,
            slot_mapping: slot_mapping(plan, block_size),
            blocks: written_blocks(plan, block_size),
            device_time: device_time.map(Duration::from_secs_f64),
        })
    }

    fn dummy_forward(&mut self, unit: LockstepId) -> Result<(), WorkerError> {
        let ranks = self.model.collective().clone();
        let guard = AbortOnExit::new(ranks.clone(), unit);
        let caches = ready(&self.model, &mut self.caches, &self.shape)?;
        ranks.begin(unit.0).map_err(routed_model::ModelError::from)?;
        // No logits, no routing: only the scratch block and the scratch state are written.
        self.model.forward(&mut caches.gpu, &caches.dummy, false, false)?;
        self.model.synchronize()?;
        guard.disarm();
        Ok(())
    }

    fn abort(&self, unit: LockstepId) {
        self.model.collective().abort(unit.0);
    }

    fn stage_weights(&mut self, dir: &Path) -> Result<(), WorkerError> {
        self.staged = None;
        let ranks = self.model.collective().clone();
        let host = super::load_update(self.model.config(), ranks, self.precision, dir)?;
        // Refused here, before any rank writes, rather than half way through a commit.
        self.model.check_weights(&host).map_err(|e| WorkerError::Weights(e.to_string()))?;
        self.staged = Some(host);
        Ok(())
    }

    fn commit_weights(&mut self) -> Result<(), WorkerError> {
        let host = self.staged.take().ok_or(WorkerError::Weights("no weights staged".into()))?;
        // In place: the decode graphs and the expert exchange hold the weights' addresses.
        self.model.replace_weights(&host).map_err(device_err)
    }

    fn discard_weights(&mut self) {
        self.staged = None;
    }

    fn release_memory(&mut self, tags: MemoryTags) -> Result<usize, WorkerError> {
        // Under expert parallelism every rank releases (and resumes) alike, with no step between.
        // A peer reads this rank's expert rows only inside a step, which ended with this rank's
        // stream waiting for every peer's reads; pools made again publish their rows' new address,
        // and each peer's exchange uploads it before its next read.
        let mut freed = 0;
        if tags.kv_cache
            && let Some(caches) = self.caches.take()
        {
            if let Some(shape) = &self.shape {
                freed += self.model.caches_bytes(&self.cache_shape(shape));
            }
            if let Some(engine) = &self.routing {
                engine.detach();
            }
            // The driver orders the free behind the work queued on the compute stream, which
            // waits for the last routing copy.
            drop(caches);
        }
        if (tags.cuda_graph || tags.weights)
            && let Some(caches) = &mut self.caches
        {
            // The graphs hold the weights' addresses, which a resume may change.
            caches.gpu.drop_graphs();
        }
        if tags.weights {
            freed += self.model.release_weights()?;
        }
        Ok(freed)
    }

    fn resume_memory(&mut self, tags: MemoryTags, dir: &Path) -> Result<usize, WorkerError> {
        let mut taken = 0;
        if tags.weights && self.model.weights_released() {
            let ranks = self.model.collective().clone();
            let host = super::load_update(self.model.config(), ranks, self.precision, dir)
                .map_err(super::as_refusal)?;
            self.model.check_weights(&host).map_err(|e| WorkerError::Weights(e.to_string()))?;
            self.model.restore_weights(&host).map_err(device_err)?;
            taken += self.model.weight_bytes();
            if let Some(caches) = &mut self.caches {
                caches.gpu.drop_graphs();
            }
        }
        if tags.kv_cache
            && self.caches.is_none()
            && let Some(shape) = self.shape.clone()
        {
            self.caches = Some(self.new_caches(&shape)?);
            taken += self.model.caches_bytes(&self.cache_shape(&shape));
        }
        Ok(taken)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decode(n: usize) -> StepPlan {
        let seqs = (0..n as u32).map(|i| crate::worker::tests::seq(9, 1, &[i, i, i])).collect();
        StepPlan { seqs, ..StepPlan::default() }
    }

    #[test]
    fn decode_batches_pad_to_a_few_graph_sizes() {
        let sizes: Vec<_> = (1..=20).map(|n| graph_batch(&decode(n), 256).unwrap()).collect();
        assert_eq!(sizes[..5], [1, 2, 4, 4, 8]);
        assert_eq!(sizes[7..10], [8, 16, 16]);
        assert_eq!(sizes[19], 24);
        assert_eq!(graph_batch(&decode(250), 256), Some(256));
        assert_eq!(graph_batch(&decode(250), 252), None, "the padded batch must fit");
        assert_eq!(graph_batch(&decode(0), 256), None);
    }

    #[test]
    fn only_pure_decode_steps_take_a_graph() {
        let mut chunk = decode(3);
        chunk.seqs[1].token_ids = vec![5, 6].into();
        let mut start = decode(3);
        start.seqs[2].num_computed_tokens = 0;
        let mut restore = decode(3);
        restore.seqs[0].restore_from = Some(routed_types::SnapshotSlotId(1));
        let mut tap = decode(3);
        tap.seqs[0].snapshots = vec![(10, routed_types::SnapshotSlotId(2))];
        for (what, plan) in [("chunk", chunk), ("start", start), ("restore", restore), ("tap", tap)]
        {
            assert_eq!(graph_batch(&plan, 256), None, "{what}");
        }
    }
}
