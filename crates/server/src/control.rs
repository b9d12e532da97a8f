//! The routes RL trainers drive SGLang's server with between rollout steps (slime, AReaL, verl),
//! in SGLang's shapes: `POST /abort_request`, `POST /pause_generation`,
//! `POST /continue_generation`, `GET|POST /flush_cache`, `GET /health_generate` and
//! `POST /update_weight_version`; and vLLM's RLHF routes over the same pause: `POST /pause`,
//! `POST /resume` and `GET /is_paused`.

use std::collections::HashMap;
use std::time::Duration;

use actix_web::{HttpResponse, web};
use futures_util::StreamExt;
use routed_runtime::{GenerateRequest, PauseMode, RequestEvent};
use routed_types::SamplingParams;
use serde::Deserialize;
use serde_json::json;

use crate::AppState;
use crate::body::JsonBody;
use crate::error::ApiError;
use crate::wire::parse;

/// How long `/health_generate` waits for its one token (SGLang's default).
const HEALTH_GENERATE_TIMEOUT: Duration = Duration::from_secs(20);

/// The body of `/abort_request` (SGLang's `AbortReq`).
#[derive(Debug, Deserialize)]
struct AbortBody {
    rid: Option<String>,
    abort_all: Option<bool>,
}

/// `POST /abort_request`: aborts the request whose id is `rid` (`/generate`'s `rid`, or a
/// response's `id`; a `/generate` continuation's suffixed id ends it alone), or with `abort_all`
/// every request in flight. Aborted requests answer as
/// usual, with `finish_reason` `abort` and what they computed. An unknown `rid` is no error (the
/// request may just have ended); 200 with an empty body, as SGLang answers.
pub(crate) async fn abort_request(
    state: web::Data<AppState>,
    body: JsonBody,
) -> Result<HttpResponse, ApiError> {
    let b: AbortBody = parse(&body.value_or_empty()?)?;
    let (registry, handle) = (state.registry(), state.handle());
    let num_aborted = match (b.abort_all, b.rid.as_deref()) {
        (Some(true), _) => registry.abort_all(handle),
        (_, Some(rid)) if !rid.is_empty() => registry.abort_response(handle, rid),
        _ => 0,
    };
    tracing::info!(num_aborted, rid = b.rid.as_deref(), "abort_request");
    Ok(HttpResponse::Ok().finish())
}

/// The body of `/pause_generation`.
#[derive(Debug, Deserialize)]
struct PauseBody {
    mode: Option<String>,
}

fn pause_mode(mode: Option<&str>) -> Result<PauseMode, ApiError> {
    match mode.unwrap_or("abort") {
        "abort" => Ok(PauseMode::Abort),
        "retract" => Ok(PauseMode::Retract),
        "in_place" => Ok(PauseMode::InPlace),
        other => Err(ApiError::invalid(
            "mode",
            format!("mode {other:?}: expected \"abort\", \"retract\" or \"in_place\""),
        )),
    }
}

/// `POST /pause_generation`: answers once the pause holds (in `abort` mode, the default, once
/// every request in flight ended). Requests sent meanwhile wait for `/continue_generation`.
pub(crate) async fn pause_generation(
    state: web::Data<AppState>,
    body: JsonBody,
) -> Result<HttpResponse, ApiError> {
    let b: PauseBody = parse(&body.value_or_empty()?)?;
    let paused = state.handle().pause_generation(pause_mode(b.mode.as_deref())?).await?;
    Ok(HttpResponse::Ok().json(json!({
        "message": "Generation paused successfully.",
        "status": "ok",
        "mode": paused.mode.as_str(),
        "num_paused_requests": paused.num_requests,
    })))
}

/// `POST /continue_generation`: the paused requests resume and the held ones start.
pub(crate) async fn continue_generation(
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    let admitted = state.handle().continue_generation().await?;
    Ok(HttpResponse::Ok().json(json!({
        "message": "Generation continued successfully.",
        "status": "ok",
        "num_admitted_requests": admitted,
    })))
}

/// `GET|POST /flush_cache`: drops the prefix cache when no request is running, waiting, paused
/// or held: 200; otherwise nothing is dropped: 400 (trainers call it until it succeeds, to know
/// the engine has gone quiet).
pub(crate) async fn flush_cache(state: web::Data<AppState>) -> Result<HttpResponse, ApiError> {
    Ok(match state.handle().flush_cache().await? {
        true => HttpResponse::Ok().content_type("text/plain").body("Cache flushed.\n"),
        false => HttpResponse::BadRequest()
            .content_type("text/plain")
            .body("Cache not flushed: requests are running or waiting.\n"),
    })
}

/// `GET /health_generate`: 200 once the engine generated one token for a one-token prompt,
/// 503 when it cannot (unhealthy, draining, or no token within 20 s). While generation is
/// paused or a weight update holds new requests, nothing is generated: the engine's health
/// answers.
pub(crate) async fn health_generate(state: web::Data<AppState>) -> HttpResponse {
    let unavailable = |why: String| {
        tracing::warn!("/health_generate: {why}");
        HttpResponse::ServiceUnavailable().finish()
    };
    if state.is_draining() {
        return unavailable("shutting down".into());
    }
    let handle = state.handle();
    if let Err(e) = handle.health().await {
        return unavailable(e.to_string());
    }
    match handle.admission().await {
        Ok(admission) if !admission.is_open() => return HttpResponse::Ok().finish(),
        Ok(_) => {}
        Err(e) => return unavailable(e.to_string()),
    }
    let request = GenerateRequest::new(vec![0], SamplingParams::greedy(1));
    let mut stream = match handle.submit(request).await {
        Ok(stream) => stream,
        Err(e) => return unavailable(e.to_string()),
    };
    match tokio::time::timeout(HEALTH_GENERATE_TIMEOUT, stream.next()).await {
        Ok(Some(RequestEvent::Token(_) | RequestEvent::Finished(_))) => HttpResponse::Ok().finish(),
        Ok(Some(RequestEvent::Error(e))) => unavailable(e.to_string()),
        Ok(None) => unavailable("the engine ended the request without a token".into()),
        Err(_) => unavailable("no token within 20 s".into()),
    }
}

/// A boolean query parameter, as FastAPI reads one.
fn query_bool(
    query: &HashMap<String, String>,
    name: &str,
    default: bool,
) -> Result<bool, ApiError> {
    let Some(value) = query.get(name) else { return Ok(default) };
    match value.to_ascii_lowercase().as_str() {
        "true" | "1" | "yes" | "on" => Ok(true),
        "false" | "0" | "no" | "off" => Ok(false),
        _ => Err(ApiError::invalid(name, format!("{name}={value:?} is not a boolean"))),
    }
}

/// vLLM's pause modes: `abort` (the default), `wait` (let the requests in flight finish) and
/// `keep` (freeze them where they are); the deprecated `wait_for_inflight_requests=true` means
/// `wait`.
fn vllm_pause_mode(query: &HashMap<String, String>) -> Result<PauseMode, ApiError> {
    if query_bool(query, "wait_for_inflight_requests", false)? {
        return Ok(PauseMode::Wait);
    }
    match query.get("mode").map_or("abort", String::as_str) {
        "abort" => Ok(PauseMode::Abort),
        "wait" => Ok(PauseMode::Wait),
        "keep" => Ok(PauseMode::InPlace),
        other => Err(ApiError::invalid(
            "mode",
            format!("mode {other:?}: expected \"abort\", \"wait\" or \"keep\""),
        )),
    }
}

/// vLLM's `POST /pause?mode=abort|wait|keep&clear_cache=true`: answers `{"status": "paused"}`
/// once the pause holds. With `abort` or `wait`, `clear_cache` (default true) then drops the
/// prefix cache, as vLLM does after draining.
pub(crate) async fn pause(
    state: web::Data<AppState>,
    query: web::Query<HashMap<String, String>>,
) -> Result<HttpResponse, ApiError> {
    let mode = vllm_pause_mode(&query)?;
    let clear_cache = query_bool(&query, "clear_cache", true)?;
    let handle = state.handle();
    handle.pause_generation(mode).await?;
    if clear_cache && mode != PauseMode::InPlace {
        handle.reset_prefix_cache().await?;
    }
    Ok(HttpResponse::Ok().json(json!({"status": "paused"})))
}

/// vLLM's `POST /resume`.
pub(crate) async fn resume(state: web::Data<AppState>) -> Result<HttpResponse, ApiError> {
    state.handle().continue_generation().await?;
    Ok(HttpResponse::Ok().json(json!({"status": "resumed"})))
}

/// vLLM's `GET /is_paused`: whether generation is paused (by either server's route).
pub(crate) async fn is_paused(state: web::Data<AppState>) -> Result<HttpResponse, ApiError> {
    let admission = state.handle().admission().await?;
    Ok(HttpResponse::Ok().json(json!({"is_paused": admission.paused.is_some()})))
}

/// The body of `/update_weight_version`.
#[derive(Debug, Deserialize)]
struct VersionBody {
    new_version: String,
    abort_all_requests: Option<bool>,
}

/// `POST /update_weight_version`: names the weights served (after a trainer changed them by
/// other means); requests in flight report the new name.
pub(crate) async fn update_weight_version(
    state: web::Data<AppState>,
    body: JsonBody,
) -> Result<HttpResponse, ApiError> {
    let b: VersionBody = parse(&body.value_or_empty()?)?;
    let abort = b.abort_all_requests.unwrap_or(false);
    let weights = state.handle().set_weight_version(b.new_version, abort).await?;
    Ok(HttpResponse::Ok().json(json!({
        "success": true,
        "message": format!("Weight version updated to {}", weights.version),
        "new_version": weights.version,
    })))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vllm_pause_queries_read_as_vllm_reads_them() {
        let q = |pairs: &[(&str, &str)]| -> HashMap<String, String> {
            pairs.iter().map(|&(k, v)| (k.to_owned(), v.to_owned())).collect()
        };
        assert_eq!(vllm_pause_mode(&q(&[])).unwrap(), PauseMode::Abort);
        assert_eq!(vllm_pause_mode(&q(&[("mode", "keep")])).unwrap(), PauseMode::InPlace);
        assert_eq!(vllm_pause_mode(&q(&[("mode", "wait")])).unwrap(), PauseMode::Wait);
        let deprecated = q(&[("wait_for_inflight_requests", "True")]);
        assert_eq!(vllm_pause_mode(&deprecated).unwrap(), PauseMode::Wait);
        let e = vllm_pause_mode(&q(&[("mode", "in_place")])).unwrap_err();
        assert_eq!(e.body().error.param.as_deref(), Some("mode"));
        assert!(!query_bool(&q(&[("clear_cache", "false")]), "clear_cache", true).unwrap());
        assert!(query_bool(&q(&[]), "clear_cache", true).unwrap());
        let e = query_bool(&q(&[("clear_cache", "maybe")]), "clear_cache", true).unwrap_err();
        assert_eq!(e.body().error.param.as_deref(), Some("clear_cache"));
    }

    #[test]
    fn pause_modes_are_sglangs_names() {
        assert_eq!(pause_mode(None).unwrap(), PauseMode::Abort);
        for mode in [PauseMode::Abort, PauseMode::Retract, PauseMode::InPlace] {
            assert_eq!(pause_mode(Some(mode.as_str())).unwrap(), mode);
        }
        assert!(pause_mode(Some("wait")).is_err(), "vLLM's mode, not SGLang's");
        let e = pause_mode(Some("later")).unwrap_err();
        assert_eq!(e.body().error.param.as_deref(), Some("mode"));
    }
}
