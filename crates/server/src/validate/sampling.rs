//! Sampling parameters shared by every route: defaults, and what only the wire can get wrong.
//! Their ranges are the engine's rules ([`SamplingParams::check`]), which `check_request` runs
//! and names as the route does.

use routed_types::{ResponseFormat, SamplingParams, TokenId};
use serde_json::{Map, Value};

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
    pub include_stop_str: Option<bool>,
    pub skip_special_tokens: Option<bool>,
    pub presence_penalty: Option<f32>,
    pub frequency_penalty: Option<f32>,
    pub repetition_penalty: Option<f32>,
    pub min_p: Option<f32>,
    pub logit_bias: Option<Map<String, Value>>,
    /// Alternatives per prompt token when prompt logprobs are computed.
    pub prompt_logprobs: Option<u32>,
    /// Prefix of the field names in errors (`sampling_params.` on `/generate`).
    pub prefix: &'static str,
}

/// Builds the engine's sampling parameters: the defaults, `top_k`'s -1 and 0 as "off", and
/// `logit_bias`'s keys as token ids. Nothing here is range-checked: the request goes through
/// the engine's check before it is submitted.
pub(crate) fn sampling(
    f: SamplingFields,
    max_tokens: u32,
    logprobs: Option<u32>,
    default_seed: u64,
) -> Result<SamplingParams, ApiError> {
    let name = |field: &str| format!("{}{field}", f.prefix);
    // vLLM's and SGLang's "off" values, which the engine spells `None`.
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
    let logit_bias = match &f.logit_bias {
        Some(map) => logit_bias(map, &name("logit_bias"))?,
        None => Vec::new(),
    };
    Ok(SamplingParams {
        temperature: f.temperature.unwrap_or(1.0),
        top_p: f.top_p.unwrap_or(1.0),
        top_k,
        seed: f.seed.unwrap_or(default_seed),
        max_tokens,
        min_tokens: f.min_tokens.unwrap_or(0),
        ignore_eos: f.ignore_eos.unwrap_or(false),
        stop_token_ids: f.stop_token_ids.unwrap_or_default(),
        stop: f.stop.map(StopField::into_vec).unwrap_or_default(),
        include_stop_str_in_output: f.include_stop_str.unwrap_or(false),
        skip_special_tokens: f.skip_special_tokens.unwrap_or(true),
        logprobs,
        prompt_logprobs: f.prompt_logprobs,
        presence_penalty: f.presence_penalty.unwrap_or(0.0),
        frequency_penalty: f.frequency_penalty.unwrap_or(0.0),
        repetition_penalty: f.repetition_penalty.unwrap_or(1.0),
        min_p: f.min_p.unwrap_or(0.0),
        logit_bias,
        response_format: ResponseFormat::Text,
        thinking_tags: None,
    })
}

/// vLLM's older structured-output fields, none of which is served: refused rather than ignored,
/// so that a client never takes an unconstrained answer for a constrained one.
/// (`guided_decoding_backend` only names an implementation, and is accepted.)
const GUIDED_FIELDS: [&str; 5] =
    ["guided_json", "guided_regex", "guided_choice", "guided_grammar", "guided_whitespace_pattern"];

/// Constraints of vLLM's `structured_outputs` other than `json_object`, refused by name.
const STRUCTURED_OUTPUTS_REFUSED: [&str; 6] =
    ["json", "regex", "choice", "grammar", "structural_tag", "whitespace_pattern"];

/// The output format a request asks for: OpenAI's `response_format` (on both OpenAI routes, as
/// vLLM takes it), `{"type": "text"}` or `{"type": "json_object"}`, or vLLM's
/// `structured_outputs: {"json_object": true}`, compact with its `disable_any_whitespace`. A JSON
/// schema, and vLLM's other ways to constrain the output, are a 400 naming the field.
pub(crate) fn response_format(body: &Value) -> Result<ResponseFormat, ApiError> {
    if let Some(field) = GUIDED_FIELDS.iter().find(|f| body.get(**f).is_some_and(|v| !v.is_null()))
    {
        return Err(ApiError::unsupported(
            field,
            format!("{field} is not supported; response_format {{\"type\": \"json_object\"}} is"),
        ));
    }
    let (structured, compact) = structured_outputs(body)?;
    let json = structured || openai_response_format(body)?;
    Ok(match (json, compact) {
        (false, _) => ResponseFormat::Text,
        (true, false) => ResponseFormat::JsonObject,
        (true, true) => ResponseFormat::CompactJsonObject,
    })
}

/// Whether OpenAI's `response_format` asks for a JSON object.
fn openai_response_format(body: &Value) -> Result<bool, ApiError> {
    let Some(format) = body.get("response_format").filter(|v| !v.is_null()) else {
        return Ok(false);
    };
    if !format.is_object() {
        return Err(ApiError::InvalidRequest {
            message: format!(
                "response_format must be an object such as {{\"type\": \"json_object\"}}, got {format}"
            ),
            param: Some("response_format".to_owned()),
            code: "invalid_type",
        });
    }
    let Some(kind) = format.get("type") else {
        return Err(ApiError::missing("response_format.type", "response_format needs a type"));
    };
    match kind.as_str() {
        Some("text") => Ok(false),
        Some("json_object") => Ok(true),
        Some(other @ ("json_schema" | "structural_tag")) => Err(ApiError::unsupported(
            "response_format.type",
            format!("response_format {other:?} is not supported; \"text\" and \"json_object\" are"),
        )),
        _ => Err(ApiError::invalid(
            "response_format.type",
            format!("response_format.type must be \"text\" or \"json_object\", got {kind}"),
        )),
    }
}

/// vLLM's `structured_outputs`: whether it asks for a JSON object (`json_object: true`) and for
/// no whitespace outside strings (`disable_any_whitespace: true`, which, as in vLLM, only shapes
/// a structured output). Its other constraints are a 400 naming the key; its other switches
/// concern schemas and backends, and change nothing here.
fn structured_outputs(body: &Value) -> Result<(bool, bool), ApiError> {
    let Some(value) = body.get("structured_outputs").filter(|v| !v.is_null()) else {
        return Ok((false, false));
    };
    let Some(fields) = value.as_object() else {
        return Err(ApiError::InvalidRequest {
            message: format!("structured_outputs must be an object, got {value}"),
            param: Some("structured_outputs".to_owned()),
            code: "invalid_type",
        });
    };
    let set = |key: &str| fields.get(key).is_some_and(|v| !v.is_null() && *v != Value::Bool(false));
    if let Some(key) = STRUCTURED_OUTPUTS_REFUSED.iter().find(|k| set(k)) {
        let param = format!("structured_outputs.{key}");
        return Err(ApiError::unsupported(
            &param,
            format!("{param} is not supported; structured_outputs.json_object is"),
        ));
    }
    Ok((set("json_object"), set("disable_any_whitespace")))
}

/// OpenAI's `logit_bias`: token ids as the JSON keys they must be, each with a number; sorted by
/// token id, as the engine takes them. The ids against the vocabulary, the values' range and a
/// repeated id (`"5"` and `"05"`, refused rather than one silently winning) are the engine's
/// check.
fn logit_bias(map: &Map<String, Value>, param: &str) -> Result<Vec<(TokenId, f32)>, ApiError> {
    let mut bias = Vec::with_capacity(map.len());
    for (key, value) in map {
        let Ok(token) = key.trim().parse::<TokenId>() else {
            return Err(ApiError::invalid(
                param,
                format!("{param} keys must be token ids, given as strings; got {key:?}"),
            ));
        };
        let Some(v) = value.as_f64() else {
            return Err(ApiError::invalid(
                param,
                format!("{param} values must be numbers; token {key} has {value}"),
            ));
        };
        bias.push((token, v as f32));
    }
    bias.sort_by_key(|&(token, _)| token);
    Ok(bias)
}
