//! The executor actor: owns the runner actors (one per rank) and is what the scheduler and the
//! heartbeat talk to. Every step and every dummy forward goes to all ranks as one lockstep unit
//! with a fresh [`LockstepId`]; units run one at a time (the executor handles its messages
//! atomically), so every rank sees them in the same order. Rank 0's output is the step's result;
//! only rank 0 hands its routing to the copy worker.

use crate::{
    MemoryTags,
    runner::{self, DummyForward, Execute, RunnerActor, SettleWeights, StageWeights},
    worker::{LockstepId, WorkerError},
};
use actix::{
    Actor, ActorFutureExt, Addr, AtomicResponse, Context, Handler, MailboxError, Message,
    WrapFuture,
};
use futures_util::future::join_all;
use routed_types::{StepOutput, StepPlan};
use std::{
    path::{Path, PathBuf},
    sync::Arc,
};

/// Scheduler -> executor: execute one step on every rank. Reply: rank 0's output, or the error
/// that failed the step (the requests in it fail). A runner that is gone is reported as
/// [`ExecutorError::RunnerGone`]: the engine cannot serve any more.
#[derive(Message)]
#[rtype(result = "Result<StepOutput, ExecutorError>")]
pub struct ExecuteStep(pub StepPlan);

/// Heartbeat -> executor: one dummy forward on every rank, in lockstep. Reply: whether every rank
/// ran it.
#[derive(Message)]
#[rtype(result = "Result<(), ExecutorError>")]
pub struct RunDummyForward;

/// Scheduler -> executor: replace every rank's weights with the checkpoint in the directory: each
/// rank loads its part beside the weights in use, then all put theirs in use, or none does when a
/// rank refuses its part. No step or dummy forward runs meanwhile (the executor's units are
/// atomic). Reply: done, or why not.
#[derive(Message)]
#[rtype(result = "Result<(), SwapError>")]
pub struct SwapWeights(pub PathBuf);

/// Scheduler -> executor: give back the memory of `tags` on every rank (no step runs: the
/// scheduler asks only when none holds blocks). From then on, while the weights or the KV cache
/// are released, steps and dummy forwards are refused with [`ExecutorError::Released`]. Reply:
/// the bytes freed, every rank's together, or the first failure (what the other ranks released
/// stays released, for a resume to take back; a refusal that every rank made releases nothing).
#[derive(Message)]
#[rtype(result = "Result<usize, ExecutorError>")]
pub struct ReleaseMemory(pub MemoryTags);

/// Scheduler -> executor: take the memory of `tags` again on every rank, the weights loaded from
/// the checkpoint in the directory (the one served). Reply: the bytes allocated, every rank's
/// together, or the first failure (the tags then stay released).
#[derive(Message)]
#[rtype(result = "Result<usize, ExecutorError>")]
pub struct ResumeMemory {
    /// What to take again.
    pub tags: MemoryTags,
    /// The checkpoint served.
    pub dir: PathBuf,
}

/// Why a weight update did not go through.
#[derive(Debug, thiserror::Error)]
pub enum SwapError {
    /// A rank refused the checkpoint (unreadable, another model, another layout): every rank
    /// kept its weights.
    #[error("rank {rank}: {source}")]
    Refused {
        /// The first rank that refused.
        rank: usize,
        /// Why.
        source: WorkerError,
    },
    /// Putting the new weights in use failed on a rank, or a peer is gone: the ranks' weights
    /// can no longer be trusted.
    #[error("{0}")]
    Failed(String),
}

/// Why a unit failed.
#[derive(Debug, thiserror::Error)]
pub enum ExecutorError {
    /// A rank failed its part (the others were released and failed or finished theirs).
    #[error("rank {rank}: {source}")]
    Rank {
        /// The failing rank (the first whose error was not only a peer's abort).
        rank: usize,
        /// Why.
        source: WorkerError,
    },
    /// The weights or the KV cache are released: nothing can run until they are resumed.
    #[error("the {0} memory is released")]
    Released(&'static str),
    /// A runner's mailbox is closed: its thread is gone.
    #[error("the runner of rank {rank} is gone: {source}")]
    RunnerGone {
        /// The rank.
        rank: usize,
        /// The mailbox error.
        source: MailboxError,
    },
}

/// Sends lockstep units to every rank.
pub struct ExecutorActor {
    ranks: Vec<Addr<RunnerActor>>,
    last_unit: u64,
    /// The memory the ranks gave back.
    released: MemoryTags,
}

impl ExecutorActor {
    /// An executor over `ranks`, rank order.
    pub fn new(ranks: Vec<Addr<RunnerActor>>) -> Self {
        assert!(!ranks.is_empty(), "an executor drives at least one rank");
        Self { ranks, last_unit: 0, released: MemoryTags::default() }
    }

    fn next_unit(&mut self) -> LockstepId {
        self.last_unit += 1;
        LockstepId(self.last_unit)
    }

    /// Refuses a unit while what it needs is released.
    fn check_memory(&self) -> Result<(), ExecutorError> {
        match (self.released.weights, self.released.kv_cache) {
            (true, _) => Err(ExecutorError::Released("weights")),
            (_, true) => Err(ExecutorError::Released("KV cache")),
            _ => Ok(()),
        }
    }
}

/// Every rank's bytes together if every rank succeeded; else the failure [`combine`] picks.
fn sum_bytes(
    replies: Vec<Result<Result<usize, WorkerError>, MailboxError>>,
) -> Result<usize, ExecutorError> {
    let total = replies.iter().filter_map(|r| r.as_ref().ok()?.as_ref().ok()).sum();
    combine(replies).map(|_| total)
}

/// Rank 0's result if every rank succeeded; else the most telling failure: a gone runner first,
/// then the first rank whose error is its own rather than a peer's abort.
fn combine<T>(
    replies: Vec<Result<Result<T, WorkerError>, MailboxError>>,
) -> Result<T, ExecutorError> {
    let mut first_ok = None;
    let mut failure: Option<ExecutorError> = None;
    for (rank, reply) in replies.into_iter().enumerate() {
        let error = match reply {
            Ok(Ok(value)) => {
                if rank == 0 {
                    first_ok = Some(value);
                }
                continue;
            }
            Ok(Err(source)) => ExecutorError::Rank { rank, source },
            Err(source) => ExecutorError::RunnerGone { rank, source },
        };
        let better = match (&failure, &error) {
            (None, _) => true,
            (Some(ExecutorError::RunnerGone { .. }), _) => false,
            (_, ExecutorError::RunnerGone { .. }) => true,
            (Some(ExecutorError::Rank { source, .. }), _) => source.is_abort_by_peer(),
            // Never a rank's reply: the executor refuses before asking the ranks.
            (Some(ExecutorError::Released(_)), _) => false,
        };
        if better {
            failure = Some(error);
        }
    }
    match failure {
        Some(e) => Err(e),
        None => Ok(first_ok.expect("rank 0 answered")),
    }
}

impl Actor for ExecutorActor {
    type Context = Context<Self>;
}

impl Handler<ExecuteStep> for ExecutorActor {
    type Result = AtomicResponse<Self, Result<StepOutput, ExecutorError>>;

    fn handle(&mut self, msg: ExecuteStep, _: &mut Context<Self>) -> Self::Result {
        if let Err(e) = self.check_memory() {
            return AtomicResponse::new(Box::pin(actix::fut::ready(Err(e))));
        }
        let unit = self.next_unit();
        let plan = Arc::new(msg.0);
        let sends = self.ranks.iter().map(|r| r.send(Execute { plan: plan.clone(), unit }));
        let all = join_all(sends.collect::<Vec<_>>());
        AtomicResponse::new(Box::pin(all.into_actor(self).map(|replies, _, _| combine(replies))))
    }
}

impl Handler<RunDummyForward> for ExecutorActor {
    type Result = AtomicResponse<Self, Result<(), ExecutorError>>;

    fn handle(&mut self, _: RunDummyForward, _: &mut Context<Self>) -> Self::Result {
        if let Err(e) = self.check_memory() {
            return AtomicResponse::new(Box::pin(actix::fut::ready(Err(e))));
        }
        let unit = self.next_unit();
        let sends = self.ranks.iter().map(|r| r.send(DummyForward { unit }));
        let all = join_all(sends.collect::<Vec<_>>());
        AtomicResponse::new(Box::pin(all.into_actor(self).map(|replies, _, _| combine(replies))))
    }
}

impl Handler<SwapWeights> for ExecutorActor {
    type Result = AtomicResponse<Self, Result<(), SwapError>>;

    fn handle(&mut self, msg: SwapWeights, _: &mut Context<Self>) -> Self::Result {
        let ranks = self.ranks.clone();
        let dir: Arc<Path> = msg.0.into();
        let swap = async move {
            let stage = ranks.iter().map(|r| r.send(StageWeights { dir: dir.clone() }));
            let staged = combine(join_all(stage.collect::<Vec<_>>()).await);
            let commit = staged.is_ok();
            let settle = ranks.iter().map(|r| r.send(SettleWeights { commit }));
            let settled = combine(join_all(settle.collect::<Vec<_>>()).await);
            match staged {
                Err(ExecutorError::Rank { rank, source }) => {
                    Err(SwapError::Refused { rank, source })
                }
                Err(gone) => Err(SwapError::Failed(gone.to_string())),
                Ok(()) => settled.map_err(|e| SwapError::Failed(e.to_string())),
            }
        };
        AtomicResponse::new(Box::pin(swap.into_actor(self)))
    }
}

impl Handler<ReleaseMemory> for ExecutorActor {
    type Result = AtomicResponse<Self, Result<usize, ExecutorError>>;

    fn handle(&mut self, msg: ReleaseMemory, _: &mut Context<Self>) -> Self::Result {
        let tags = msg.0;
        let sends = self.ranks.iter().map(|r| r.send(runner::ReleaseMemory { tags }));
        let all = join_all(sends.collect::<Vec<_>>());
        AtomicResponse::new(Box::pin(all.into_actor(self).map(move |replies, act, _| {
            act.released = act.released.union(tags);
            sum_bytes(replies)
        })))
    }
}

impl Handler<ResumeMemory> for ExecutorActor {
    type Result = AtomicResponse<Self, Result<usize, ExecutorError>>;

    fn handle(&mut self, msg: ResumeMemory, _: &mut Context<Self>) -> Self::Result {
        let (tags, dir): (MemoryTags, Arc<Path>) = (msg.tags, msg.dir.into());
        let sends =
            self.ranks.iter().map(|r| r.send(runner::ResumeMemory { tags, dir: dir.clone() }));
        let all = join_all(sends.collect::<Vec<_>>());
        AtomicResponse::new(Box::pin(all.into_actor(self).map(move |replies, act, _| {
            let resumed = sum_bytes(replies);
            if resumed.is_ok() {
                act.released = act.released.minus(tags);
            }
            resumed
        })))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use routed_backend::collective::CollectiveError;
    use routed_model::ModelError;

    fn aborted() -> WorkerError {
        WorkerError::Model(ModelError::Collective(CollectiveError::Aborted { epoch: 1 }))
    }

    #[test]
    fn rank_zero_answers_when_every_rank_succeeds() {
        assert_eq!(combine::<u32>(vec![Ok(Ok(7)), Ok(Ok(8))]).unwrap(), 7);
    }

    #[test]
    fn the_reported_failure_is_the_cause_not_a_peer_abort() {
        let replies = vec![Ok(Err(aborted())), Ok(Err(WorkerError::Injected)), Ok(Ok(()))];
        match combine::<()>(replies) {
            Err(ExecutorError::Rank { rank: 1, source: WorkerError::Injected }) => {}
            other => panic!("got {other:?}"),
        }
        let replies = vec![Ok(Err(WorkerError::Injected)), Err(MailboxError::Closed)];
        assert!(matches!(combine::<()>(replies), Err(ExecutorError::RunnerGone { rank: 1, .. })));
    }
}
