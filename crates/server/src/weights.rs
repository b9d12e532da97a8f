//! Weight updates over HTTP, as SGLang serves them to RL trainers (slime, verl, AReaL...):
//! `POST /update_weights_from_disk`, `GET /get_weight_version` and `GET /get_model_info`.
//!
//! The outcome of an update has SGLang's shape, `{success, message, num_paused_requests}`, 200 when
//! the new weights serve and 400 when the checkpoint is refused (the old weights keep serving);
//! a body that cannot be an update at all is the gateway's usual 400 naming the field.

use actix_web::http::StatusCode;
use actix_web::{HttpResponse, web};
use routed_runtime::{EngineError, WeightUpdate};
use serde::Deserialize;
use serde_json::{Value, json};

use crate::AppState;
use crate::body::{JsonBody, prepare};
use crate::error::ApiError;
use crate::wire::parse;

/// The body of `/update_weights_from_disk` (SGLang's `UpdateWeightFromDiskReqInput`; its other
/// fields tune PyTorch and SGLang's scheduler and are ignored).
#[derive(Debug, Deserialize)]
struct UpdateBody {
    model_path: Option<String>,
    load_format: Option<String>,
    abort_all_requests: Option<bool>,
    weight_version: Option<String>,
    flush_cache: Option<bool>,
}

/// The engine's update from a parsed body.
fn weight_update(body: &Value) -> Result<WeightUpdate, ApiError> {
    let b: UpdateBody = parse(body)?;
    let dir = match b.model_path {
        Some(path) if !path.is_empty() => path,
        _ => {
            return Err(ApiError::missing(
                "model_path",
                "'model_path' (the checkpoint directory) is required",
            ));
        }
    };
    if let Some(format) = b.load_format.filter(|f| !matches!(f.as_str(), "auto" | "safetensors")) {
        return Err(ApiError::unsupported(
            "load_format",
            format!("load_format {format:?}: checkpoints are read as safetensors (\"auto\")"),
        ));
    }
    if b.flush_cache == Some(false) {
        return Err(ApiError::unsupported(
            "flush_cache",
            "the prefix cache always goes with the weights that computed it",
        ));
    }
    Ok(WeightUpdate {
        dir: dir.into(),
        abort_all_requests: b.abort_all_requests.unwrap_or(false),
        weight_version: b.weight_version,
    })
}

/// `POST /update_weights_from_disk`: answers once the new weights serve (the requests in flight
/// finish first, or end at once with `abort_all_requests`).
pub(crate) async fn update_weights_from_disk(
    state: web::Data<AppState>,
    body: JsonBody,
) -> Result<HttpResponse, ApiError> {
    let update = prepare(&state, body, |_, body| weight_update(body)).await?;
    let named = update.weight_version.is_some();
    let (status, message, num_paused) = match state.handle().update_weights(update).await {
        Ok(done) => {
            let mut message = String::from("Succeeded to update model weights.");
            if named {
                message += &format!(" Weight version updated to {}.", done.weights.version);
            }
            (StatusCode::OK, message, done.num_held_requests)
        }
        Err(EngineError::InvalidRequest { message, .. } | EngineError::Conflict(message)) => {
            (StatusCode::BAD_REQUEST, message, 0)
        }
        Err(e) => (StatusCode::SERVICE_UNAVAILABLE, e.to_string(), 0),
    };
    Ok(HttpResponse::build(status).json(json!({
        "success": status == StatusCode::OK,
        "message": message,
        "num_paused_requests": num_paused,
    })))
}

/// `GET /get_weight_version`.
pub(crate) async fn get_weight_version(
    state: web::Data<AppState>,
) -> Result<HttpResponse, ApiError> {
    let weights = state.handle().weights().await?;
    Ok(HttpResponse::Ok().json(json!({"weight_version": weights.version})))
}

/// `GET /get_model_info`: where the served weights came from (the tokenizer stays the one loaded
/// at start), and their version.
pub(crate) async fn get_model_info(state: web::Data<AppState>) -> Result<HttpResponse, ApiError> {
    let weights = state.handle().weights().await?;
    Ok(HttpResponse::Ok().json(json!({
        "model_path": weights.dir,
        "tokenizer_path": state.info().checkpoint_dir,
        "is_generation": true,
        "preferred_sampling_params": null,
        "weight_version": weights.version,
    })))
}
