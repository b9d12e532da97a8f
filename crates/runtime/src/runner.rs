//! The model runner actor: one per device, on a dedicated OS thread (actix `SyncArbiter`), since
//! model math blocks. It owns the weights, the KV and Mamba state tensors and a small pool of
//! routing buffers, and executes one [`Execute`] or [`DummyForward`] at a time, so a dummy forward
//! and a real step never overlap.

use crate::{
    copy_worker::CopyWorkerActor,
    messages::{CopyRouting, DummyForward, Execute},
    timings::Timings,
};
use actix::{Actor, Addr, Handler, SyncContext};
use crossbeam_channel::{Receiver, Sender};
use rayon::prelude::*;
use routed_model::{
    KvCache, LiveStateId, LogitsWanted, Model, RoutingBuffer, Sampler, SeqInput, StateCache,
    StateIo,
};
use routed_types::{BlockId, ScheduledSeq, StepOutput, StepPlan};
use std::{
    collections::BTreeSet,
    ops::Range,
    panic::{AssertUnwindSafe, catch_unwind},
    sync::Arc,
    time::Instant,
};

/// How the runner's tensors are sized.
#[derive(Clone, Debug)]
pub struct RunnerConfig {
    /// KV blocks (scratch blocks included).
    pub num_blocks: usize,
    /// Tokens per block.
    pub block_size: usize,
    /// Live state slots (one per running sequence).
    pub num_live_states: usize,
    /// Snapshot slots.
    pub num_snapshot_slots: usize,
    /// Largest step, in tokens.
    pub max_step_tokens: usize,
    /// The block dummy forwards write to.
    pub scratch_block: BlockId,
}

/// Routing buffers circulate between the runner and the copy worker: the runner takes one per
/// step and the worker returns it once its copy is done, so a buffer is never overwritten while
/// it is being read.
#[derive(Clone)]
pub struct BufferPool {
    /// Free buffers.
    pub free: Receiver<RoutingBuffer>,
    /// Where the copy worker returns buffers.
    pub returns: Sender<RoutingBuffer>,
}

impl BufferPool {
    /// A pool of `count` buffers made by `make`.
    pub fn new(count: usize, make: impl Fn() -> RoutingBuffer) -> Self {
        let (returns, free) = crossbeam_channel::bounded(count);
        for _ in 0..count {
            returns.send(make()).expect("the pool has room for its own buffers");
        }
        Self { free, returns }
    }
}

/// Executes steps on one device.
pub struct RunnerActor {
    model: Arc<Model>,
    config: RunnerConfig,
    kv: KvCache,
    states: StateCache,
    sampler: Sampler,
    buffers: BufferPool,
    /// Routing written by dummy forwards goes here and nowhere else.
    scratch_routing: RoutingBuffer,
    copy: Addr<CopyWorkerActor>,
    timings: Arc<Timings>,
}

impl RunnerActor {
    /// Allocates the runner's tensors for `model`.
    pub fn new(
        model: Arc<Model>,
        config: RunnerConfig,
        buffers: BufferPool,
        copy: Addr<CopyWorkerActor>,
        timings: Arc<Timings>,
    ) -> Self {
        Self {
            timings,
            kv: model.new_kv_cache(config.num_blocks, config.block_size),
            states: model.new_state_cache(config.num_live_states, config.num_snapshot_slots),
            scratch_routing: model.new_routing_buffer(1),
            sampler: Sampler::default(),
            model,
            config,
            buffers,
            copy,
        }
    }

    fn execute(&mut self, plan: StepPlan) -> Result<StepOutput, String> {
        let hybrid = self.model.config().is_hybrid();
        let inputs: Vec<SeqInput<'_>> = plan
            .seqs
            .iter()
            .map(|s| SeqInput {
                token_ids: &s.token_ids,
                num_computed_tokens: s.num_computed_tokens,
                num_prompt_tokens: s.num_prompt_tokens,
                block_table: &s.block_table,
                logits: if s.sample.is_some() { LogitsWanted::Last } else { LogitsWanted::None },
                state: hybrid.then(|| StateIo {
                    live: LiveStateId(s.live_state.unwrap_or(0)),
                    restore_from: s.restore_from,
                    snapshots: &s.snapshots,
                }),
            })
            .collect();
        let mut buffer =
            self.buffers.free.recv().map_err(|_| "the routing buffer pool is gone".to_string())?;
        let started = Instant::now();
        let vocab = self.model.config().vocab_size;
        let (model, kv, states, sampler) =
            (&self.model, &mut self.kv, &mut self.states, &mut self.sampler);
        // The step runs on a pool thread: the kernels' parallel regions then fork and join inside
        // the pool, instead of parking this thread once per region; the other workers stay awake
        // until the step ends.
        let sampled = routed_backend::cpu::with_hot_workers(|| {
            let out = model.forward(&inputs, kv, states, &mut buffer)?;
            let sample = |sampler: &mut Sampler, (s, rows): (&ScheduledSeq, &Range<usize>)| {
                let (params, index) = s.sample.as_ref()?;
                let logits = &out.logits[rows.start * vocab..rows.end * vocab];
                Some(sampler.sample(logits, params, *index))
            };
            // A row's sample depends on its own logits, seed and index only: any thread will do.
            Ok::<_, routed_model::ModelError>(
                if plan.seqs.iter().filter(|s| s.sample.is_some()).count() > 1 {
                    (plan.seqs.par_iter().zip(&out.logits_rows))
                        .map_init(Sampler::default, sample)
                        .collect()
                } else {
                    plan.seqs.iter().zip(&out.logits_rows).map(|x| sample(sampler, x)).collect()
                },
            )
        });
        let sampled: Vec<_> = match sampled {
            Ok(sampled) => sampled,
            Err(e) => {
                let _ = self.buffers.returns.send(buffer);
                return Err(e.to_string());
            }
        };
        Timings::add(&self.timings.forward_ns, started.elapsed());
        if plan.capture_routing && buffer.num_moe_layers() > 0 {
            let started = Instant::now();
            let (slot_mapping, blocks) = self.slot_mapping(&plan);
            self.copy.do_send(CopyRouting { step_id: plan.step_id, buffer, slot_mapping, blocks });
            Timings::add(&self.timings.capture_ns, started.elapsed());
        } else {
            let _ = self.buffers.returns.send(buffer);
        }
        Ok(StepOutput { step_id: plan.step_id, sampled })
    }

    /// The KV slot of every token of the step and the blocks (with generations) it wrote to.
    fn slot_mapping(
        &self,
        plan: &StepPlan,
    ) -> (Vec<usize>, Vec<(BlockId, routed_types::BlockGeneration)>) {
        let b = self.config.block_size;
        let mut slots = Vec::with_capacity(plan.num_tokens());
        let mut blocks = BTreeSet::new();
        for s in &plan.seqs {
            for p in s.num_computed_tokens..s.num_computed_tokens + s.token_ids.len() {
                let i = p / b;
                slots.push(s.block_table[i].index() * b + p % b);
                blocks.insert((s.block_table[i], s.block_generations[i]));
            }
        }
        (slots, blocks.into_iter().collect())
    }

    fn dummy_forward(&mut self) -> Result<(), String> {
        let table = [self.config.scratch_block];
        let input = SeqInput {
            token_ids: &[0],
            num_computed_tokens: 0,
            num_prompt_tokens: 1,
            block_table: &table,
            logits: LogitsWanted::None,
            state: self.model.config().is_hybrid().then(|| StateIo {
                live: self.states.scratch(),
                restore_from: None,
                snapshots: &[],
            }),
        };
        self.model
            .forward(&[input], &mut self.kv, &mut self.states, &mut self.scratch_routing)
            .map(|_| ())
            .map_err(|e| e.to_string())
    }
}

impl Actor for RunnerActor {
    type Context = SyncContext<Self>;
}

impl Handler<Execute> for RunnerActor {
    type Result = Result<StepOutput, String>;

    fn handle(&mut self, msg: Execute, _: &mut SyncContext<Self>) -> Self::Result {
        if cfg!(feature = "fault-injection")
            && msg.0.seqs.iter().any(|s| s.sample.as_ref().is_some_and(|p| p.0.seed == FAULT_SEED))
        {
            return Err("injected runner failure".into());
        }
        // actix does not catch panics: a panicking step must not take the runner thread down
        // with the engine's only copy of the weights.
        catch_unwind(AssertUnwindSafe(|| self.execute(msg.0)))
            .unwrap_or_else(|p| Err(format!("runner panicked: {}", panic_message(&p))))
    }
}

impl Handler<DummyForward> for RunnerActor {
    type Result = Result<(), String>;

    fn handle(&mut self, _: DummyForward, _: &mut SyncContext<Self>) -> Self::Result {
        catch_unwind(AssertUnwindSafe(|| self.dummy_forward()))
            .unwrap_or_else(|p| Err(format!("dummy forward panicked: {}", panic_message(&p))))
    }
}

/// With the `fault-injection` feature, a step containing a request sampled with this seed fails
/// in the runner (tests of failure handling).
pub const FAULT_SEED: u64 = 0xFA17_FA17;

fn panic_message(p: &Box<dyn std::any::Any + Send>) -> String {
    p.downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| p.downcast_ref::<String>().cloned())
        .unwrap_or_default()
}
