//! The CPU worker: one rank's model on the CPU reference backend, with its own thread pool.

use super::{
    AbortOnExit, CacheShape, ExecutedStep, LockstepId, Worker, WorkerError, sampling,
    written_blocks,
};
use crate::routing_ring::{CopyEngine, HostCopyEngine};
use routed_backend::collective::Collective;
use routed_model::{
    KvCache, LiveStateId, LogitsWanted, Model, ModelConfig, RoutingBuffer, Sampler, SeqInput,
    StateCache, StateIo,
};
use routed_types::{
    BlockGeneration, BlockId, BlockRef, RoutingMeta, ScheduledSeq, StepOutput, StepPlan,
};
use std::{path::Path, sync::Arc};

/// A model rank computing on the CPU. Its kernels run on its own thread pool, so the ranks of an
/// expert-parallel group split the cores between them.
pub struct CpuWorker {
    model: Arc<Model>,
    pool: rayon::ThreadPool,
    caches: Option<Caches>,
    sampler: Sampler,
    /// Routing written by dummy forwards goes here and nowhere else.
    scratch_routing: RoutingBuffer,
    /// New weights loaded by [`Worker::stage_weights`], not in use yet.
    staged: Option<Model>,
}

struct Caches {
    kv: KvCache,
    states: StateCache,
    /// The routing buffer every forward writes, and its host slots.
    routing: Arc<HostCopyEngine>,
    block_size: usize,
    scratch_block: BlockId,
}

impl CpuWorker {
    /// A worker for `model` (a whole model or one rank's part) computing on `num_threads` threads.
    pub fn new(model: Arc<Model>, num_threads: usize) -> Result<Self, WorkerError> {
        let rank = model.shard().rank;
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(num_threads.max(1))
            .thread_name(move |i| format!("routed-cpu-r{rank}-{i}"))
            .build()
            .map_err(|e| WorkerError::Panicked(format!("cannot start the thread pool: {e}")))?;
        Ok(Self {
            scratch_routing: model.new_routing_buffer(1),
            model,
            pool,
            caches: None,
            sampler: Sampler::default(),
            staged: None,
        })
    }

    /// The model this worker runs.
    pub fn model(&self) -> &Arc<Model> {
        &self.model
    }

    fn ranks(&self) -> Arc<dyn Collective> {
        self.model.collective().clone()
    }
}

impl Worker for CpuWorker {
    fn device(&self) -> String {
        "cpu".into()
    }

    fn rank(&self) -> usize {
        self.model.shard().rank
    }

    fn config(&self) -> &ModelConfig {
        self.model.config()
    }

    fn routing_meta(&self) -> Option<RoutingMeta> {
        self.model.routing_meta()
    }

    fn weight_bytes_per_token(&self) -> usize {
        self.model.weight_bytes_per_token()
    }

    fn kv_block_bytes(&self, block_size: usize) -> usize {
        self.model.new_kv_cache(1, block_size).bytes()
    }

    fn initialize_cache(&mut self, shape: &CacheShape) -> Result<(), WorkerError> {
        self.caches = Some(Caches {
            kv: self.model.new_kv_cache(shape.num_blocks, shape.block_size),
            states: self.model.new_state_cache(shape.num_live_states, shape.num_snapshot_slots),
            routing: Arc::new(HostCopyEngine::new(
                shape.num_routing_slots,
                self.model.new_routing_buffer(shape.max_tokens_per_step),
            )),
            block_size: shape.block_size,
            scratch_block: shape.scratch_block,
        });
        Ok(())
    }

    fn routing_engine(&self) -> Option<Arc<dyn CopyEngine>> {
        let caches = self.caches.as_ref()?;
        self.model.routing_meta()?;
        Some(caches.routing.clone())
    }

    fn execute(&mut self, plan: &StepPlan, unit: LockstepId) -> Result<ExecutedStep, WorkerError> {
        let guard = AbortOnExit::new(self.ranks(), unit);
        let rank = self.rank();
        #[cfg(feature = "fault-injection")]
        super::faults::before_step(plan, rank, self.model.shard().num_ranks)?;
        let caches = self.caches.as_mut().ok_or(WorkerError::NotInitialized)?;
        let hybrid = self.model.config().is_hybrid();
        // Only rank 0's logits are used: the other ranks skip the LM head and sampling.
        let inputs: Vec<SeqInput<'_>> =
            plan.seqs.iter().map(|s| seq_input(s, hybrid, rank == 0)).collect();
        let (model, sampler) = (&self.model, &mut self.sampler);
        let (kv, states) = (&mut caches.kv, &mut caches.states);
        let mut routing = caches.routing.source();
        let routing = &mut *routing;
        // The step runs on a pool thread: the kernels' parallel regions then fork and join inside
        // the pool instead of parking this thread once per region, and the other workers stay
        // awake until the step ends.
        let (out, sampled) = self.pool.install(|| {
            routed_backend::cpu::with_hot_workers(|| {
                model.collective().begin(unit.0).map_err(routed_model::ModelError::from)?;
                #[cfg(feature = "fault-injection")]
                super::faults::inside_step(plan);
                let out = model.forward(&inputs, kv, states, routing)?;
                let vocab = model.config().vocab_size;
                let sampled = sampling::sample(plan, &out.logits, &out.logits_rows, vocab, sampler);
                let prompt = sampling::prompt_logprobs(plan, &out.logits, &out.logits_rows, vocab);
                let mut out = out;
                model.recycle_logits(std::mem::take(&mut out.logits));
                Ok::<_, WorkerError>((out, (sampled, prompt)))
            })
        })?;
        let (sampled, prompt_logprobs) = sampled;
        guard.disarm();
        Ok(ExecutedStep {
            output: StepOutput { step_id: plan.step_id, sampled, prompt_logprobs },
            slot_mapping: out.slot_mapping,
            blocks: written_blocks(plan, caches.block_size),
        })
    }

    fn dummy_forward(&mut self, unit: LockstepId) -> Result<(), WorkerError> {
        let guard = AbortOnExit::new(self.ranks(), unit);
        let caches = self.caches.as_mut().ok_or(WorkerError::NotInitialized)?;
        let table = [BlockRef::new(caches.scratch_block, BlockGeneration(0))];
        let input = SeqInput {
            token_ids: &[0],
            num_computed_tokens: 0,
            num_prompt_tokens: 1,
            block_table: &table,
            logits: LogitsWanted::None,
            state: self.model.config().is_hybrid().then(|| StateIo {
                live: caches.states.scratch(),
                restore_from: None,
                snapshots: &[],
            }),
        };
        let (model, routing) = (&self.model, &mut self.scratch_routing);
        let (kv, states) = (&mut caches.kv, &mut caches.states);
        self.pool.install(|| {
            routed_backend::cpu::with_hot_workers(|| {
                model.collective().begin(unit.0)?;
                model.forward(&[input], kv, states, routing).map(drop)
            })
        })?;
        guard.disarm();
        Ok(())
    }

    fn abort(&self, unit: LockstepId) {
        self.model.collective().abort(unit.0);
    }

    fn stage_weights(&mut self, dir: &Path) -> Result<(), WorkerError> {
        self.staged = None;
        let m = &self.model;
        let ranks = m.collective().clone();
        self.staged = Some(super::load_update(m.config(), ranks, m.matmul_precision(), dir)?);
        Ok(())
    }

    fn commit_weights(&mut self) -> Result<(), WorkerError> {
        let staged = self.staged.take().ok_or(WorkerError::Weights("no weights staged".into()))?;
        // The caches and the routing buffers were sized from the configuration, which is the
        // same: they stay.
        self.model = Arc::new(staged);
        Ok(())
    }

    fn discard_weights(&mut self) {
        self.staged = None;
    }
}

/// A scheduled sequence as the model's input. `wants_logits` is false on ranks whose samples are
/// not used.
fn seq_input(s: &ScheduledSeq, hybrid: bool, wants_logits: bool) -> SeqInput<'_> {
    SeqInput {
        token_ids: &s.token_ids,
        num_computed_tokens: s.num_computed_tokens,
        num_prompt_tokens: s.num_prompt_tokens,
        block_table: &s.block_table,
        logits: match (wants_logits, s.prompt_logprobs.is_some(), s.sample.is_some()) {
            (false, ..) => LogitsWanted::None,
            (true, true, _) => LogitsWanted::All,
            (true, false, true) => LogitsWanted::Last,
            (true, false, false) => LogitsWanted::None,
        },
        state: hybrid.then(|| StateIo {
            live: LiveStateId(s.live_state.unwrap_or(0)),
            restore_from: s.restore_from,
            snapshots: &s.snapshots,
        }),
    }
}
