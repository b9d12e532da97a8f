//! The CPU worker: one rank's model on the CPU reference backend, with its own thread pool.

use super::{
    AbortOnExit, CacheShape, ExecutedStep, LockstepId, Worker, WorkerError, sampling,
    written_blocks,
};
use crate::{
    MemoryTags,
    routing_ring::{CopyEngine, HostCopyEngine},
};
use routed_backend::{collective::Collective, cpu::MatmulPrecision};
use routed_model::{
    KvCache, LiveStateId, LogitsWanted, Model, ModelConfig, RoutingBuffer, Sampler, SeqInput,
    StateCache, StateIo,
};
use routed_types::{BlockGeneration, BlockRef, RoutingMeta, ScheduledSeq, StepOutput, StepPlan};
use std::{path::Path, sync::Arc};

/// A model rank computing on the CPU. Its kernels run on its own thread pool, so the ranks of an
/// expert-parallel group split the cores between them.
pub struct CpuWorker {
    /// The weights; `None` while released ([`Worker::release_memory`]).
    model: Option<Arc<Model>>,
    /// What is known of the model whether or not its weights are in memory.
    config: ModelConfig,
    meta: Option<RoutingMeta>,
    ranks: Arc<dyn Collective>,
    rank: usize,
    precision: MatmulPrecision,
    weight_bytes_per_token: usize,
    pool: rayon::ThreadPool,
    caches: Option<Caches>,
    sampler: Sampler,
    /// Routing written by dummy forwards goes here and nowhere else.
    scratch_routing: RoutingBuffer,
    /// New weights loaded by [`Worker::stage_weights`], not in use yet.
    staged: Option<Model>,
}

struct Caches {
    /// The KV blocks and Mamba states; `None` while released.
    pools: Option<Pools>,
    /// The routing buffer every forward writes, and its host slots.
    routing: Arc<HostCopyEngine>,
    shape: CacheShape,
}

struct Pools {
    kv: KvCache,
    states: StateCache,
}

impl Pools {
    fn new(config: &ModelConfig, shape: &CacheShape) -> Self {
        Self {
            kv: config.new_kv_cache(shape.num_blocks, shape.block_size),
            states: config.new_state_cache(shape.num_live_states, shape.num_snapshot_slots),
        }
    }

    fn bytes(&self) -> usize {
        self.kv.bytes() + self.states.bytes()
    }
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
            config: model.config().clone(),
            meta: model.routing_meta(),
            ranks: model.collective().clone(),
            rank,
            precision: model.matmul_precision(),
            weight_bytes_per_token: model.weight_bytes_per_token(),
            model: Some(model),
            pool,
            caches: None,
            sampler: Sampler::default(),
            staged: None,
        })
    }

    /// The model this worker runs; `None` while its weights are released.
    pub fn model(&self) -> Option<&Arc<Model>> {
        self.model.as_ref()
    }
}

/// The weights, or why a forward cannot run.
fn weights(model: &Option<Arc<Model>>) -> Result<&Arc<Model>, WorkerError> {
    model.as_ref().ok_or(WorkerError::Released("weights"))
}

impl Worker for CpuWorker {
    fn device(&self) -> String {
        "cpu".into()
    }

    fn rank(&self) -> usize {
        self.rank
    }

    fn config(&self) -> &ModelConfig {
        &self.config
    }

    fn routing_meta(&self) -> Option<RoutingMeta> {
        self.meta.clone()
    }

    fn weight_bytes_per_token(&self) -> usize {
        self.weight_bytes_per_token
    }

    fn kv_block_bytes(&self, block_size: usize) -> usize {
        self.config.new_kv_cache(1, block_size).bytes()
    }

    fn initialize_cache(&mut self, shape: &CacheShape) -> Result<(), WorkerError> {
        let (l, k) = self.meta.as_ref().map_or((0, 0), |m| (m.num_moe_layers(), m.top_k as usize));
        let routing_buffer = RoutingBuffer::new(l, k, shape.max_tokens_per_step);
        self.caches = Some(Caches {
            pools: Some(Pools::new(&self.config, shape)),
            routing: Arc::new(HostCopyEngine::new(shape.num_routing_slots, routing_buffer)),
            shape: shape.clone(),
        });
        Ok(())
    }

    fn routing_engine(&self) -> Option<Arc<dyn CopyEngine>> {
        let caches = self.caches.as_ref()?;
        self.meta.as_ref()?;
        Some(caches.routing.clone())
    }

    fn execute(&mut self, plan: &StepPlan, unit: LockstepId) -> Result<ExecutedStep, WorkerError> {
        let guard = AbortOnExit::new(self.ranks.clone(), unit);
        let rank = self.rank;
        #[cfg(feature = "fault-injection")]
        super::faults::before_step(plan, rank, self.ranks.world_size())?;
        let model = weights(&self.model)?;
        let caches = self.caches.as_mut().ok_or(WorkerError::NotInitialized)?;
        let Caches { pools, routing, shape } = caches;
        let Pools { kv, states } = pools.as_mut().ok_or(WorkerError::Released("KV cache"))?;
        let hybrid = self.config.is_hybrid();
        // Only rank 0's logits are used: the other ranks skip the LM head and sampling.
        let inputs: Vec<SeqInput<'_>> =
            plan.seqs.iter().map(|s| seq_input(s, hybrid, rank == 0)).collect();
        let sampler = &mut self.sampler;
        let mut routing = routing.source();
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
            blocks: written_blocks(plan, shape.block_size),
            device_time: None,
        })
    }

    fn dummy_forward(&mut self, unit: LockstepId) -> Result<(), WorkerError> {
        let guard = AbortOnExit::new(self.ranks.clone(), unit);
        let model = weights(&self.model)?;
        let caches = self.caches.as_mut().ok_or(WorkerError::NotInitialized)?;
        let Caches { pools, shape, .. } = caches;
        let Pools { kv, states } = pools.as_mut().ok_or(WorkerError::Released("KV cache"))?;
        let table = [BlockRef::new(shape.scratch_block, BlockGeneration(0))];
        let input = SeqInput {
            token_ids: &[0],
            num_computed_tokens: 0,
            num_prompt_tokens: 1,
            block_table: &table,
            logits: LogitsWanted::None,
            state: self.config.is_hybrid().then(|| StateIo {
                live: states.scratch(),
                restore_from: None,
                snapshots: &[],
            }),
        };
        let routing = &mut self.scratch_routing;
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
        self.ranks.abort(unit.0);
    }

    fn stage_weights(&mut self, dir: &Path) -> Result<(), WorkerError> {
        self.staged = None;
        weights(&self.model)?;
        let ranks = self.ranks.clone();
        self.staged = Some(super::load_update(&self.config, ranks, self.precision, dir)?);
        Ok(())
    }

    fn commit_weights(&mut self) -> Result<(), WorkerError> {
        let staged = self.staged.take().ok_or(WorkerError::Weights("no weights staged".into()))?;
        // The caches and the routing buffers were sized from the configuration, which is the
        // same: they stay.
        self.model = Some(Arc::new(staged));
        Ok(())
    }

    fn discard_weights(&mut self) {
        self.staged = None;
    }

    fn release_memory(&mut self, tags: MemoryTags) -> Result<usize, WorkerError> {
        let mut freed = 0;
        if tags.kv_cache
            && let Some(pools) = self.caches.as_mut().and_then(|c| c.pools.take())
        {
            freed += pools.bytes();
        }
        if tags.weights
            && let Some(model) = self.model.take()
        {
            // Freed unless a caller still holds the model (then it is theirs to drop).
            freed += model.weight_bytes();
        }
        Ok(freed)
    }

    fn resume_memory(&mut self, tags: MemoryTags, dir: &Path) -> Result<usize, WorkerError> {
        let mut taken = 0;
        if tags.weights && self.model.is_none() {
            let ranks = self.ranks.clone();
            let model = super::load_update(&self.config, ranks, self.precision, dir)
                .map_err(super::as_refusal)?;
            taken += model.weight_bytes();
            self.model = Some(Arc::new(model));
        }
        if tags.kv_cache
            && let Some(caches) = self.caches.as_mut().filter(|c| c.pools.is_none())
        {
            let pools = Pools::new(&self.config, &caches.shape);
            taken += pools.bytes();
            caches.pools = Some(pools);
        }
        Ok(taken)
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
