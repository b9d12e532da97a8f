//! Giving memory back between rollout steps (an RL trainer colocated on the same device: SGLang's
//! `release_memory_occupation` / `resume_memory_occupation`, vLLM's `sleep` / `wake_up`).
//!
//! A release needs no request to hold KV blocks or state slots: requests running are refused
//! (pause with `retract` or `abort` first, abort them, or let them finish; one whose abort waits
//! for the step in flight does not count); waiting, retracted and held ones stay and run once the
//! memory is back. The release runs between steps: the last step's
//! commits and frees reach the cache manager first, the prefix cache is dropped (its blocks lose
//! their contents; and weights taken again are read from disk, which may have changed), then
//! every rank gives the memory back. While the weights or the KV cache are released no step and
//! no dummy forward is sent, a weight update is refused (resume the weights first, as SGLang and
//! vLLM order it), and requests submitted wait. A resume allocates again (empty KV blocks and
//! states; the weights loaded from the checkpoint served) and steps start again.

use super::SchedulerActor;
use crate::{
    EngineError, MemoryChange, MemoryTags,
    cache_manager::ResetPrefixCache,
    executor::{ExecutorError, ReleaseMemory as ReleaseRanks, ResumeMemory as ResumeRanks},
    metrics as names,
    routing_cache::FreeBlocks,
    worker::WorkerError,
};
use actix::{ActorFutureExt, AsyncContext, Context, Handler, Message, ResponseFuture, WrapFuture};
use routed_types::SeqId;
use std::collections::VecDeque;
use tokio::sync::oneshot;

/// Handle -> scheduler: give back the memory of `tags` on every rank. Reply once it is given back
/// (after the step in flight), with what is released and the bytes freed; refused
/// ([`EngineError::Conflict`]) while a request holds KV blocks (one whose abort waits for the step
/// in flight does not count: it ends first) or a weight update is queued.
#[derive(Message)]
#[rtype(result = "Result<MemoryChange, EngineError>")]
pub struct ReleaseMemory(pub MemoryTags);

/// Handle -> scheduler: take the memory of `tags` again (what of it is released): empty KV blocks
/// and states, the weights loaded from the checkpoint served. Reply with what is still released
/// and the bytes allocated; a checkpoint that cannot be loaded leaves the weights released
/// ([`EngineError::InvalidRequest`] naming `model_path`).
#[derive(Message)]
#[rtype(result = "Result<MemoryChange, EngineError>")]
pub struct ResumeMemory(pub MemoryTags);

/// Handle -> scheduler: the memory released now.
#[derive(Message)]
#[rtype(result = "MemoryTags")]
pub struct GetMemory;

/// A release or a resume waiting for the step in flight.
struct MemoryOp {
    release: bool,
    tags: MemoryTags,
    reply: oneshot::Sender<Result<MemoryChange, EngineError>>,
}

/// The scheduler's side of memory releases.
#[derive(Default)]
pub(super) struct Memory {
    /// What the ranks gave back.
    released: MemoryTags,
    /// Releases and resumes in arrival order.
    ops: VecDeque<MemoryOp>,
    /// Whether the front one is with the ranks.
    busy: bool,
}

impl Memory {
    /// Whether a release or resume is with the ranks: no step may be planned.
    pub fn is_busy(&self) -> bool {
        self.busy
    }

    /// Whether steps cannot run: the weights or the KV cache are released.
    pub fn stops_steps(&self) -> bool {
        self.released.stops_steps()
    }

    /// What is released.
    pub fn released(&self) -> MemoryTags {
        self.released
    }

    /// Whether the weights are released.
    pub fn weights_released(&self) -> bool {
        self.released.weights
    }
}

impl SchedulerActor {
    /// Whether the front release or resume can go to the ranks: no step or round trip in flight,
    /// and (for a release) the last step's commits and frees delivered.
    pub(super) fn memory_op_is_due(&self) -> bool {
        !self.memory.busy && !self.step_in_flight && !self.memory.ops.is_empty()
    }

    /// Runs the front release or resume: first the round trip that delivers the last step's
    /// commits and frees, then the ranks.
    pub(super) fn run_memory_op(&mut self, ctx: &mut Context<Self>) {
        if self.policy.has_messages() {
            return self.housekeep(ctx);
        }
        let Some(op) = self.memory.ops.front() else { return };
        let (release, tags) = (op.release, op.tags);
        if release && let Err(e) = self.can_release() {
            if let Some(op) = self.memory.ops.pop_front() {
                self.peers.outbox.answer(op.reply, Err(e));
            }
            return self.schedule(ctx);
        }
        self.memory.busy = true;
        let executor = self.peers.executor.clone();
        let (cache, routing) = (self.peers.cache.clone(), self.peers.routing.clone());
        let dir = self.updates.weights.dir.clone();
        let trip = async move {
            if !release {
                return executor.send(ResumeRanks { tags, dir }).await;
            }
            if tags.stops_steps() {
                // The blocks lose their contents (and weights read again may differ).
                let dropped = cache.send(ResetPrefixCache).await?;
                routing.do_send(FreeBlocks(dropped));
            }
            executor.send(ReleaseRanks(tags)).await
        };
        ctx.spawn(trip.into_actor(self).map(move |res, act, ctx| {
            act.memory.busy = false;
            act.on_memory_op(release, tags, res);
            act.schedule(ctx);
        }));
    }

    fn on_memory_op(
        &mut self,
        release: bool,
        tags: MemoryTags,
        res: Result<Result<usize, ExecutorError>, actix::MailboxError>,
    ) {
        let Some(op) = self.memory.ops.pop_front() else { return };
        // Graphs are captured again by the next decode steps: they never stay released.
        let kept = MemoryTags { cuda_graph: false, ..tags };
        let result = match res {
            Ok(Ok(num_bytes)) => {
                self.memory.released = if release {
                    self.memory.released.union(kept)
                } else {
                    self.memory.released.minus(tags)
                };
                names::publish_memory(self.memory.released);
                let (what, names) = (if release { "released" } else { "resumed" }, tags.names());
                tracing::info!(?names, bytes = num_bytes, "memory {what}");
                Ok(MemoryChange { released: self.memory.released, num_bytes })
            }
            Ok(Err(ExecutorError::Rank { rank, source })) => {
                // Whatever the ranks gave back stays released until a resume takes it.
                if release {
                    self.memory.released = self.memory.released.union(kept);
                    names::publish_memory(self.memory.released);
                }
                let message = match self.peers.ranks.len() {
                    1 => source.to_string(),
                    _ => format!("rank {rank}: {source}"),
                };
                match source {
                    // The checkpoint served cannot be loaded again.
                    WorkerError::Weights(_) => {
                        Err(EngineError::InvalidRequest { param: "model_path", message })
                    }
                    _ => Err(EngineError::Conflict(message)),
                }
            }
            Ok(Err(e)) => {
                self.fail_engine(e.to_string());
                Err(EngineError::Unhealthy(e.to_string()))
            }
            Err(e) => {
                self.fail_engine(format!("executor unreachable: {e}"));
                Err(EngineError::ShutDown)
            }
        };
        self.peers.outbox.answer(op.reply, result);
    }

    /// Why memory cannot be released now, if it cannot.
    fn can_release(&self) -> Result<(), EngineError> {
        self.health()?;
        if self.updates.is_pending() {
            return Err(EngineError::Conflict(
                "a weight update is in progress: release memory once it is done".into(),
            ));
        }
        // A request whose abort waits for the step in flight ends with that step, before any
        // release runs: a trainer may abort everything and release at once.
        let aborting = |id: &&SeqId| {
            let (request, index) = (id.request(), Some(id.index_in_request()));
            self.pending_aborts.iter().any(|&(r, i)| r == request && (i.is_none() || i == index))
        };
        match self.policy.running().iter().filter(|id| !aborting(id)).count() {
            0 => Ok(()),
            n => Err(EngineError::Conflict(format!(
                "{n} requests are running: let them finish, or pause generation with mode \
                 retract or abort, before releasing memory"
            ))),
        }
    }

    /// While the weights or the KV cache are released, instead of planning a step: the round
    /// trips that need no step.
    pub(super) fn keep_released(&mut self, ctx: &mut Context<Self>) {
        self.tell_heartbeat();
        if self.policy.has_messages() {
            return self.housekeep(ctx);
        }
        // A shutdown ended what waited for the memory: nothing is left to drain.
        self.check_drained();
    }

    /// A weight update needs the weights in memory.
    pub(super) fn check_weights_resident(&self) -> Result<(), EngineError> {
        if self.memory.weights_released() {
            return Err(EngineError::Conflict(
                "the weights are released: resume them (resume_memory_occupation with tags \
                 [\"weights\"], or wake_up) before updating them"
                    .into(),
            ));
        }
        Ok(())
    }

    /// Shutting down or failing: the releases and resumes not started get `error`.
    pub(super) fn cancel_memory_ops(&mut self, error: &EngineError) {
        let keep = usize::from(self.memory.busy);
        for op in self.memory.ops.drain(keep..) {
            self.peers.outbox.answer(op.reply, Err(error.clone()));
        }
    }

    fn queue_memory_op(
        &mut self,
        release: bool,
        tags: MemoryTags,
        ctx: &mut Context<Self>,
    ) -> ResponseFuture<Result<MemoryChange, EngineError>> {
        let checked = if release { self.can_release() } else { self.health() };
        if let Err(e) = checked {
            return Box::pin(async move { Err(e) });
        }
        let (reply, rx) = oneshot::channel();
        self.memory.ops.push_back(MemoryOp { release, tags, reply });
        self.schedule(ctx);
        Box::pin(async move { rx.await.unwrap_or(Err(EngineError::ShutDown)) })
    }
}

impl Handler<ReleaseMemory> for SchedulerActor {
    type Result = ResponseFuture<Result<MemoryChange, EngineError>>;

    fn handle(&mut self, msg: ReleaseMemory, ctx: &mut Context<Self>) -> Self::Result {
        self.queue_memory_op(true, msg.0, ctx)
    }
}

impl Handler<ResumeMemory> for SchedulerActor {
    type Result = ResponseFuture<Result<MemoryChange, EngineError>>;

    fn handle(&mut self, msg: ResumeMemory, ctx: &mut Context<Self>) -> Self::Result {
        self.queue_memory_op(false, msg.0, ctx)
    }
}

impl Handler<GetMemory> for SchedulerActor {
    type Result = actix::MessageResult<GetMemory>;

    fn handle(&mut self, _: GetMemory, _: &mut Context<Self>) -> Self::Result {
        actix::MessageResult(self.memory.released)
    }
}
