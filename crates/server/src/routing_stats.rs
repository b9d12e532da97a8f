//! `GET /v1/routing/stats` and `POST /v1/routing/stats/reset`: how many tokens each expert of
//! each MoE layer received, prompt (prefill) and generated (decode) positions apart, and how
//! uneven that load is, since the engine started or the last reset.
//!
//! The counts are the engine's (`EngineHandle::expert_load`, kept by the routing host-cache as it
//! stores each step's rows), so they cover every token the model computed: a token served from
//! the prefix cache is not computed again and is not counted again. The Prometheus series
//! `routed_expert_tokens_total` and `routed_expert_load_imbalance` carry the same figures since
//! start; a reset here does not touch them.

use actix_web::{HttpResponse, web};
use routed_routing::{ExpertLoad, Phase};
use serde_json::{Value, json};

use crate::AppState;
use crate::error::ApiError;

/// One MoE layer in one phase: tokens per expert, the tokens that went through the layer (each
/// picks `top_k` experts) and the busiest expert's count over the mean (`null` before any token).
fn phase_json(load: &ExpertLoad, layer: usize, phase: Phase, top_k: u64) -> Value {
    let counts = load.counts(layer, phase);
    let assignments: u64 = counts.iter().sum();
    json!({
        "tokens": assignments / top_k.max(1),
        "expert_tokens": counts,
        "imbalance": load.imbalance(layer, phase),
    })
}

/// A phase over every layer: the tokens computed (each went through every MoE layer once) and
/// the worst layer's imbalance.
fn total_json(load: &ExpertLoad, phase: Phase, top_k: u64) -> (u64, Value) {
    let tokens = (0..load.num_layers())
        .map(|l| load.counts(l, phase).iter().sum::<u64>() / top_k.max(1))
        .max()
        .unwrap_or(0);
    let worst =
        (0..load.num_layers()).filter_map(|l| load.imbalance(l, phase)).max_by(f64::total_cmp);
    (tokens, json!({"tokens": tokens, "max_imbalance": worst}))
}

/// `GET /v1/routing/stats`.
pub(crate) async fn stats(state: web::Data<AppState>) -> Result<HttpResponse, ApiError> {
    let info = state.info();
    let load = state.handle().expert_load().await?;
    let (Some(meta), Some(load)) = (&info.routing, load) else {
        // A model without MoE layers routes nothing.
        let empty = json!({"tokens": 0, "max_imbalance": null});
        return Ok(HttpResponse::Ok().json(json!({
            "object": "routing_stats",
            "routing_capture": false,
            "num_experts": null,
            "top_k": null,
            "moe_layer_ids": [],
            "layers": [],
            "totals": {"tokens": 0, "prefill": empty, "decode": empty},
        })));
    };
    let load = load.since_reset;
    let top_k = u64::from(meta.top_k);
    let layers: Vec<Value> = meta
        .moe_layer_ids
        .iter()
        .enumerate()
        .take(load.num_layers())
        .map(|(l, &layer)| {
            json!({
                "layer": layer,
                "prefill": phase_json(&load, l, Phase::Prefill, top_k),
                "decode": phase_json(&load, l, Phase::Decode, top_k),
            })
        })
        .collect();
    let (prefill_tokens, prefill) = total_json(&load, Phase::Prefill, top_k);
    let (decode_tokens, decode) = total_json(&load, Phase::Decode, top_k);
    Ok(HttpResponse::Ok().json(json!({
        "object": "routing_stats",
        "routing_capture": info.routing_capture,
        "num_experts": meta.num_experts,
        "top_k": meta.top_k,
        "moe_layer_ids": meta.moe_layer_ids,
        "layers": layers,
        "totals": {"tokens": prefill_tokens + decode_tokens, "prefill": prefill, "decode": decode},
    })))
}

/// `POST /v1/routing/stats/reset`: the counts start again from zero. Answers once the reset is
/// done, so a `GET` that follows never sees counts from before it.
pub(crate) async fn reset(state: web::Data<AppState>) -> Result<HttpResponse, ApiError> {
    let handle = state.handle();
    handle.reset_expert_load();
    // The reset travels the same mailboxes as this read, in order: once the read is answered the
    // reset has been applied.
    handle.expert_load().await?;
    Ok(HttpResponse::Ok().json(json!({"reset": true})))
}
