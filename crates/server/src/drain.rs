//! Shutdown that drains.
//!
//! On the first shutdown signal the gateway stops admitting: every new request is answered 503
//! `overloaded_error` / `shutting_down` (and `/health` 503), while the listener keeps accepting,
//! so clients learn why instead of being refused a connection. Requests already in flight (being
//! prepared or running in the engine, paused ones resumed) get the grace period to finish; a second signal cuts it
//! short, and so does memory given back to a trainer (what waits for it cannot run). Whatever is still in flight then is ended by the gateway's registry: a non-streamed
//! request gets a 503 `shutting_down` body, a stream one `data: {"error": ...}` event and
//! `data: [DONE]`, and its engine request is aborted. Only then does the HTTP server stop and the
//! engine shut down.

use std::time::Duration;

use actix_web::body::MessageBody;
use actix_web::dev::{ServiceRequest, ServiceResponse};
use actix_web::middleware::Next;
use actix_web::{HttpResponse, ResponseError, web};
use futures_util::stream::{Stream, StreamExt};
use serde_json::json;
use tokio::time::Instant;

use crate::AppState;
use crate::error::ApiError;
use crate::run::Registry;

/// Default of [`crate::ServerConfig::shutdown_grace`].
pub(crate) const DEFAULT_SHUTDOWN_GRACE: Duration = Duration::from_secs(30);

/// How long the requests ended after the grace period get to write their error answers.
const FLUSH: Duration = Duration::from_secs(5);

/// How often the drain looks at the registry.
const POLL: Duration = Duration::from_millis(20);

/// Middleware: while draining, answers every new request 503 (`/metrics` still answers, so the
/// drain can be watched) and closes its connection.
pub(crate) async fn refuse_when_draining(
    req: ServiceRequest,
    next: Next<impl MessageBody + 'static>,
) -> Result<ServiceResponse<impl MessageBody>, actix_web::Error> {
    let draining = req.app_data::<web::Data<AppState>>().is_some_and(|s| s.is_draining());
    if !draining || req.path() == "/metrics" {
        return next.call(req).await.map(ServiceResponse::map_into_left_body);
    }
    let mut response = if req.path() == "/health" {
        HttpResponse::ServiceUnavailable()
            .json(json!({"status": "unhealthy", "reason": "the server is shutting down"}))
    } else {
        ApiError::Overloaded {
            message: "the server is shutting down and admits no new requests".into(),
            code: "shutting_down",
        }
        .error_response()
    };
    response.head_mut().set_connection_type(actix_web::http::ConnectionType::Close);
    Ok(req.into_response(response).map_into_right_body())
}

/// Drains `state`'s gateway: stops admitting, waits up to `grace` (or the next item of
/// `signals`) for the requests in flight, then ends the rest and waits for their answers to go
/// out.
pub(crate) async fn drain(
    state: &AppState,
    grace: Duration,
    signals: &mut (impl Stream<Item = ()> + Unpin),
) {
    state.start_draining();
    // A paused engine would let the grace period run out: what is in flight resumes.
    if let Err(e) = state.handle().continue_generation().await {
        tracing::debug!(error = %e, "cannot continue generation for the drain");
    }
    let registry = state.registry();
    tracing::info!(
        in_flight = registry.len(),
        preparing = registry.num_preparing(),
        grace_s = grace.as_secs_f64(),
        "shutting down: refusing new requests, letting the ones in flight finish"
    );
    // Memory given back to a trainer stays with it: what waits for that memory cannot run, so it
    // ends now rather than when the grace period is over.
    let released = state.handle().memory_released().await.is_ok_and(|m| m.stops_steps());
    if !released && wait_idle(registry, Instant::now() + grace, signals).await {
        tracing::info!("every request in flight finished");
        return;
    }
    tracing::warn!(
        in_flight = registry.len(),
        preparing = registry.num_preparing(),
        memory_released = released,
        "ending the requests still in flight"
    );
    registry.end_all();
    if !wait_idle(registry, Instant::now() + FLUSH, &mut futures_util::stream::pending()).await {
        tracing::warn!(
            in_flight = registry.len(),
            preparing = registry.num_preparing(),
            "requests still in flight after they were ended; stopping anyway"
        );
    }
}

/// Waits until nothing is in flight (`true`), or until `deadline` or the next signal (`false`).
async fn wait_idle(
    registry: &Registry,
    deadline: Instant,
    signals: &mut (impl Stream<Item = ()> + Unpin),
) -> bool {
    while !registry.is_idle() {
        if Instant::now() >= deadline {
            return false;
        }
        tokio::select! {
            () = tokio::time::sleep(POLL) => {}
            Some(()) = signals.next() => {
                tracing::warn!("second shutdown signal: ending the requests in flight now");
                return false;
            }
        }
    }
    true
}
