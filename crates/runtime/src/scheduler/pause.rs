//! Pausing generation (an RL trainer between rollout steps: SGLang's `/pause_generation` and
//! `/continue_generation`), and flushing the cache when nothing runs.
//!
//! A pause stops planning steps once the step in flight is done. What happens to the requests
//! in flight is the [`PauseMode`]'s: aborted, retracted (their blocks and state slots released
//! through the next cache round trip, their tokens kept), left in place, or (`wait`) run to their
//! end first. Requests submitted while paused are held like those that arrive during a weight
//! update, and admitted on continue. While paused the scheduler still makes the cache round trips that need no step (the
//! last step's commits, frees, retractions), so finished requests free their blocks.
//!
//! A weight update while paused does not wait for the paused requests: it retracts the ones
//! still holding blocks before the swap, so no cache the old weights computed serves the new
//! ones; on continue they recompute their prompt and tokens on the new weights.

use super::SchedulerActor;
use crate::{
    Admission, EngineError, PauseMode, Paused,
    cache_manager::{PlanStep, ResetPrefixCache},
    outbox::Outbox,
    routing_cache::FreeBlocks,
};
use actix::{ActorFutureExt, AsyncContext, Context, Handler, Message, ResponseFuture, WrapFuture};
use routed_types::RequestId;
use tokio::sync::oneshot;

/// Handle -> scheduler: pause generation in `mode`. Reply once the pause holds: no step in
/// flight and, in [`PauseMode::Abort`] or [`PauseMode::Wait`], every request that was in flight
/// ended. Pausing again changes the mode (aborting, retracting or finishing what the earlier mode
/// left in place).
#[derive(Message)]
#[rtype(result = "Result<Paused, EngineError>")]
pub struct PauseGeneration(pub PauseMode);

/// Handle -> scheduler: end a pause: the paused requests resume and the held ones are admitted
/// (unless a weight update still holds them). Reply: how many held requests were admitted. Not
/// paused, it changes nothing.
#[derive(Message)]
#[rtype(result = "Result<usize, EngineError>")]
pub struct ContinueGeneration;

/// Handle -> scheduler: whether new requests run as they come.
#[derive(Message)]
#[rtype(result = "Admission")]
pub struct GetAdmission;

/// Handle -> scheduler: reset the prefix cache if no request is open (running, waiting, paused
/// or held) and no weight update is swapping. Reply: whether it did.
#[derive(Message)]
#[rtype(result = "Result<bool, EngineError>")]
pub struct FlushCache;

/// A pause in force.
pub(super) struct Pause {
    mode: PauseMode,
    /// Requests in flight when it was last asked for.
    num_requests: usize,
    /// Whether it took hold.
    holds: bool,
    /// Callers waiting for it to take hold.
    waiters: Vec<oneshot::Sender<Result<Paused, EngineError>>>,
}

impl Pause {
    fn outcome(&self) -> Paused {
        Paused { mode: self.mode, num_requests: self.num_requests }
    }

    /// Answers every waiting caller, behind the events already streamed.
    fn answer(&mut self, outbox: &mut Outbox, result: impl Fn() -> Result<Paused, EngineError>) {
        for tx in self.waiters.drain(..) {
            outbox.answer(tx, result());
        }
    }
}

impl SchedulerActor {
    /// Whether requests submitted now are held: a pause or a weight update is in force.
    pub(super) fn holds_new_requests(&self) -> bool {
        self.pause.is_some() || self.updates.is_pending()
    }

    /// Whether a pause took hold (a weight update may then swap without waiting for the paused
    /// requests).
    pub(super) fn pause_holds(&self) -> bool {
        self.pause.as_ref().is_some_and(|p| p.holds)
    }

    /// Requests open and not held: those a pause or an update acts on.
    pub(super) fn open_requests(&self) -> Vec<RequestId> {
        let held = |r| self.updates.is_held(r);
        self.groups.keys().copied().filter(|&r| !held(r)).collect()
    }

    /// How many requests are open and not held (held ones are open too).
    fn num_open_requests(&self) -> usize {
        self.groups.len().saturating_sub(self.updates.held_len())
    }

    /// Whether steps still run while paused: a `wait` pause lets the open requests finish.
    pub(super) fn pause_lets_requests_run(&self) -> bool {
        let waits = self.pause.as_ref().is_some_and(|p| p.mode == PauseMode::Wait);
        waits && self.num_open_requests() > 0
    }

    /// While paused, instead of planning a step: apply the mode, answer the callers once the
    /// pause holds, and make the cache round trip the last step's bookkeeping needs.
    pub(super) fn keep_paused(&mut self, ctx: &mut Context<Self>) {
        let Some(p) = &self.pause else { return };
        if p.mode == PauseMode::Retract {
            self.policy.retract_running();
        }
        let drains = matches!(p.mode, PauseMode::Abort | PauseMode::Wait);
        let ended = !drains || self.num_open_requests() == 0;
        if let Some(p) = self.pause.as_mut().filter(|p| ended && !p.holds) {
            p.holds = true;
            tracing::info!(mode = p.mode.as_str(), requests = p.num_requests, "generation paused");
            let outcome = p.outcome();
            p.answer(&mut self.peers.outbox, || Ok(outcome.clone()));
        }
        self.tell_heartbeat();
        if self.policy.has_messages() {
            self.housekeep(ctx);
        }
    }

    /// One cache round trip that plans nothing: commits, frees, retractions.
    pub(super) fn housekeep(&mut self, ctx: &mut Context<Self>) {
        self.step_in_flight = true;
        let step = self.policy.begin_housekeeping();
        let trip = self.peers.cache.send(PlanStep(step)).into_actor(self).map(|res, act, ctx| {
            act.step_in_flight = false;
            if act.take_grant(res).is_some() {
                act.schedule(ctx);
            }
        });
        ctx.spawn(trip);
    }

    /// Before a swap while paused: requests that still hold blocks the old weights computed give
    /// them up (the next round trip releases them) and will recompute on the new weights.
    pub(super) fn retract_for_swap(&mut self) {
        let n = self.policy.retract_running();
        if n > 0 {
            tracing::info!(sequences = n, "paused sequences retracted for the weight update");
        }
    }

    /// Ends a pause without admitting anything (shutting down or failing): its waiting callers
    /// get `error`.
    pub(super) fn drop_pause(&mut self, error: &EngineError) {
        if let Some(mut p) = self.pause.take() {
            p.answer(&mut self.peers.outbox, || Err(error.clone()));
        }
    }
}

impl Handler<PauseGeneration> for SchedulerActor {
    type Result = ResponseFuture<Result<Paused, EngineError>>;

    fn handle(&mut self, msg: PauseGeneration, ctx: &mut Context<Self>) -> Self::Result {
        if let Err(e) = self.health() {
            return Box::pin(async move { Err(e) });
        }
        let open = self.open_requests();
        let (tx, rx) = oneshot::channel();
        let mut waiters = self.pause.take().map(|p| p.waiters).unwrap_or_default();
        waiters.push(tx);
        let mode = msg.0;
        self.pause = Some(Pause { mode, num_requests: open.len(), holds: false, waiters });
        if mode == PauseMode::Abort {
            for request in open {
                self.abort(request, None, ctx);
            }
        }
        self.schedule(ctx);
        Box::pin(async move { rx.await.unwrap_or(Err(EngineError::ShutDown)) })
    }
}

impl Handler<ContinueGeneration> for SchedulerActor {
    type Result = Result<usize, EngineError>;

    fn handle(&mut self, _: ContinueGeneration, ctx: &mut Context<Self>) -> Self::Result {
        self.health()?;
        let Some(mut p) = self.pause.take() else { return Ok(0) };
        // Callers still waiting for the pause (an abort draining) learn what it did so far.
        let outcome = p.outcome();
        p.answer(&mut self.peers.outbox, || Ok(outcome.clone()));
        let mut num_admitted = 0;
        if !self.updates.is_pending() {
            num_admitted = self.updates.held_len();
            self.release_held();
        }
        tracing::info!(admitted = num_admitted, "generation continued");
        self.schedule(ctx);
        Ok(num_admitted)
    }
}

impl Handler<GetAdmission> for SchedulerActor {
    type Result = actix::MessageResult<GetAdmission>;

    fn handle(&mut self, _: GetAdmission, _: &mut Context<Self>) -> Self::Result {
        actix::MessageResult(Admission {
            paused: self.pause.as_ref().map(|p| p.mode),
            num_updates_pending: self.updates.queue_len(),
            num_held_requests: self.updates.held_len(),
            memory_released: self.memory.released(),
        })
    }
}

impl Handler<FlushCache> for SchedulerActor {
    type Result = ResponseFuture<Result<bool, EngineError>>;

    fn handle(&mut self, _: FlushCache, _: &mut Context<Self>) -> Self::Result {
        if let Err(e) = self.health() {
            return Box::pin(async move { Err(e) });
        }
        // With nothing open, a step in flight only carries the last one's commits and frees; the
        // reset queues behind it at the cache manager, and a commit that comes later publishes
        // nothing the reset should have dropped.
        if !self.groups.is_empty() || self.updates.is_swapping() {
            return Box::pin(async { Ok(false) });
        }
        let (cache, routing) = (self.peers.cache.clone(), self.peers.routing.clone());
        Box::pin(async move {
            let dropped = cache.send(ResetPrefixCache).await.map_err(|_| EngineError::ShutDown)?;
            routing.do_send(FreeBlocks(dropped));
            Ok(true)
        })
    }
}
