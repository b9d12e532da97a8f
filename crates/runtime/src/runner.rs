//! The model runner actor: one per rank, on a dedicated OS thread (actix `SyncArbiter`), since
//! device work blocks. It is thin on purpose: the device work is its [`Worker`]'s. The runner
//! keeps the rank, contains panics (`catch_unwind`: actix does not catch them), and on rank 0
//! takes a routing slot for each step, queues the copy of the step's routing into it after the
//! forward and hands it to the D2H copy worker. It executes one message at a time, so a dummy
//! forward and a real step never overlap.

use crate::{
    MemoryTags,
    copy_worker::{CopyRouting, CopyWorkerHandle},
    routing_ring::SlotRing,
    timings::Timings,
    worker::{LockstepId, Worker, WorkerError},
};
use actix::{Actor, Handler, Message, SyncContext};
use routed_types::{StepOutput, StepPlan};
use std::{
    panic::{AssertUnwindSafe, catch_unwind},
    path::Path,
    sync::Arc,
    time::Instant,
};

/// Executor -> runner: execute one step as lockstep unit `unit` (every rank gets the same plan and
/// unit). Reply: the step's output (sampled tokens on rank 0, none elsewhere), or why the step
/// failed on this rank; a failing rank releases the other ranks of the unit.
#[derive(Message)]
#[rtype(result = "Result<StepOutput, WorkerError>")]
pub struct Execute {
    /// The step, shared by every rank.
    pub plan: Arc<StepPlan>,
    /// Its lockstep unit.
    pub unit: LockstepId,
}

/// Executor -> runner: one dummy forward on the scratch block and scratch state as lockstep unit
/// `unit`; records no routing, touches no sequence's KV, state or snapshot. Reply: whether it ran.
#[derive(Message)]
#[rtype(result = "Result<(), WorkerError>")]
pub struct DummyForward {
    /// Its lockstep unit.
    pub unit: LockstepId,
}

/// Executor -> runner: load this rank's part of the checkpoint in `dir` beside the weights in use
/// (a weight update's first phase). Reply: whether it can replace them, and if not why.
#[derive(Message)]
#[rtype(result = "Result<(), WorkerError>")]
pub struct StageWeights {
    /// The checkpoint.
    pub dir: Arc<Path>,
}

/// Executor -> runner: the weight update's second phase: put the staged weights in use
/// (`commit`), or drop them because another rank refused its part. Reply: whether the commit
/// went through (dropping always does).
#[derive(Message)]
#[rtype(result = "Result<(), WorkerError>")]
pub struct SettleWeights {
    /// Whether to put them in use.
    pub commit: bool,
}

/// Executor -> runner: give back the memory of `tags` ([`Worker::release_memory`]). Reply: the
/// bytes freed.
#[derive(Message)]
#[rtype(result = "Result<usize, WorkerError>")]
pub struct ReleaseMemory {
    /// What to give back.
    pub tags: MemoryTags,
}

/// Executor -> runner: take the memory of `tags` again, the weights loaded from `dir`
/// ([`Worker::resume_memory`]). Reply: the bytes allocated.
#[derive(Message)]
#[rtype(result = "Result<usize, WorkerError>")]
pub struct ResumeMemory {
    /// What to take again.
    pub tags: MemoryTags,
    /// The checkpoint served.
    pub dir: Arc<Path>,
}

/// Where rank 0's routing goes. Other ranks have none: their expert ids are rank 0's (routers are
/// replicated), so their routing buffers are written and never read.
pub struct RoutingSink {
    /// The host slots of rank 0's routing buffer.
    pub ring: SlotRing,
    /// The copy worker that reads the slots.
    pub copy: CopyWorkerHandle,
}

/// Executes steps on one rank.
pub struct RunnerActor {
    rank: usize,
    worker: Option<Box<dyn Worker>>,
    routing: Option<RoutingSink>,
    timings: Arc<Timings>,
}

impl RunnerActor {
    /// The runner of `worker`'s rank. `worker` is `None` only if it was lost (every message then
    /// fails with [`WorkerError::NoWorker`]).
    pub fn new(
        worker: Option<Box<dyn Worker>>,
        routing: Option<RoutingSink>,
        timings: Arc<Timings>,
    ) -> Self {
        let rank = worker.as_ref().map_or(0, |w| w.rank());
        Self { rank, worker, routing, timings }
    }

    fn execute(&mut self, plan: &StepPlan, unit: LockstepId) -> Result<StepOutput, WorkerError> {
        let worker = self.worker.as_deref_mut().ok_or(WorkerError::NoWorker)?;
        let Some(RoutingSink { ring, copy }) =
            self.routing.as_ref().filter(|_| plan.capture_routing)
        else {
            let started = Instant::now();
            let step = contain(|| worker.execute(plan, unit))?;
            // Rank 0's figures only (the ranks of a group step together).
            if self.rank == 0 {
                self.timings.add_step(started.elapsed(), step.device_time);
            }
            return Ok(step.output);
        };
        // The slot is taken first, so a step whose routing could not be kept does not run. When
        // every slot is in flight this waits for the copy worker to read one: backpressure,
        // never an overwrite. Whatever happens below, an unsubmitted lease returns its slot.
        let lease = match ring.acquire(copy.alive()) {
            Ok((lease, waited)) => {
                Timings::add(&self.timings.slot_wait_ns, waited);
                lease
            }
            Err(_) => {
                worker.abort(unit);
                return Err(WorkerError::CopyWorkerGone);
            }
        };
        let started = Instant::now();
        let step = contain(|| worker.execute(plan, unit))?;
        self.timings.add_step(started.elapsed(), step.device_time);
        let started = Instant::now();
        let msg = CopyRouting {
            step_id: plan.step_id,
            routing: lease.submit(plan.num_tokens())?,
            slot_mapping: step.slot_mapping,
            blocks: step.blocks,
            is_prompt: prompt_positions(plan),
        };
        // A message that comes back returns its slot when dropped.
        copy.copy(msg).map_err(|_| WorkerError::CopyWorkerGone)?;
        Timings::add(&self.timings.capture_ns, started.elapsed());
        Ok(step.output)
    }
}

/// Whether each token of the step sits at a prompt position, in batch order.
fn prompt_positions(plan: &StepPlan) -> Vec<bool> {
    let mut is_prompt = Vec::with_capacity(plan.num_tokens());
    for s in &plan.seqs {
        let positions = s.num_computed_tokens..s.num_computed_tokens + s.token_ids.len();
        is_prompt.extend(positions.map(|p| p < s.num_prompt_tokens));
    }
    is_prompt
}

/// Runs `f`, turning a panic into [`WorkerError::Panicked`].
fn contain<T>(f: impl FnOnce() -> Result<T, WorkerError>) -> Result<T, WorkerError> {
    catch_unwind(AssertUnwindSafe(f)).unwrap_or_else(|p| Err(WorkerError::Panicked(message(&p))))
}

fn message(p: &Box<dyn std::any::Any + Send>) -> String {
    p.downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| p.downcast_ref::<String>().cloned())
        .unwrap_or_default()
}

impl Actor for RunnerActor {
    type Context = SyncContext<Self>;

    fn started(&mut self, _: &mut SyncContext<Self>) {
        tracing::debug!(rank = self.rank, "runner started");
    }
}

impl Handler<Execute> for RunnerActor {
    type Result = Result<StepOutput, WorkerError>;

    fn handle(&mut self, msg: Execute, _: &mut SyncContext<Self>) -> Self::Result {
        self.execute(&msg.plan, msg.unit)
    }
}

impl Handler<StageWeights> for RunnerActor {
    type Result = Result<(), WorkerError>;

    fn handle(&mut self, msg: StageWeights, _: &mut SyncContext<Self>) -> Self::Result {
        let worker = self.worker.as_deref_mut().ok_or(WorkerError::NoWorker)?;
        contain(|| worker.stage_weights(&msg.dir))
    }
}

impl Handler<SettleWeights> for RunnerActor {
    type Result = Result<(), WorkerError>;

    fn handle(&mut self, msg: SettleWeights, _: &mut SyncContext<Self>) -> Self::Result {
        let worker = self.worker.as_deref_mut().ok_or(WorkerError::NoWorker)?;
        if msg.commit {
            return contain(|| worker.commit_weights());
        }
        worker.discard_weights();
        Ok(())
    }
}

impl Handler<ReleaseMemory> for RunnerActor {
    type Result = Result<usize, WorkerError>;

    fn handle(&mut self, msg: ReleaseMemory, _: &mut SyncContext<Self>) -> Self::Result {
        let worker = self.worker.as_deref_mut().ok_or(WorkerError::NoWorker)?;
        contain(|| worker.release_memory(msg.tags))
    }
}

impl Handler<ResumeMemory> for RunnerActor {
    type Result = Result<usize, WorkerError>;

    fn handle(&mut self, msg: ResumeMemory, _: &mut SyncContext<Self>) -> Self::Result {
        let worker = self.worker.as_deref_mut().ok_or(WorkerError::NoWorker)?;
        contain(|| worker.resume_memory(msg.tags, &msg.dir))
    }
}

impl Handler<DummyForward> for RunnerActor {
    type Result = Result<(), WorkerError>;

    fn handle(&mut self, msg: DummyForward, _: &mut SyncContext<Self>) -> Self::Result {
        let worker = self.worker.as_deref_mut().ok_or(WorkerError::NoWorker)?;
        contain(|| worker.dummy_forward(msg.unit))
    }
}
