//! The handlers of the OpenAI routes and the operational ones.

use std::sync::Arc;

use actix_web::{HttpResponse, web};
use routed_runtime::EngineError;
use serde_json::json;

use crate::AppState;
use crate::body::{JsonBody, prepare};
use crate::error::ApiError;
use crate::metrics::render_metrics;
use crate::response::{self, Header, Route};
use crate::run;
use crate::stream::SseState;
use crate::validate::{self, Job};

/// Runs a validated job: a whole JSON response, or an SSE stream.
async fn answer(state: &AppState, route: Route, job: Job) -> Result<HttpResponse, ApiError> {
    let path = match route {
        Route::Completions => "/v1/completions",
        Route::Chat => "/v1/chat/completions",
    };
    let id = match &job.client_id {
        Some(client) if state.registry().contains_response(&client.id) => {
            let message = format!("a request with id {:?} is in flight", client.id);
            return Err(ApiError::invalid(client.param, message));
        }
        Some(client) => client.id.clone(),
        None => state.new_id(route.id_prefix()),
    };
    let header =
        Header { id, created: crate::unix_now(), model: state.info().served_model_name.clone() };
    let merged = run::submit(state.handle(), state.registry(), &job, path, &header.id).await?;
    let meta = state.info().routing.clone();
    if job.stream.is_some() {
        let tokenizer = Arc::clone(state.tokenizer());
        let body = SseState::new(route, header, job, tokenizer, meta, merged).into_body();
        return Ok(HttpResponse::Ok()
            .content_type("text/event-stream")
            .insert_header(("Cache-Control", "no-cache"))
            .streaming(body));
    }
    let choices = run::collect(merged, &job).await?;
    let body = response::whole(route, &header, &job, &choices, state.tokenizer(), meta.as_ref())?;
    Ok(HttpResponse::Ok().json(body))
}

/// `POST /v1/completions`.
pub(crate) async fn completions(
    state: web::Data<AppState>,
    body: JsonBody,
) -> Result<HttpResponse, ApiError> {
    let job = prepare(&state, body, validate::completions).await?;
    answer(&state, Route::Completions, job).await
}

/// `POST /v1/chat/completions`.
pub(crate) async fn chat_completions(
    state: web::Data<AppState>,
    body: JsonBody,
) -> Result<HttpResponse, ApiError> {
    let job = prepare(&state, body, validate::chat).await?;
    answer(&state, Route::Chat, job).await
}

/// `GET /v1/models`.
pub(crate) async fn models(state: web::Data<AppState>) -> HttpResponse {
    let info = state.info();
    let routing = info.routing.as_ref().map(|m| {
        json!({
            "num_layers": m.num_layers,
            "num_moe_layers": m.num_moe_layers(),
            "moe_layer_ids": m.moe_layer_ids,
            "num_experts": m.num_experts,
            "top_k": m.top_k,
        })
    });
    HttpResponse::Ok().json(json!({
        "object": "list",
        "data": [{
            "id": info.served_model_name,
            "object": "model",
            "created": state.started_at(),
            "owned_by": "routed",
            "root": info.served_model_name,
            "parent": null,
            "max_model_len": info.max_model_len,
            "device": info.device,
            "routing": routing,
        }],
    }))
}

/// `GET /health`: 200 (naming the device) when the engine can serve, 503 with the reason
/// otherwise.
pub(crate) async fn health(state: web::Data<AppState>) -> HttpResponse {
    match state.handle().health().await {
        Ok(()) => HttpResponse::Ok().json(json!({"status": "ok", "device": state.info().device})),
        Err(EngineError::Unhealthy(reason)) => HttpResponse::ServiceUnavailable()
            .json(json!({"status": "unhealthy", "reason": reason})),
        Err(other) => HttpResponse::ServiceUnavailable()
            .json(json!({"status": "unhealthy", "reason": other.to_string()})),
    }
}

/// `GET /metrics`: Prometheus text. The engine's figures are read first (which publishes every
/// gauge, `routed_routing_bytes_held` included), so each scrape is true as of itself: on a fresh
/// server before any step, and right after `/reset_prefix_cache`. A stopped engine leaves the
/// last published figures.
pub(crate) async fn metrics(state: web::Data<AppState>) -> HttpResponse {
    if let Err(e) = state.handle().stats().await {
        tracing::debug!(error = %e, "/metrics: cannot read the engine's figures");
    }
    HttpResponse::Ok()
        .content_type("text/plain; version=0.0.4; charset=utf-8")
        .body(render_metrics())
}

/// `POST /reset_prefix_cache`.
pub(crate) async fn reset_prefix_cache(
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    let reset = state.handle().reset_prefix_cache().await?;
    Ok(HttpResponse::Ok().json(json!({"reset": reset})))
}
