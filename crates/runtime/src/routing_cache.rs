//! The routing host-cache actor: owns `routed_routing::RoutingStore`, stores each step's rows as
//! the copy worker delivers them, and reconstructs finished sequences' rows once the store has
//! caught up with the step that computed them (the watermark).

use crate::{
    cache_manager::{CacheManagerActor, Forget},
    timings::Timings,
};
use actix::{Actor, Addr, Context, Handler, Message, ResponseFuture};
use routed_routing::{ExpertLoad, RoutingError, RoutingStore};
use routed_types::{BlockRef, RoutingRows, StepId};
use std::{sync::Arc, time::Instant};
use tokio::sync::oneshot;

/// Copy worker -> routing host-cache: store a step's rows `(L, N, K)` through its slot mapping.
/// Steps arrive in order; the step id becomes the store's watermark. No reply.
#[derive(Message)]
#[rtype(result = "()")]
pub struct StoreStep {
    /// The step.
    pub step_id: StepId,
    /// Expert ids, `(L, N, K)`.
    pub ids: Vec<i16>,
    /// KV slot of each token.
    pub slot_mapping: Vec<usize>,
    /// Blocks written, with their generations.
    pub blocks: Vec<BlockRef>,
    /// Whether each token sat at a prompt position.
    pub is_prompt: Vec<bool>,
}

/// Scheduler -> routing host-cache: a finished sequence's rows `[start, num_rows)` from its block
/// table. Answered only once the store has stored `after_step` (the last step that computed the
/// sequence), so a lagging copy never leaves rows missing. Reply: the rows, or the error naming
/// the missing position.
#[derive(Message)]
#[rtype(result = "Result<RoutingRows, ReconstructError>")]
pub struct Reconstruct {
    /// The sequence's block table.
    pub table: Arc<[BlockRef]>,
    /// Rows the sequence has: prompt + generated - 1.
    pub num_rows: usize,
    /// Rows to drop from the front.
    pub start: usize,
    /// The last step whose rows are needed.
    pub after_step: StepId,
}

/// Scheduler -> routing host-cache: blocks changed hands (freed, evicted, reset); their rows go.
/// No reply.
#[derive(Message)]
#[rtype(result = "()")]
pub struct FreeBlocks(pub Vec<BlockRef>);

/// Scheduler -> routing host-cache: bytes of rows held (for stats).
#[derive(Message)]
#[rtype(result = "usize")]
pub struct GetRoutingBytes;

/// Scheduler -> routing host-cache: tokens per expert per MoE layer, since the engine started
/// and since the last [`ResetExpertLoad`]. Reply: both.
#[derive(Message)]
#[rtype(result = "ExpertLoads")]
pub struct GetExpertLoad;

/// Scheduler -> routing host-cache: start the since-reset counts from zero. No reply.
#[derive(Message)]
#[rtype(result = "()")]
pub struct ResetExpertLoad;

/// Expert load counts over two windows.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExpertLoads {
    /// Since the engine started (Prometheus counters).
    pub since_start: ExpertLoad,
    /// Since the last reset (`GET /v1/routing/stats`).
    pub since_reset: ExpertLoad,
}

/// Why a [`Reconstruct`] has no rows.
#[derive(Debug, thiserror::Error)]
pub enum ReconstructError {
    /// A row is missing, stale or lost.
    #[error(transparent)]
    Rows(#[from] RoutingError),
    /// The host-cache stopped before the step's rows arrived.
    #[error("the routing host-cache stopped before the rows arrived")]
    Stopped,
}

type Pending = (Reconstruct, oneshot::Sender<Result<RoutingRows, ReconstructError>>);

/// Owns the per-block routing rows.
pub struct RoutingCacheActor {
    store: RoutingStore,
    /// Last step stored; `None` before the first.
    watermark: Option<StepId>,
    pending: Vec<Pending>,
    load: ExpertLoads,
    cache: Addr<CacheManagerActor>,
    timings: Arc<Timings>,
}

impl RoutingCacheActor {
    /// An actor around `store`, reporting lost rows to `cache`.
    pub fn new(store: RoutingStore, cache: Addr<CacheManagerActor>, timings: Arc<Timings>) -> Self {
        let load = ExpertLoad::new(store.num_moe_layers(), store.num_experts() as usize);
        let load = ExpertLoads { since_start: load.clone(), since_reset: load };
        Self { store, watermark: None, pending: Vec::new(), load, cache, timings }
    }

    fn reconstruct(&self, r: &Reconstruct) -> Result<RoutingRows, ReconstructError> {
        Ok(self.store.reconstruct(&r.table, r.num_rows, r.start)?)
    }

    fn caught_up(&self, step: StepId) -> bool {
        self.watermark.is_some_and(|w| w >= step)
    }
}

impl Actor for RoutingCacheActor {
    type Context = Context<Self>;
}

impl Handler<StoreStep> for RoutingCacheActor {
    type Result = ();

    fn handle(&mut self, msg: StoreStep, _: &mut Context<Self>) {
        let started = Instant::now();
        match self.store.store_step(&msg.ids, &msg.slot_mapping, &msg.blocks) {
            Ok(_) => {
                self.load.since_start.record(&msg.ids, &msg.is_prompt);
                self.load.since_reset.record(&msg.ids, &msg.is_prompt);
            }
            Err(e) => tracing::error!(step = msg.step_id.0, "routing rows not stored: {e}"),
        }
        Timings::add(&self.timings.store_ns, started.elapsed());
        self.watermark = Some(msg.step_id);
        let lost = self.store.take_lost();
        if !lost.is_empty() {
            self.cache.do_send(Forget(
                lost.iter().map(|l| BlockRef::new(l.block, l.generation)).collect(),
            ));
        }
        let (ready, waiting): (Vec<_>, Vec<_>) = std::mem::take(&mut self.pending)
            .into_iter()
            .partition(|(r, _)| self.caught_up(r.after_step));
        self.pending = waiting;
        for (r, reply) in ready {
            let _ = reply.send(self.reconstruct(&r));
        }
    }
}

impl Handler<Reconstruct> for RoutingCacheActor {
    type Result = ResponseFuture<Result<RoutingRows, ReconstructError>>;

    fn handle(&mut self, msg: Reconstruct, _: &mut Context<Self>) -> Self::Result {
        if self.caught_up(msg.after_step) {
            let result = self.reconstruct(&msg);
            return Box::pin(async move { result });
        }
        let (tx, rx) = oneshot::channel();
        self.pending.push((msg, tx));
        Box::pin(async move { rx.await.unwrap_or(Err(ReconstructError::Stopped)) })
    }
}

impl Handler<FreeBlocks> for RoutingCacheActor {
    type Result = ();

    fn handle(&mut self, msg: FreeBlocks, _: &mut Context<Self>) {
        self.store.free_blocks(&msg.0);
    }
}

impl Handler<GetRoutingBytes> for RoutingCacheActor {
    type Result = usize;

    fn handle(&mut self, _: GetRoutingBytes, _: &mut Context<Self>) -> usize {
        self.store.bytes_held()
    }
}

impl Handler<GetExpertLoad> for RoutingCacheActor {
    type Result = actix::MessageResult<GetExpertLoad>;

    fn handle(&mut self, _: GetExpertLoad, _: &mut Context<Self>) -> Self::Result {
        actix::MessageResult(self.load.clone())
    }
}

impl Handler<ResetExpertLoad> for RoutingCacheActor {
    type Result = ();

    fn handle(&mut self, _: ResetExpertLoad, _: &mut Context<Self>) {
        self.load.since_reset.reset();
    }
}
