//! Sampling parameters shared by every route: defaults and range checks.

use routed_types::{SamplingParams, TokenId};
use serde_json::{Map, Value};

use super::MAX_LOGPROBS;
use crate::error::ApiError;
use crate::wire::StopField;

/// Largest magnitude of a `logit_bias` value (OpenAI's range).
const MAX_LOGIT_BIAS: f64 = 100.0;

/// Largest magnitude of `presence_penalty` and `frequency_penalty` (OpenAI's range).
const MAX_PENALTY: f32 = 2.0;

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
    pub presence_penalty: Option<f32>,
    pub frequency_penalty: Option<f32>,
    pub repetition_penalty: Option<f32>,
    pub min_p: Option<f32>,
    pub logit_bias: Option<Map<String, Value>>,
    /// Alternatives per prompt token when prompt logprobs are computed (already checked).
    pub prompt_logprobs: Option<u32>,
    /// Prefix of the field names in errors (`sampling_params.` on `/generate`).
    pub prefix: &'static str,
    /// The name of `min_tokens` on this route.
    pub min_tokens_name: &'static str,
}

/// Builds the engine's sampling parameters, checking each range. `vocab_size` bounds the token
/// ids of `logit_bias`.
pub(crate) fn sampling(
    f: SamplingFields,
    max_tokens: u32,
    logprobs: Option<u32>,
    default_seed: u64,
    vocab_size: usize,
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
    let penalty = |field: &str, value: Option<f32>| {
        let v = value.unwrap_or(0.0);
        if v.is_finite() && (-MAX_PENALTY..=MAX_PENALTY).contains(&v) {
            return Ok(v);
        }
        let field = name(field);
        Err(ApiError::invalid(&field, format!("{field} must be between -2 and 2, got {v}")))
    };
    let presence_penalty = penalty("presence_penalty", f.presence_penalty)?;
    let frequency_penalty = penalty("frequency_penalty", f.frequency_penalty)?;
    let repetition_penalty = f.repetition_penalty.unwrap_or(1.0);
    if !(repetition_penalty.is_finite() && repetition_penalty > 0.0) {
        let field = name("repetition_penalty");
        return Err(ApiError::invalid(
            &field,
            format!("{field} must be greater than 0 (1 is off), got {repetition_penalty}"),
        ));
    }
    let min_p = f.min_p.unwrap_or(0.0);
    if !(0.0..=1.0).contains(&min_p) {
        let field = name("min_p");
        return Err(ApiError::invalid(&field, format!("{field} must be in [0, 1], got {min_p}")));
    }
    let logit_bias = match &f.logit_bias {
        Some(map) => logit_bias(map, &name("logit_bias"), vocab_size)?,
        None => Vec::new(),
    };
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
        prompt_logprobs: f.prompt_logprobs,
        presence_penalty,
        frequency_penalty,
        repetition_penalty,
        min_p,
        logit_bias,
    })
}

/// OpenAI's `logit_bias`: token ids (as the JSON keys they must be) below the vocabulary size,
/// each with a bias in [-100, 100]; sorted by token id, as the engine takes them. Two keys that
/// name the same id (`"5"` and `"05"`) are refused rather than one silently winning.
fn logit_bias(
    map: &Map<String, Value>,
    param: &str,
    vocab_size: usize,
) -> Result<Vec<(TokenId, f32)>, ApiError> {
    let mut bias = Vec::with_capacity(map.len());
    for (key, value) in map {
        let token = key.trim().parse::<TokenId>().ok().filter(|&t| (t as usize) < vocab_size);
        let Some(token) = token else {
            return Err(ApiError::invalid(
                param,
                format!(
                    "{param} keys must be token ids in [0, {vocab_size}), given as strings; \
                     got {key:?}"
                ),
            ));
        };
        let Some(v) = value.as_f64().filter(|v| (-MAX_LOGIT_BIAS..=MAX_LOGIT_BIAS).contains(v))
        else {
            return Err(ApiError::invalid(
                param,
                format!("{param} values must be numbers in [-100, 100]; token {key} has {value}"),
            ));
        };
        bias.push((token, v as f32));
    }
    bias.sort_by_key(|&(token, _)| token);
    if let Some(w) = bias.windows(2).find(|w| w[0].0 == w[1].0) {
        return Err(ApiError::invalid(
            param,
            format!("{param} names token {} more than once", w[0].0),
        ));
    }
    Ok(bias)
}
