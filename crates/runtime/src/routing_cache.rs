//! The routing host-cache actor: owns `routed_routing::RoutingStore`, stores each step's rows as
//! the copy worker delivers them, and reconstructs finished sequences' rows once the store has
//! caught up with the step that computed them (the watermark).

use crate::{
    cache_manager::CacheManagerActor,
    messages::{Forget, FreeBlocks, GetRoutingBytes, Reconstruct, StoreStep},
    timings::Timings,
};
use actix::{Actor, Addr, Context, Handler, ResponseFuture};
use routed_routing::RoutingStore;
use routed_types::{RoutingRows, StepId};
use std::{sync::Arc, time::Instant};
use tokio::sync::oneshot;

type Pending = (Reconstruct, oneshot::Sender<Result<RoutingRows, String>>);

/// Owns the per-block routing rows.
pub struct RoutingCacheActor {
    store: RoutingStore,
    /// Last step stored; `None` before the first.
    watermark: Option<StepId>,
    pending: Vec<Pending>,
    cache: Addr<CacheManagerActor>,
    timings: Arc<Timings>,
}

impl RoutingCacheActor {
    /// An actor around `store`, reporting lost rows to `cache`.
    pub fn new(store: RoutingStore, cache: Addr<CacheManagerActor>, timings: Arc<Timings>) -> Self {
        Self { store, watermark: None, pending: Vec::new(), cache, timings }
    }

    fn reconstruct(&self, r: &Reconstruct) -> Result<RoutingRows, String> {
        self.store.reconstruct(&r.table, r.num_rows, r.start).map_err(|e| e.to_string())
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
        if let Err(e) = self.store.store_step(&msg.ids, &msg.slot_mapping, &msg.blocks) {
            tracing::error!(step = msg.step_id.0, "routing rows not stored: {e}");
        }
        Timings::add(&self.timings.store_ns, started.elapsed());
        self.watermark = Some(msg.step_id);
        let lost = self.store.take_lost();
        if !lost.is_empty() {
            self.cache.do_send(Forget(lost.iter().map(|l| (l.block, l.generation)).collect()));
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
    type Result = ResponseFuture<Result<RoutingRows, String>>;

    fn handle(&mut self, msg: Reconstruct, _: &mut Context<Self>) -> Self::Result {
        if self.caught_up(msg.after_step) {
            let result = self.reconstruct(&msg);
            return Box::pin(async move { result });
        }
        let (tx, rx) = oneshot::channel();
        self.pending.push((msg, tx));
        Box::pin(async move {
            rx.await.unwrap_or_else(|_| Err("the routing host-cache stopped".into()))
        })
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
