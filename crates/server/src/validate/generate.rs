//! `/generate` bodies (SGLang names) to engine requests.

use routed_types::TokenId;
use serde_json::Value;

use super::prompt::{encode, most_prompt_tokens, token_ids};
use super::sampling::{SamplingFields, sampling};
use super::{Job, MAX_LOGPROBS, WireNames, cache_namespace, check_request, request};
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

/// The logprobs a `/generate` body asks for: `Some(top)` with `return_logprob`. Prompt logprobs
/// (`logprob_start_len` other than SGLang's default -1) are refused until the engine computes
/// them.
fn logprobs(b: &GenerateBody) -> Result<Option<u32>, ApiError> {
    let top = b.top_logprobs_num.unwrap_or(0);
    if top > MAX_LOGPROBS {
        return Err(ApiError::invalid(
            "top_logprobs_num",
            format!("top_logprobs_num must be between 0 and {MAX_LOGPROBS}, got {top}"),
        ));
    }
    if !b.return_logprob.unwrap_or(false) {
        return Ok(None);
    }
    if b.logprob_start_len.is_some_and(|s| s != -1) {
        return Err(ApiError::unsupported(
            "logprob_start_len",
            "prompt logprobs (input_token_logprobs) are not available on this server yet; \
             omit logprob_start_len or set it to -1",
        ));
    }
    Ok(Some(top))
}

/// Validates a `/generate` body. Routing, when returned, is always raw int32.
pub(crate) fn generate(state: &AppState, body: &Value) -> Result<GenerateJob, ApiError> {
    let b: GenerateBody = parse(body)?;
    let info = state.info();
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
        prefix: "sampling_params.",
        min_tokens_name: "min_new_tokens",
    };
    let logprobs = logprobs(&b)?;
    let sampling = sampling(fields, max_tokens, logprobs, state.default_seed())?;
    let (prompt, prompt_param) = prompt(state, &b)?;
    let r = request(prompt, &sampling, 1, routing, salt.as_ref());
    let names = WireNames {
        prompt: prompt_param,
        max_tokens: "sampling_params.max_new_tokens",
        routing_start: routing_wire::start_param(&routing_fields),
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
    };
    Ok(GenerateJob {
        job,
        top_logprobs_num: logprobs.filter(|&k| k > 0),
        text_in_logprobs: b.return_text_in_logprobs.unwrap_or(false),
    })
}
