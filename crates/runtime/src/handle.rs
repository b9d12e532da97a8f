//! [`EngineHandle`], what embedders talk to a running engine through, and [`RequestStream`], the
//! events of one request.

use crate::{
    Admission, EngineError, EngineStats, GenerateRequest, MemoryChange, MemoryTags, ModelInfo,
    PauseMode, Paused, RequestEvent, WeightUpdate, WeightsInfo, WeightsUpdated,
    routing_cache::{ExpertLoads, ResetExpertLoad},
    scheduler::{
        Abort, ContinueGeneration, ExpertLoadStats, FlushCache, GetAdmission, GetMemory, GetStats,
        GetWeights, Health, PauseGeneration, ReleaseMemory, ResetCache, ResumeMemory,
        SchedulerActor, SetWeightVersion, Shutdown, Submit, UpdateWeights,
    },
};
use actix::Addr;
use futures_util::Stream;
use routed_model::Tokenizer;
use routed_types::RequestId;
use std::{
    pin::Pin,
    sync::Arc,
    task::{Context as TaskContext, Poll},
};
use tokio::sync::mpsc;

/// A cheap, cloneable handle to a running engine, usable from any thread and any tokio runtime.
#[derive(Clone)]
pub struct EngineHandle {
    scheduler: Addr<SchedulerActor>,
    info: Arc<ModelInfo>,
    tokenizer: Arc<Tokenizer>,
}

impl EngineHandle {
    pub(crate) fn new(
        scheduler: Addr<SchedulerActor>,
        info: Arc<ModelInfo>,
        tokenizer: Arc<Tokenizer>,
    ) -> Self {
        Self { scheduler, info, tokenizer }
    }

    /// The served model.
    pub fn model_info(&self) -> &ModelInfo {
        &self.info
    }

    /// The model's tokenizer and chat template.
    pub fn tokenizer(&self) -> &Arc<Tokenizer> {
        &self.tokenizer
    }

    /// Submits a request. Its events arrive on the returned stream; dropping the stream before
    /// the request ends aborts it.
    pub async fn submit(&self, request: GenerateRequest) -> Result<RequestStream, EngineError> {
        let (tx, rx) = mpsc::unbounded_channel();
        let n = request.n;
        let id = self
            .scheduler
            .send(Submit { request, events: tx })
            .await
            .map_err(|_| EngineError::ShutDown)??;
        Ok(RequestStream { id, rx, num_open: n, scheduler: self.scheduler.clone() })
    }

    /// Aborts a request (every continuation); unknown ids are ignored.
    pub fn abort(&self, id: RequestId) {
        self.scheduler.do_send(Abort { request: id, index: None });
    }

    /// Aborts continuation `index` of a request (one of its `n`); the others go on. Unknown ids
    /// and indices are ignored.
    pub fn abort_continuation(&self, id: RequestId, index: usize) {
        self.scheduler.do_send(Abort { request: id, index: Some(index) });
    }

    /// The engine's figures.
    pub async fn stats(&self) -> Result<EngineStats, EngineError> {
        self.scheduler.send(GetStats).await.map_err(|_| EngineError::ShutDown)
    }

    /// Drops every cached block no running request holds, with its snapshots and routing rows.
    pub async fn reset_prefix_cache(&self) -> Result<bool, EngineError> {
        self.scheduler.send(ResetCache).await.map_err(|_| EngineError::ShutDown)
    }

    /// Replaces the served weights with the checkpoint in `update.dir` (see [`WeightUpdate`]):
    /// returns once the new weights serve. A checkpoint of another model, or one that cannot be
    /// read, is refused with [`EngineError::InvalidRequest`] naming `model_path`, and the old
    /// weights keep serving.
    pub async fn update_weights(
        &self,
        update: WeightUpdate,
    ) -> Result<WeightsUpdated, EngineError> {
        self.scheduler.send(UpdateWeights(update)).await.map_err(|_| EngineError::ShutDown)?
    }

    /// The weights served: where they were loaded from, their version, updates so far.
    pub async fn weights(&self) -> Result<WeightsInfo, EngineError> {
        self.scheduler.send(GetWeights).await.map_err(|_| EngineError::ShutDown)
    }

    /// Names the weights served `version` without changing them; open requests report the new
    /// name. With `abort_all_requests` the requests in flight end first.
    pub async fn set_weight_version(
        &self,
        version: String,
        abort_all_requests: bool,
    ) -> Result<WeightsInfo, EngineError> {
        let msg = SetWeightVersion { version, abort_all_requests };
        self.scheduler.send(msg).await.map_err(|_| EngineError::ShutDown)?
    }

    /// Pauses generation (see [`PauseMode`]); returns once the pause holds. Requests submitted
    /// while paused wait for [`EngineHandle::continue_generation`]. A weight update while paused
    /// applies without waiting for the paused requests, which then resume on the new weights.
    pub async fn pause_generation(&self, mode: PauseMode) -> Result<Paused, EngineError> {
        self.scheduler.send(PauseGeneration(mode)).await.map_err(|_| EngineError::ShutDown)?
    }

    /// Ends a pause: paused requests resume, held ones are admitted (unless a weight update
    /// still holds them). Returns how many held requests were admitted.
    pub async fn continue_generation(&self) -> Result<usize, EngineError> {
        self.scheduler.send(ContinueGeneration).await.map_err(|_| EngineError::ShutDown)?
    }

    /// Whether requests run as they come, or are held by a pause or a weight update.
    pub async fn admission(&self) -> Result<Admission, EngineError> {
        self.scheduler.send(GetAdmission).await.map_err(|_| EngineError::ShutDown)
    }

    /// Drops the prefix cache, as [`EngineHandle::reset_prefix_cache`], but only when no request
    /// is open (running, waiting, paused or held); returns whether it did.
    pub async fn flush_cache(&self) -> Result<bool, EngineError> {
        self.scheduler.send(FlushCache).await.map_err(|_| EngineError::ShutDown)?
    }

    /// Gives back the memory of `tags` on every rank, so that a trainer on the same device can
    /// use it (SGLang's `release_memory_occupation`). Refused while a request holds KV blocks
    /// (pause with [`PauseMode::Retract`] or [`PauseMode::Abort`] first, or abort it: an abort
    /// sent before the release is waited for) or a weight update is queued. The prefix cache is dropped; until the memory is resumed nothing runs and new
    /// requests wait.
    pub async fn release_memory(&self, tags: MemoryTags) -> Result<MemoryChange, EngineError> {
        self.scheduler.send(ReleaseMemory(tags)).await.map_err(|_| EngineError::ShutDown)?
    }

    /// Takes the memory of `tags` again: empty KV blocks and states, the weights loaded from
    /// the checkpoint served ([`WeightsInfo::dir`]). Steps run again once neither the weights
    /// nor the KV cache are released.
    pub async fn resume_memory(&self, tags: MemoryTags) -> Result<MemoryChange, EngineError> {
        self.scheduler.send(ResumeMemory(tags)).await.map_err(|_| EngineError::ShutDown)?
    }

    /// The memory released now.
    pub async fn memory_released(&self) -> Result<MemoryTags, EngineError> {
        self.scheduler.send(GetMemory).await.map_err(|_| EngineError::ShutDown)
    }

    /// Tokens each expert of each MoE layer received, prefill and decode apart, since the engine
    /// started and since the last [`EngineHandle::reset_expert_load`]; `None` for a model without
    /// MoE layers.
    pub async fn expert_load(&self) -> Result<Option<ExpertLoads>, EngineError> {
        self.scheduler.send(ExpertLoadStats).await.map_err(|_| EngineError::ShutDown)
    }

    /// Starts the since-reset expert load counts from zero.
    pub fn reset_expert_load(&self) {
        self.scheduler.do_send(ResetExpertLoad);
    }

    /// Whether the engine can serve.
    pub async fn health(&self) -> Result<(), EngineError> {
        self.scheduler.send(Health).await.map_err(|_| EngineError::ShutDown)?
    }

    /// Stops accepting requests and waits for the in-flight ones to finish.
    pub async fn shutdown(&self) {
        let _ = self.scheduler.send(Shutdown).await;
    }
}

/// The events of one submitted request. Dropping it before the request ends aborts the request.
pub struct RequestStream {
    id: RequestId,
    rx: mpsc::UnboundedReceiver<RequestEvent>,
    num_open: usize,
    scheduler: Addr<SchedulerActor>,
}

impl RequestStream {
    /// The request's id (for [`EngineHandle::abort`]).
    pub fn id(&self) -> RequestId {
        self.id
    }
}

impl Stream for RequestStream {
    type Item = RequestEvent;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut TaskContext<'_>) -> Poll<Option<RequestEvent>> {
        if self.num_open == 0 {
            return Poll::Ready(None);
        }
        let polled = self.rx.poll_recv(cx);
        match &polled {
            Poll::Ready(Some(RequestEvent::Finished(_))) => self.num_open -= 1,
            Poll::Ready(Some(RequestEvent::Error(_))) | Poll::Ready(None) => self.num_open = 0,
            _ => {}
        }
        polled
    }
}

impl Drop for RequestStream {
    fn drop(&mut self) {
        if self.num_open > 0 {
            self.scheduler.do_send(Abort { request: self.id, index: None });
        }
    }
}
