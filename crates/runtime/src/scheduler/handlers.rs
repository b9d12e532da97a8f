//! The messages the scheduler actor answers, its stats, and the drain on shutdown.

use super::SchedulerActor;
use crate::{
    EngineError, EngineStats, GenerateRequest, RequestEvent,
    cache_manager::{GetCacheStats, ResetPrefixCache},
    heartbeat::DummyForwardDone,
    metrics as names,
    routing_cache::{ExpertLoads, FreeBlocks, GetExpertLoad, GetRoutingBytes, ResetExpertLoad},
    timings::Timings,
};
use actix::{Context, Handler, Message, ResponseActFuture, ResponseFuture, WrapFuture};
use routed_types::RequestId;
use tokio::sync::{mpsc::UnboundedSender, oneshot};

/// Handle -> scheduler: a new request; its events go to `events`. Reply: its id, or why it was
/// refused (overloaded, invalid, shutting down).
#[derive(Message)]
#[rtype(result = "Result<RequestId, EngineError>")]
pub struct Submit {
    /// The request.
    pub request: GenerateRequest,
    /// Where its events go.
    pub events: UnboundedSender<RequestEvent>,
}

/// Handle -> scheduler: abort a request: every sequence, or continuation `index` alone (its
/// siblings go on). No reply; unknown ids and indices are ignored.
#[derive(Message)]
#[rtype(result = "()")]
pub struct Abort {
    /// The request.
    pub request: RequestId,
    /// The one continuation to end, or `None` for all of them.
    pub index: Option<usize>,
}

/// Handle -> scheduler: the engine's figures.
#[derive(Message)]
#[rtype(result = "EngineStats")]
pub struct GetStats;

/// Handle -> scheduler: tokens per expert per MoE layer (forwarded to the routing host-cache,
/// which counts them). Reply: the counts, `None` for a model without MoE layers or when the
/// host-cache is gone.
#[derive(Message)]
#[rtype(result = "Option<ExpertLoads>")]
pub struct ExpertLoadStats;

/// Handle -> scheduler: reset the prefix cache (between steps). Reply: whether it ran.
#[derive(Message)]
#[rtype(result = "bool")]
pub struct ResetCache;

/// Handle -> scheduler: whether the engine can serve.
#[derive(Message)]
#[rtype(result = "Result<(), EngineError>")]
pub struct Health;

/// Handle -> scheduler: stop accepting requests, let in-flight ones finish, then stop the actor
/// system. Reply when drained.
#[derive(Message)]
#[rtype(result = "()")]
pub struct Shutdown;

impl SchedulerActor {
    /// Once shutting down and drained: answers the waiting [`Shutdown`]s and stops the system.
    pub(super) fn check_drained(&mut self) {
        if !self.shutting_down
            || self.step_in_flight
            || self.updates.is_swapping()
            || self.memory.is_busy()
            || !self.groups.is_empty() && self.unhealthy.is_none()
        {
            return;
        }
        if self.drained.is_empty() {
            return;
        }
        for tx in self.drained.drain(..) {
            self.peers.outbox.answer(tx, ());
        }
        // Everything is drained: stop the actors (the system stops them in order, mailboxes
        // first) and let the engine thread end.
        actix::System::current().stop();
    }
}

impl Handler<Submit> for SchedulerActor {
    type Result = Result<RequestId, EngineError>;

    fn handle(&mut self, msg: Submit, ctx: &mut Context<Self>) -> Self::Result {
        self.submit(msg, ctx)
    }
}

impl Handler<Abort> for SchedulerActor {
    type Result = ();

    fn handle(&mut self, msg: Abort, ctx: &mut Context<Self>) {
        self.abort(msg.request, msg.index, ctx);
    }
}

impl Handler<DummyForwardDone> for SchedulerActor {
    type Result = ();

    fn handle(&mut self, _: DummyForwardDone, _: &mut Context<Self>) {
        self.stats.num_dummy_forwards += 1;
        metrics::counter!(names::DUMMY_FORWARDS).increment(1);
    }
}

impl Handler<GetStats> for SchedulerActor {
    type Result = ResponseFuture<EngineStats>;

    fn handle(&mut self, _: GetStats, _: &mut Context<Self>) -> Self::Result {
        let mut stats = self.stats.clone();
        stats.num_running = self.policy.num_running();
        stats.num_waiting = self.policy.num_waiting();
        stats.num_live_states_held = self.policy.num_live_states_held();
        let t = &self.peers.timings;
        stats.forward_seconds = Timings::seconds(&t.forward_ns);
        stats.device_seconds = Timings::seconds(&t.device_ns);
        stats.routing_capture_seconds = Timings::seconds(&t.capture_ns);
        stats.routing_copy_seconds = Timings::seconds(&t.copy_ns);
        stats.routing_slot_wait_seconds = Timings::seconds(&t.slot_wait_ns);
        stats.routing_store_seconds = Timings::seconds(&t.store_ns);
        let collective = self
            .peers
            .ranks
            .iter()
            .map(|r| r.time_spent())
            .fold(routed_backend::collective::CollectiveTime::default(), |a, b| a + b);
        stats.collective_wait_seconds = collective.waiting.as_secs_f64();
        stats.collective_exchange_seconds = collective.exchanging.as_secs_f64();
        let (cache, routing) = (self.peers.cache.clone(), self.peers.routing.clone());
        let meta = self.info.routing.clone();
        Box::pin(async move {
            if let Ok(c) = cache.send(GetCacheStats).await {
                stats.apply_cache(&c);
            }
            stats.routing_bytes_held = routing.send(GetRoutingBytes).await.unwrap_or(0);
            names::publish(&stats);
            if let (Some(meta), Ok(load)) = (&meta, routing.send(GetExpertLoad).await) {
                names::publish_expert_load(&load.since_start, &meta.moe_layer_ids);
            }
            stats
        })
    }
}

impl Handler<ExpertLoadStats> for SchedulerActor {
    type Result = ResponseFuture<Option<ExpertLoads>>;

    fn handle(&mut self, _: ExpertLoadStats, _: &mut Context<Self>) -> Self::Result {
        let routing = self.peers.routing.clone();
        let moe = self.info.routing.is_some();
        Box::pin(async move { if moe { routing.send(GetExpertLoad).await.ok() } else { None } })
    }
}

/// Forwarded to the routing host-cache, which owns the counts.
impl Handler<ResetExpertLoad> for SchedulerActor {
    type Result = ();

    fn handle(&mut self, msg: ResetExpertLoad, _: &mut Context<Self>) {
        self.peers.routing.do_send(msg);
    }
}

impl Handler<ResetCache> for SchedulerActor {
    type Result = ResponseFuture<bool>;

    fn handle(&mut self, _: ResetCache, _: &mut Context<Self>) -> Self::Result {
        let (cache, routing) = (self.peers.cache.clone(), self.peers.routing.clone());
        Box::pin(async move {
            match cache.send(ResetPrefixCache).await {
                Ok(dropped) => {
                    routing.do_send(FreeBlocks(dropped));
                    true
                }
                Err(_) => false,
            }
        })
    }
}

impl SchedulerActor {
    /// Whether the engine can serve: what [`Health`] answers, and why the requests that change
    /// its state (updates, pauses) are refused.
    pub(super) fn health(&self) -> Result<(), EngineError> {
        match &self.unhealthy {
            Some(reason) => Err(EngineError::Unhealthy(reason.clone())),
            None if self.shutting_down => Err(EngineError::ShutDown),
            None => Ok(()),
        }
    }
}

impl Handler<Health> for SchedulerActor {
    type Result = Result<(), EngineError>;

    fn handle(&mut self, _: Health, _: &mut Context<Self>) -> Self::Result {
        self.health()
    }
}

impl Handler<Shutdown> for SchedulerActor {
    type Result = ResponseActFuture<Self, ()>;

    fn handle(&mut self, _: Shutdown, ctx: &mut Context<Self>) -> Self::Result {
        self.shutting_down = true;
        let (tx, rx) = oneshot::channel();
        self.drained.push(tx);
        // A pause ends and requests held for a weight update that will not come are admitted:
        // every request drains.
        let paused = self.pause.is_some();
        self.drop_pause(&EngineError::ShutDown);
        self.cancel_memory_ops(&EngineError::ShutDown);
        if self.memory.stops_steps() {
            // Nothing can run without the memory: the requests waiting for it end now.
            for request in self.open_requests() {
                self.abort(request, None, ctx);
            }
        }
        if self.cancel_updates() || paused {
            self.schedule(ctx);
        }
        self.check_drained();
        Box::pin(
            async move {
                let _ = rx.await;
            }
            .into_actor(self),
        )
    }
}
