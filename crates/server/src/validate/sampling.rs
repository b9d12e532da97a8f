//! Sampling parameters shared by every route: defaults and range checks.

use routed_types::SamplingParams;

use super::MAX_LOGPROBS;
use crate::error::ApiError;
use crate::wire::StopField;

/// Sampling fields shared by every route, before `max_tokens` and logprobs.
pub(crate) struct SamplingFields {
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    pub top_k: Option<i64>,
    pub seed: Option<u64>,
    pub min_tokens: Option<u32>,
    pub ignore_eos: Option<bool>,
    pub stop: Option<StopField>,
    pub stop_token_ids: Option<Vec<u32>>,
    /// Prefix of the field names in errors (`sampling_params.` on `/generate`).
    pub prefix: &'static str,
    /// The name of `min_tokens` on this route.
    pub min_tokens_name: &'static str,
}

/// Builds the engine's sampling parameters, checking each range.
pub(crate) fn sampling(
    f: SamplingFields,
    max_tokens: u32,
    logprobs: Option<u32>,
    default_seed: u64,
) -> Result<SamplingParams, ApiError> {
    let name = |field: &str| format!("{}{field}", f.prefix);
    let temperature = f.temperature.unwrap_or(1.0);
    if !(temperature.is_finite() && temperature >= 0.0) {
        return Err(ApiError::invalid(&name("temperature"), "temperature must be a number >= 0"));
    }
    let top_p = f.top_p.unwrap_or(1.0);
    if !(top_p > 0.0 && top_p <= 1.0) {
        return Err(ApiError::invalid(&name("top_p"), "top_p must be in (0, 1]"));
    }
    let top_k = match f.top_k.unwrap_or(-1) {
        -1 | 0 => None,
        k if k > 0 => Some(u32::try_from(k).unwrap_or(u32::MAX)),
        k => {
            return Err(ApiError::invalid(
                &name("top_k"),
                format!("top_k must be -1 (off) or >= 1, got {k}"),
            ));
        }
    };
    let min_tokens = f.min_tokens.unwrap_or(0);
    if min_tokens > max_tokens {
        let field = name(f.min_tokens_name);
        return Err(ApiError::invalid(
            &field,
            format!("{field} ({min_tokens}) must not exceed the maximum tokens ({max_tokens})"),
        ));
    }
    let stop = f.stop.map(StopField::into_vec).unwrap_or_default();
    if stop.iter().any(String::is_empty) {
        return Err(ApiError::invalid(&name("stop"), "stop strings must not be empty"));
    }
    if let Some(k) = logprobs
        && k > MAX_LOGPROBS
    {
        return Err(ApiError::invalid(
            "logprobs",
            format!("logprobs must be between 0 and {MAX_LOGPROBS}, got {k}"),
        ));
    }
    Ok(SamplingParams {
        temperature,
        top_p,
        top_k,
        seed: f.seed.unwrap_or(default_seed),
        max_tokens,
        min_tokens,
        ignore_eos: f.ignore_eos.unwrap_or(false),
        stop_token_ids: f.stop_token_ids.unwrap_or_default(),
        stop,
        logprobs,
        ..SamplingParams::default()
    })
}
