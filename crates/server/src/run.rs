//! Submitting a job to the engine, tracking it while it runs, and gathering its events.
//!
//! Every submitted engine request is registered in the [`Registry`] until its stream ends. The
//! registration lives inside the stream the response is built from, so when a client goes away
//! (actix drops the handler future, or the SSE body) the stream is dropped with it, the request
//! is aborted and leaves the registry. Requests still being prepared (parsed, tokenized) are
//! counted too, so a shutdown knows when nothing is in flight; and [`Registry::end_all`] ends
//! every registered stream with a `shutting_down` error when a shutdown's grace period is over.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::Instant;

use dashmap::DashMap;
use futures_util::stream::{self, SelectAll, Stream, StreamExt};
use routed_runtime::{
    EngineError, EngineHandle, FinalOutput, RequestEvent, RequestStream, TokenEvent,
};
use routed_types::RequestId;
use tokio::sync::watch;

use crate::error::ApiError;
use crate::validate::Job;

/// One in-flight engine request.
#[derive(Clone, Debug)]
pub struct InFlight {
    /// The route that submitted it.
    pub route: &'static str,
    /// The id of its response (`cmpl-...`, or `/generate`'s `rid`): what `/abort_request`
    /// names it by.
    pub response_id: Arc<str>,
    /// Its continuations (`n`): on `/generate`, continuation `i` of several answers as
    /// `{response_id}-{i}`, which `/abort_request` names it by alone.
    pub num_continuations: usize,
    /// When it was submitted.
    pub submitted: Instant,
}

/// The engine requests this gateway has submitted and not yet seen end, and the requests it is
/// still preparing.
#[derive(Debug)]
pub struct Registry {
    requests: DashMap<RequestId, InFlight>,
    num_aborted: AtomicU64,
    num_preparing: AtomicUsize,
    /// Set once by [`Registry::end_all`]; every tracked stream watches it.
    end: watch::Sender<bool>,
}

impl Default for Registry {
    fn default() -> Self {
        Self {
            requests: DashMap::new(),
            num_aborted: AtomicU64::new(0),
            num_preparing: AtomicUsize::new(0),
            end: watch::channel(false).0,
        }
    }
}

/// Counts one request as preparing while it lives.
pub(crate) struct Preparing<'a>(&'a Registry);

impl Drop for Preparing<'_> {
    fn drop(&mut self) {
        self.0.num_preparing.fetch_sub(1, Ordering::Relaxed);
    }
}

impl Registry {
    /// Requests in flight.
    pub fn len(&self) -> usize {
        self.requests.len()
    }

    /// Whether nothing is in flight.
    pub fn is_empty(&self) -> bool {
        self.requests.is_empty()
    }

    /// Requests aborted because their client went away before they ended.
    pub fn num_aborted(&self) -> u64 {
        self.num_aborted.load(Ordering::Relaxed)
    }

    /// The ids in flight.
    pub fn ids(&self) -> Vec<RequestId> {
        self.requests.iter().map(|e| *e.key()).collect()
    }

    /// Aborts every request in flight (used when the server stops). Returns how many.
    pub fn abort_all(&self, handle: &EngineHandle) -> usize {
        let ids = self.ids();
        for &id in &ids {
            handle.abort(id);
        }
        ids.len()
    }

    /// Whether a request whose response has id `response_id` is in flight.
    pub fn contains_response(&self, response_id: &str) -> bool {
        self.requests.iter().any(|e| &*e.response_id == response_id)
    }

    /// Aborts the requests in flight whose response has id `response_id` (the prompts of an
    /// OpenAI batch share one; those of a `/generate` batch each have their own), or else the
    /// one `/generate` continuation whose id it is (`{response_id}-{i}` of a prompt with
    /// `n > 1`; its siblings go on). Returns how many requests or continuations it aborted.
    pub fn abort_response(&self, handle: &EngineHandle, response_id: &str) -> usize {
        let ids: Vec<RequestId> = self
            .requests
            .iter()
            .filter(|e| &*e.response_id == response_id)
            .map(|e| *e.key())
            .collect();
        for &id in &ids {
            handle.abort(id);
        }
        if !ids.is_empty() {
            return ids.len();
        }
        let Some((id, index)) = self.continuation(response_id) else { return 0 };
        handle.abort_continuation(id, index);
        1
    }

    /// The engine request and index of the `/generate` continuation whose `meta_info.id` is
    /// `choice_id`, if one is in flight.
    fn continuation(&self, choice_id: &str) -> Option<(RequestId, usize)> {
        let (base, index) = crate::generate::split_choice_id(choice_id)?;
        self.requests
            .iter()
            .find(|e| {
                e.route == "/generate" && &*e.response_id == base && index < e.num_continuations
            })
            .map(|e| (*e.key(), index))
    }

    /// Requests being parsed, templated or tokenized, not submitted yet.
    pub fn num_preparing(&self) -> usize {
        self.num_preparing.load(Ordering::Relaxed)
    }

    /// Whether nothing is in flight: nothing submitted and nothing being prepared.
    pub fn is_idle(&self) -> bool {
        self.is_empty() && self.num_preparing() == 0
    }

    /// Ends every request in flight, and every one submitted from now on, with a 503
    /// `shutting_down` error (one error event then `[DONE]` on a stream); their engine requests
    /// are aborted. Used when a shutdown's grace period is over.
    pub fn end_all(&self) {
        self.end.send_replace(true);
    }

    /// Counts a request as preparing until the guard is dropped.
    pub(crate) fn preparing(&self) -> Preparing<'_> {
        self.num_preparing.fetch_add(1, Ordering::Relaxed);
        Preparing(self)
    }

    /// Resolves once [`Registry::end_all`] has been called.
    fn ended(&self) -> Pin<Box<dyn Future<Output = ()> + Send>> {
        let mut rx = self.end.subscribe();
        Box::pin(async move {
            if rx.wait_for(|&end| end).await.is_err() {
                // The registry is gone, so nobody can end this stream any more.
                std::future::pending::<()>().await;
            }
        })
    }
}

/// An engine stream registered in the [`Registry`], yielding its events tagged with the index of
/// its prompt. Dropping it before the engine finished aborts the request.
pub(crate) struct Tracked {
    inner: RequestStream,
    prompt: usize,
    id: RequestId,
    registry: Arc<Registry>,
    handle: EngineHandle,
    remaining: usize,
    /// The engine ended the request (every continuation, or an error).
    ended: bool,
    /// [`Registry::end_all`] was called.
    end: Pin<Box<dyn Future<Output = ()> + Send>>,
    /// The stream was ended by [`Registry::end_all`]: its error was yielded, nothing follows.
    cut: bool,
}

impl Stream for Tracked {
    type Item = (usize, RequestEvent);

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        if self.cut {
            return Poll::Ready(None);
        }
        if !self.ended && self.end.as_mut().poll(cx).is_ready() {
            self.cut = true;
            return Poll::Ready(Some((self.prompt, RequestEvent::Error(EngineError::ShutDown))));
        }
        let polled = Pin::new(&mut self.inner).poll_next(cx);
        match &polled {
            Poll::Ready(Some(RequestEvent::Finished(_))) => {
                self.remaining = self.remaining.saturating_sub(1);
                self.ended |= self.remaining == 0;
            }
            Poll::Ready(Some(RequestEvent::Error(_)) | None) => self.ended = true,
            _ => {}
        }
        let prompt = self.prompt;
        polled.map(|event| event.map(|event| (prompt, event)))
    }
}

impl Drop for Tracked {
    fn drop(&mut self) {
        self.registry.requests.remove(&self.id);
        // Ended by a shutdown (this stream, or a sibling of the same batch whose error ended the
        // answer): aborted, but its client did not go away.
        if self.cut || !self.ended && *self.registry.end.borrow() {
            self.handle.abort(self.id);
        } else if !self.ended {
            tracing::debug!(id = %self.id, "client gone: aborting request");
            self.registry.num_aborted.fetch_add(1, Ordering::Relaxed);
            self.handle.abort(self.id);
        }
    }
}

/// Events of every prompt of a job, tagged with the prompt's index.
pub(crate) type Merged = SelectAll<Tracked>;

/// Submits one engine request per prompt, registered under the response's id. If one is
/// refused, those already submitted are aborted (their streams are dropped) and the refusal is
/// returned.
pub(crate) async fn submit(
    handle: &EngineHandle,
    registry: &Arc<Registry>,
    job: &Job,
    route: &'static str,
    response_id: &str,
) -> Result<Merged, ApiError> {
    let response_id: Arc<str> = response_id.into();
    let ids = vec![response_id; job.requests.len()];
    submit_each(handle, registry, job, route, ids).await
}

/// [`submit`] with an id of its own for each prompt's request (`/generate`'s batch, whose
/// prompts a client aborts one by one): `response_ids[i]` is prompt `i`'s.
pub(crate) async fn submit_each(
    handle: &EngineHandle,
    registry: &Arc<Registry>,
    job: &Job,
    route: &'static str,
    response_ids: Vec<Arc<str>>,
) -> Result<Merged, ApiError> {
    debug_assert_eq!(response_ids.len(), job.requests.len());
    let mut tracked = Vec::with_capacity(job.requests.len());
    for ((prompt, request), response_id) in job.requests.iter().enumerate().zip(response_ids) {
        let stream = handle.submit(request.clone()).await?;
        let id = stream.id();
        let num_continuations = request.n;
        let entry = InFlight { route, response_id, num_continuations, submitted: Instant::now() };
        registry.requests.insert(id, entry);
        tracked.push(Tracked {
            inner: stream,
            prompt,
            id,
            registry: Arc::clone(registry),
            handle: handle.clone(),
            remaining: request.n,
            ended: false,
            end: registry.ended(),
            cut: false,
        });
    }
    Ok(stream::select_all(tracked))
}

/// What one choice produced: its token events and its final output.
#[derive(Debug, Default)]
pub(crate) struct ChoiceResult {
    /// Token events in order (for logprobs).
    pub tokens: Vec<TokenEvent>,
    /// The end of the choice.
    pub output: Option<Box<FinalOutput>>,
}

impl ChoiceResult {
    /// The final output; a choice the engine never finished is a bug.
    pub(crate) fn output(&self, index: usize) -> Result<&FinalOutput, ApiError> {
        self.output.as_deref().ok_or_else(|| {
            ApiError::Internal(format!("the engine ended choice {index} without a final output"))
        })
    }
}

/// The global choice index of continuation `index` of prompt `prompt` (prompt-major).
pub(crate) fn choice_index(prompt: usize, index: usize, n: usize) -> usize {
    prompt * n + index
}

/// Runs a job to the end and returns its choices in order.
pub(crate) async fn collect(mut merged: Merged, job: &Job) -> Result<Vec<ChoiceResult>, ApiError> {
    let mut choices: Vec<ChoiceResult> =
        (0..job.requests.len() * job.n).map(|_| ChoiceResult::default()).collect();
    while let Some((prompt, event)) = merged.next().await {
        match event {
            RequestEvent::Token(t) => {
                let i = choice_index(prompt, t.index, job.n);
                if let Some(c) = choices.get_mut(i) {
                    c.tokens.push(t);
                }
            }
            RequestEvent::Finished(out) => {
                let i = choice_index(prompt, out.index, job.n);
                if let Some(c) = choices.get_mut(i) {
                    c.output = Some(out);
                }
            }
            RequestEvent::Error(e) => return Err(e.into()),
        }
    }
    for (i, c) in choices.iter().enumerate() {
        c.output(i)?;
    }
    Ok(choices)
}
