//! Weight updates between requests (an RL trainer publishing its latest policy).
//!
//! An update waits until every request that arrived before it has ended (or, with
//! `abort_all_requests`, ends them at once). Requests that arrive meanwhile are held: validated,
//! given their ids and streams, and admitted only once the new weights serve. (Requests paused
//! across an update resume on the new weights: their outputs say which tokens each version
//! sampled.) Then the executor swaps every rank's weights (all ranks or none), the cache
//! manager drops its prefix cache, whose blocks, snapshots and routing rows the old weights
//! computed, and the held requests are admitted. No step is planned from the moment the swap
//! starts until the cache is reset, so no request can hit a stale block.

use super::SchedulerActor;
use crate::{
    EngineError, FinalOutput, RequestEvent, WeightUpdate, WeightsInfo, WeightsUpdated,
    cache_manager::ResetPrefixCache,
    executor::{SwapError, SwapWeights},
    metrics as names,
    outbox::FinalText,
    routing_cache::FreeBlocks,
};
use actix::{ActorFutureExt, AsyncContext, Context, Handler, Message, ResponseFuture, WrapFuture};
use routed_scheduler::NewSeq;
use routed_types::{FinishReason, RequestId};
use std::{collections::VecDeque, sync::Arc, time::Instant};
use tokio::sync::oneshot;

/// Handle -> scheduler: apply a weight update. Reply once the new weights serve, or why not: a
/// checkpoint some rank refuses leaves the old weights serving ([`EngineError::InvalidRequest`]
/// naming `model_path`); a swap that fails on a device leaves the engine unhealthy. Updates apply
/// one at a time, in arrival order.
#[derive(Message)]
#[rtype(result = "Result<WeightsUpdated, EngineError>")]
pub struct UpdateWeights(pub WeightUpdate);

/// Handle -> scheduler: name the weights served `version` (SGLang's `/update_weight_version`,
/// after a trainer changed them by other means). Tokens sampled from now on carry the new name,
/// so an open request's later tokens report it; with `abort_all_requests` the requests in flight
/// end first. Reply: the weights.
#[derive(Message)]
#[rtype(result = "Result<WeightsInfo, EngineError>")]
pub struct SetWeightVersion {
    /// The new name.
    pub version: String,
    /// End the requests in flight at once.
    pub abort_all_requests: bool,
}

/// Handle -> scheduler: the weights served.
#[derive(Message)]
#[rtype(result = "WeightsInfo")]
pub struct GetWeights;

/// An update waiting for the requests before it to end, or swapping.
struct PendingUpdate {
    update: WeightUpdate,
    reply: oneshot::Sender<Result<WeightsUpdated, EngineError>>,
    arrived: Instant,
    num_aborted: usize,
}

/// The scheduler's side of weight updates.
pub(super) struct Updates {
    queue: VecDeque<PendingUpdate>,
    /// Whether the front update is swapping the ranks' weights.
    swapping: bool,
    /// Requests that arrived while an update was queued, in arrival order.
    held: Vec<(RequestId, Vec<NewSeq>)>,
    /// The weights served.
    pub weights: WeightsInfo,
    /// `weights.version`, shared by every token event sampled on it.
    version: Arc<str>,
}

impl Updates {
    /// No update yet; `weights` are the ones loaded at start.
    pub fn new(weights: WeightsInfo) -> Self {
        let version = Arc::from(weights.version.as_str());
        Self { queue: VecDeque::new(), swapping: false, held: Vec::new(), weights, version }
    }

    /// The version of the weights served.
    pub fn version(&self) -> &Arc<str> {
        &self.version
    }

    /// Names the weights served `version`.
    fn rename(&mut self, version: String) {
        self.version = Arc::from(version.as_str());
        self.weights.version = version;
    }

    /// Whether an update is queued: new requests are held.
    pub fn is_pending(&self) -> bool {
        !self.queue.is_empty()
    }

    /// Whether the ranks' weights are being swapped: no step may be planned.
    pub fn is_swapping(&self) -> bool {
        self.swapping
    }

    /// Sequences held.
    pub fn num_held_seqs(&self) -> usize {
        self.held.iter().map(|(_, seqs)| seqs.len()).sum()
    }

    /// Holds a request's sequences until the updates are done.
    pub fn hold(&mut self, request: RequestId, seqs: Vec<NewSeq>) {
        self.held.push((request, seqs));
    }

    /// Requests held.
    pub fn held_len(&self) -> usize {
        self.held.len()
    }

    /// Updates queued or loading.
    pub fn queue_len(&self) -> usize {
        self.queue.len()
    }

    /// Whether `request` is held.
    pub fn is_held(&self, request: RequestId) -> bool {
        self.held.iter().any(|(r, _)| *r == request)
    }

    /// Takes a held request's sequences out, all or continuation `only` (aborted before it
    /// ran).
    fn take_held(&mut self, request: RequestId, only: Option<usize>) -> Option<Vec<NewSeq>> {
        let at = self.held.iter().position(|(r, _)| *r == request)?;
        let Some(index) = only else { return Some(self.held.remove(at).1) };
        let seqs = &mut self.held[at].1;
        let taken = seqs.extract_if(.., |s| s.id.index_in_request() == index).collect();
        if seqs.is_empty() {
            self.held.remove(at);
        }
        Some(taken)
    }
}

impl SchedulerActor {
    /// Whether the front update can swap: every request still open is held (arrived after it),
    /// or paused.
    pub(super) fn update_is_due(&self) -> bool {
        self.updates.is_pending()
            && !self.updates.swapping
            && !self.step_in_flight
            && (self.groups.len() == self.updates.held.len() || self.pause_holds())
    }

    /// Swaps the ranks' weights for the front update's, then drops the prefix cache.
    pub(super) fn swap_weights(&mut self, ctx: &mut Context<Self>) {
        let Some(front) = self.updates.queue.front() else { return };
        let dir = front.update.dir.clone();
        self.updates.swapping = true;
        self.retract_for_swap();
        tracing::info!(dir = %dir.display(), "loading new weights");
        let executor = self.peers.executor.clone();
        let (cache, routing) = (self.peers.cache.clone(), self.peers.routing.clone());
        let swap = async move {
            match executor.send(SwapWeights(dir)).await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => return Err(e),
                Err(e) => return Err(gone("executor", e)),
            }
            // The old weights computed every cached block, snapshot and routing row.
            let dropped = cache.send(ResetPrefixCache).await.map_err(|e| gone("cache manager", e));
            routing.do_send(FreeBlocks(dropped?));
            Ok(())
        };
        ctx.spawn(swap.into_actor(self).map(|res, act, ctx| act.on_swapped(res, ctx)));
    }

    fn on_swapped(&mut self, res: Result<(), SwapError>, ctx: &mut Context<Self>) {
        self.updates.swapping = false;
        let Some(p) = self.updates.queue.pop_front() else { return };
        let result = match res {
            Ok(()) => {
                if let Some(version) = p.update.weight_version {
                    self.updates.rename(version);
                }
                let w = &mut self.updates.weights;
                w.dir = p.update.dir;
                w.num_updates += 1;
                self.stats.num_weight_updates = w.num_updates;
                let w = &self.updates.weights;
                metrics::counter!(names::WEIGHT_UPDATES).absolute(w.num_updates);
                let seconds = p.arrived.elapsed().as_secs_f64();
                tracing::info!(version = %w.version, seconds, "new weights serving");
                Ok(WeightsUpdated {
                    weights: w.clone(),
                    num_held_requests: self.updates.held.len(),
                    num_aborted_requests: p.num_aborted,
                    seconds,
                })
            }
            Err(SwapError::Refused { rank, source }) => {
                tracing::warn!(rank, "weight update refused: {source}");
                let message = match self.peers.ranks.len() {
                    1 => source.to_string(),
                    _ => format!("rank {rank}: {source}"),
                };
                Err(EngineError::InvalidRequest { param: "model_path", message })
            }
            Err(SwapError::Failed(e)) => {
                let reason = format!("weight update failed: {e}");
                self.fail_engine(reason.clone());
                Err(EngineError::Unhealthy(reason))
            }
        };
        self.peers.outbox.answer(p.reply, result);
        if !self.holds_new_requests() {
            self.release_held();
        }
        self.schedule(ctx);
    }

    /// Admits the requests held while updates were queued or generation paused, on the weights
    /// now served.
    pub(super) fn release_held(&mut self) {
        for (request, seqs) in std::mem::take(&mut self.updates.held) {
            let Err(e) = self.policy.add(seqs) else { continue };
            if let Some(g) = self.groups.remove(&request) {
                self.peers.outbox.send(&g.events, RequestEvent::Error(e.into()));
            }
        }
    }

    /// Ends a held request's sequences (all, or continuation `only`), which computed nothing,
    /// with `finish_reason: abort`. Returns whether `request` was held.
    pub(super) fn abort_held(&mut self, request: RequestId, only: Option<usize>) -> bool {
        let Some(seqs) = self.updates.take_held(request, only) else { return false };
        for s in seqs {
            let output = FinalOutput {
                index: s.id.index_in_request(),
                token_ids: Vec::new(),
                text: String::new(),
                finish_reason: FinishReason::Abort,
                num_prompt_tokens: s.prompt.len(),
                num_cached_tokens: 0,
                routing: None,
                prompt_logprobs: None,
                weight_version: String::new(),
                weight_versions: Vec::new(),
            };
            let text = FinalText::new(&self.tokenizer, &s.params, &FinishReason::Abort, None);
            self.deliver(s.id, output, text);
        }
        true
    }

    /// The engine cannot serve: every queued update fails, held requests with their groups.
    pub(super) fn fail_updates(&mut self, reason: &str) {
        self.updates.held.clear();
        self.updates.swapping = false;
        for p in self.updates.queue.drain(..) {
            let error = EngineError::Unhealthy(reason.to_owned());
            self.peers.outbox.answer(p.reply, Err(error));
        }
    }

    /// Shutting down: queued updates that have not started are refused, and the requests held
    /// for them admitted, so they drain like every request in flight. Returns whether any was.
    pub(super) fn cancel_updates(&mut self) -> bool {
        let keep = usize::from(self.updates.swapping);
        for p in self.updates.queue.drain(keep..) {
            self.peers.outbox.answer(p.reply, Err(EngineError::ShutDown));
        }
        let release = !self.holds_new_requests() && !self.updates.held.is_empty();
        if release {
            self.release_held();
        }
        release
    }
}

fn gone(peer: &str, e: actix::MailboxError) -> SwapError {
    SwapError::Failed(format!("the {peer} is gone: {e}"))
}

impl Handler<UpdateWeights> for SchedulerActor {
    type Result = ResponseFuture<Result<WeightsUpdated, EngineError>>;

    fn handle(&mut self, msg: UpdateWeights, ctx: &mut Context<Self>) -> Self::Result {
        if let Err(e) = self.health().and_then(|()| self.check_weights_resident()) {
            return Box::pin(async move { Err(e) });
        }
        let mut num_aborted = 0;
        if msg.0.abort_all_requests {
            let open = self.open_requests();
            num_aborted = open.len();
            for request in open {
                self.abort(request, None, ctx);
            }
        }
        let (reply, rx) = oneshot::channel();
        let update = msg.0;
        self.updates.queue.push_back(PendingUpdate {
            update,
            reply,
            arrived: Instant::now(),
            num_aborted,
        });
        self.schedule(ctx);
        Box::pin(async move { rx.await.unwrap_or(Err(EngineError::ShutDown)) })
    }
}

impl Handler<SetWeightVersion> for SchedulerActor {
    type Result = Result<WeightsInfo, EngineError>;

    fn handle(&mut self, msg: SetWeightVersion, ctx: &mut Context<Self>) -> Self::Result {
        self.health()?;
        if msg.abort_all_requests {
            for request in self.open_requests() {
                self.abort(request, None, ctx);
            }
        }
        tracing::info!(version = %msg.version, "weights renamed");
        self.updates.rename(msg.version);
        Ok(self.updates.weights.clone())
    }
}

impl Handler<GetWeights> for SchedulerActor {
    type Result = actix::MessageResult<GetWeights>;

    fn handle(&mut self, _: GetWeights, _: &mut Context<Self>) -> Self::Result {
        actix::MessageResult(self.updates.weights.clone())
    }
}
