//! The introspection routes routers, launchers and benchmark tools poll: SGLang's `GET
//! /server_info` (and its older name `/get_server_info`) and `GET /get_load`, and vLLM's `GET
//! /version`.
//!
//! SGLang answers `/server_info` with its whole server configuration flattened into one object,
//! its scheduler's limits beside them, one `internal_states` entry per data-parallel rank and its
//! version. routed answers the fields it has under SGLang's names (one rank: no data
//! parallelism), its own under theirs, and nothing it would have to make up.

use std::sync::OnceLock;
use std::time::Instant;

use actix_web::{HttpResponse, web};
use serde_json::json;

use crate::AppState;
use crate::error::ApiError;

/// `GET /server_info`, `GET /get_server_info`.
pub(crate) async fn server_info(state: web::Data<AppState>) -> Result<HttpResponse, ApiError> {
    let handle = state.handle();
    let weights = handle.weights().await?;
    let stats = handle.stats().await?;
    let admission = handle.admission().await?;
    let info = state.info();
    let routing = info.routing.as_ref();
    let internal = json!({
        "num_running_reqs": stats.num_running,
        "num_waiting_reqs": stats.num_waiting,
        "num_held_reqs": admission.num_held_requests,
        "is_paused": admission.paused.is_some(),
        "memory_released": admission.memory_released.names(),
        "num_used_tokens": used_tokens(&stats, info.block_size),
        "num_prefix_cache_hits": stats.num_prefix_cache_hits,
    });
    Ok(HttpResponse::Ok().json(json!({
        "model_path": weights.dir,
        "tokenizer_path": info.checkpoint_dir,
        "served_model_name": info.served_model_name,
        "weight_version": weights.version,
        "device": info.device,
        "context_length": info.max_model_len,
        "page_size": info.block_size,
        "max_running_requests": info.max_num_seqs,
        "max_queued_requests": info.max_waiting_requests,
        "chunked_prefill_size": info.max_num_batched_tokens,
        "disable_radix_cache": !info.prefix_caching,
        "enable_return_routed_experts": info.routing_capture && routing.is_some(),
        "random_seed": info.default_seed,
        "tp_size": 1,
        "dp_size": 1,
        "pp_size": 1,
        "ep_size": info.expert_parallel_size,
        "max_total_num_tokens": info.num_kv_blocks * info.block_size,
        "max_req_input_len": info.max_model_len.saturating_sub(1),
        "num_moe_layers": routing.map(|r| r.moe_layer_ids.len()),
        "num_experts": routing.map(|r| r.num_experts),
        "num_experts_per_tok": routing.map(|r| r.top_k),
        "tool_call_parser": state.tool_call_parser().map(|p| p.name()),
        "reasoning_parser": state.reasoning_parser().map(|p| p.name()),
        "internal_states": [internal],
        "version": env!("CARGO_PKG_VERSION"),
    })))
}

/// Tokens of the KV blocks requests hold (free and evictable cached blocks are available).
fn used_tokens(stats: &routed_runtime::EngineStats, block_size: usize) -> usize {
    let available = stats.num_kv_blocks_free + stats.num_kv_blocks_evictable;
    stats.num_kv_blocks_total.saturating_sub(available) * block_size
}

/// `GET /get_load`: SGLang's per-rank load list (one rank): requests in flight (running and
/// waiting), those waiting, the KV capacity in tokens (`num_tokens`) and the tokens still
/// available (`num_pending_tokens`, as SGLang names them), and when it was read (`ts_tic`,
/// seconds on a monotonic clock).
pub(crate) async fn get_load(state: web::Data<AppState>) -> Result<HttpResponse, ApiError> {
    static ORIGIN: OnceLock<Instant> = OnceLock::new();
    let stats = state.handle().stats().await?;
    let block_size = state.info().block_size;
    let capacity = stats.num_kv_blocks_total * block_size;
    let ts_tic = ORIGIN.get_or_init(Instant::now).elapsed().as_secs_f64();
    Ok(HttpResponse::Ok().json(json!([{
        "dp_rank": 0,
        "num_reqs": stats.num_running + stats.num_waiting,
        "num_waiting_reqs": stats.num_waiting,
        "num_tokens": capacity,
        "num_pending_tokens": capacity - used_tokens(&stats, block_size),
        "ts_tic": ts_tic,
    }])))
}

/// `GET /version`: vLLM's `{"version": ...}`, routed's version (the one `/server_info` reports),
/// which launchers read to tell that the server is up and what it runs.
pub(crate) async fn version() -> HttpResponse {
    HttpResponse::Ok().json(json!({ "version": env!("CARGO_PKG_VERSION") }))
}
