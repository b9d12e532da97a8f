//! `/generate` bodies (SGLang names) to engine requests.

use routed_types::{TokenId, check_num_logprobs};
use serde_json::Value;

use super::prompt::{encode, most_prompt_tokens, token_ids};
use super::sampling::{SamplingFields, sampling};
use super::{Job, WireNames, cache_namespace, check_request, request};
use crate::AppState;
use crate::error::ApiError;
use crate::routing_wire::{self, RoutingFields};
use crate::wire::{GenerateBody, parse};

/// A validated `/generate` request: the job, and how its logprobs are shaped.
#[derive(Clone, Debug)]
pub(crate) struct GenerateJob {
    /// What runs.
    pub job: Job,
    /// Top alternatives per sampled token (`output_top_logprobs`), when asked with logprobs.
    pub top_logprobs_num: Option<u32>,
    /// Token texts in the logprob triples instead of `null`.
    pub text_in_logprobs: bool,
    /// The first prompt position of `input_token_logprobs`, when prompt logprobs were asked for.
    pub logprob_start_len: Option<usize>,
    /// The client's id for the request.
    pub rid: Option<String>,
}

/// SGLang's `rid`: one non-empty string (a list names a batch's requests; batches are not
/// served here).
fn rid(b: &GenerateBody) -> Result<Option<String>, ApiError> {
    match &b.rid {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) if !s.is_empty() && s.len() <= 256 => Ok(Some(s.clone())),
        Some(Value::String(_)) => Err(ApiError::invalid("rid", "rid must be 1 to 256 bytes")),
        Some(_) => {
            Err(ApiError::invalid("rid", "rid must be one string (batches are not supported)"))
        }
    }
}

/// The prompt of a `/generate` body: `text` or `input_ids`, one of them, not a batch; and the
/// field it came from.
fn prompt(state: &AppState, b: &GenerateBody) -> Result<(Vec<TokenId>, &'static str), ApiError> {
    let most = most_prompt_tokens(state.info());
    match (&b.text, &b.input_ids) {
        (Some(_), Some(_)) => {
            Err(ApiError::invalid("text", "give either text or input_ids, not both"))
        }
        (Some(Value::String(s)), None) => Ok((encode(state, s, false, "text", most)?, "text")),
        (None, Some(Value::Array(ids))) if ids.iter().all(Value::is_number) => {
            Ok((token_ids(ids, "input_ids")?, "input_ids"))
        }
        (Some(_), None) => {
            Err(ApiError::invalid("text", "text must be one string (batches are not supported)"))
        }
        (None, Some(_)) => Err(ApiError::invalid(
            "input_ids",
            "input_ids must be one array of token ids (batches are not supported)",
        )),
        (None, None) => Err(ApiError::invalid("text", "give text or input_ids")),
    }
}

/// The logprobs a `/generate` body asks for: `Some(top)` with `return_logprob`.
fn logprobs(b: &GenerateBody) -> Result<Option<u32>, ApiError> {
    let top = b.top_logprobs_num.unwrap_or(0);
    // Without `return_logprob` the engine never sees the count, but a count past the limit is
    // still a mistake worth answering: the engine's rule, run here.
    check_num_logprobs("top_logprobs_num", top)
        .map_err(|e| ApiError::invalid(e.param, e.message))?;
    Ok(b.return_logprob.unwrap_or(false).then_some(top))
}

/// Where `input_token_logprobs` start, as SGLang reads `logprob_start_len`: -1 (the default)
/// asks for none, `0..prompt_len` for the prompt tokens from there on; without `return_logprob`
/// the field is unused. The prompt length is checked once the prompt is known
/// ([`check_start`]).
fn logprob_start(b: &GenerateBody) -> Result<Option<usize>, ApiError> {
    match b.logprob_start_len {
        Some(start) if b.return_logprob == Some(true) && start != -1 => {
            usize::try_from(start).map(Some).map_err(|_| {
                ApiError::invalid(
                    "logprob_start_len",
                    format!(
                        "logprob_start_len must be -1 (no prompt logprobs) or >= 0, got {start}"
                    ),
                )
            })
        }
        _ => Ok(None),
    }
}

/// A start at or past the prompt's end names no prompt token (SGLang refuses it too).
fn check_start(start: Option<usize>, prompt_len: usize) -> Result<(), ApiError> {
    match start {
        Some(s) if s >= prompt_len => Err(ApiError::invalid(
            "logprob_start_len",
            format!(
                "logprob_start_len ({s}) must be below the number of prompt tokens ({prompt_len})"
            ),
        )),
        _ => Ok(()),
    }
}

/// Validates a `/generate` body. Routing, when returned, is always raw int32.
pub(crate) fn generate(state: &AppState, body: &Value) -> Result<GenerateJob, ApiError> {
    let b: GenerateBody = parse(body)?;
    let info = state.info();
    let rid = rid(&b)?;
    let sp = b.sampling_params.clone().unwrap_or_default();
    if sp.n.is_some_and(|n| n != 1) {
        return Err(ApiError::unsupported(
            "sampling_params.n",
            "n > 1 is not supported on /generate",
        ));
    }
    let max_tokens = sp.max_new_tokens.unwrap_or(128);
    let routing_fields = RoutingFields {
        return_routed_experts: b.return_routed_experts,
        start_len: b.routed_experts_start_len,
        prompt_start: None,
        format: Some("raw_b64_int32".into()),
        layers: b.routed_experts_layers.clone(),
    };
    let routing = routing_wire::resolve(info, &routing_fields)?;
    let salt = cache_namespace(b.cache_salt.as_deref(), b.extra_key.as_deref())?;
    let fields = SamplingFields {
        temperature: sp.temperature,
        top_p: sp.top_p,
        top_k: sp.top_k,
        seed: sp.seed.or(sp.sampling_seed),
        min_tokens: sp.min_new_tokens,
        ignore_eos: sp.ignore_eos,
        stop: sp.stop,
        stop_token_ids: sp.stop_token_ids,
        presence_penalty: sp.presence_penalty,
        frequency_penalty: sp.frequency_penalty,
        repetition_penalty: sp.repetition_penalty,
        min_p: sp.min_p,
        logit_bias: sp.logit_bias,
        prompt_logprobs: None,
        prefix: "sampling_params.",
    };
    let logprobs = logprobs(&b)?;
    let start = logprob_start(&b)?;
    let prompt_logprobs = start.and(logprobs);
    let fields = SamplingFields { prompt_logprobs, ..fields };
    let sampling = sampling(fields, max_tokens, logprobs, state.default_seed())?;
    let (prompt, prompt_param) = prompt(state, &b)?;
    check_start(start, prompt.len())?;
    let r = request(prompt, &sampling, 1, routing, salt.as_ref());
    let names = WireNames {
        prompt: prompt_param,
        max_tokens: "sampling_params.max_new_tokens",
        min_tokens: "sampling_params.min_new_tokens",
        logprobs: "top_logprobs_num",
        // Prompt logprobs are asked for with `logprob_start_len`, and take their count from
        // `top_logprobs_num`.
        prompt_logprobs: "top_logprobs_num",
        routing_start: routing_wire::start_param(&routing_fields),
        sampling_prefix: "sampling_params.",
    };
    check_request(info, &r, &names)?;
    let job = Job {
        stop: sampling.stop.clone(),
        requests: vec![r],
        n: 1,
        routing,
        stream: b.stream.unwrap_or(false).then_some(false),
        return_token_ids: true,
        logprobs,
        echo: None,
        prompt_logprobs: None,
    };
    Ok(GenerateJob {
        job,
        top_logprobs_num: logprobs.filter(|&k| k > 0),
        text_in_logprobs: b.return_text_in_logprobs.unwrap_or(false),
        logprob_start_len: start,
        rid,
    })
}
