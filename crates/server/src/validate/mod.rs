//! From wire bodies to engine requests: defaults, ranges and the checks that make every bad
//! input a 400 naming its field before anything reaches the engine.

use routed_model::ChatMessage;
use routed_runtime::{GenerateRequest, ModelInfo};
use routed_types::{SamplingParams, TokenId};
use serde_json::Value;

use crate::AppState;
use crate::error::ApiError;
use crate::routing_wire::{self, RoutingFields, RoutingRequest};
use crate::wire::{
    ChatFields, CommonFields, CompletionFields, GenerateBody, MessageContent, StopField, parse,
};

/// Most continuations one request may ask for.
const MAX_N: u32 = 128;
/// Most top alternatives per token.
const MAX_LOGPROBS: u32 = 20;

/// A validated request: one engine request per prompt, and how to answer.
#[derive(Clone, Debug)]
pub(crate) struct Job {
    /// One per prompt, in order; each samples `n` continuations.
    pub requests: Vec<GenerateRequest>,
    /// Continuations per prompt.
    pub n: usize,
    /// Routing to return, if any.
    pub routing: Option<RoutingRequest>,
    /// `Some(include_usage)` for a streamed answer.
    pub stream: Option<bool>,
    /// Add `token_ids` / `prompt_token_ids` to choices.
    pub return_token_ids: bool,
    /// Top alternatives per token, when logprobs were asked for.
    pub logprobs: Option<u32>,
    /// Stop strings, held back while streaming.
    pub stop: Vec<String>,
}

impl Job {
    /// Prompt lengths, one per prompt.
    pub(crate) fn prompt_lens(&self) -> Vec<usize> {
        self.requests.iter().map(|r| r.prompt_token_ids.len()).collect()
    }
}

/// Answers 404 when the body names a model this server does not serve.
fn check_model(info: &ModelInfo, model: Option<&str>) -> Result<(), ApiError> {
    match model {
        Some(m) if m != info.served_model_name => Err(ApiError::NotFound {
            message: format!(
                "the model '{m}' does not exist; this server serves '{}'",
                info.served_model_name
            ),
            param: Some("model".into()),
            code: "model_not_found",
        }),
        _ => Ok(()),
    }
}

/// Refuses fields we parse but do not implement, unless they hold their neutral value.
fn refuse_unsupported(c: &CommonFields) -> Result<(), ApiError> {
    let nonzero = |v: Option<f32>| v.is_some_and(|v| v != 0.0);
    if nonzero(c.presence_penalty) {
        return Err(ApiError::unsupported("presence_penalty", "presence_penalty is not supported"));
    }
    if nonzero(c.frequency_penalty) {
        return Err(ApiError::unsupported(
            "frequency_penalty",
            "frequency_penalty is not supported",
        ));
    }
    if c.repetition_penalty.is_some_and(|v| v != 1.0) {
        return Err(ApiError::unsupported(
            "repetition_penalty",
            "repetition_penalty is not supported",
        ));
    }
    if c.logit_bias.as_ref().is_some_and(|m| !m.is_empty()) {
        return Err(ApiError::unsupported("logit_bias", "logit_bias is not supported"));
    }
    if c.echo == Some(true) {
        return Err(ApiError::unsupported("echo", "echo is not supported"));
    }
    if let Some(best_of) = c.best_of
        && best_of != c.n.unwrap_or(1)
    {
        return Err(ApiError::unsupported("best_of", "best_of different from n is not supported"));
    }
    Ok(())
}

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
    })
}

/// Checks that `prompt_len + max_tokens` fits the model; `prompt_param` names the prompt field.
fn check_length(
    info: &ModelInfo,
    prompt_len: usize,
    max_tokens: u32,
    prompt_param: &str,
    max_param: &str,
) -> Result<(), ApiError> {
    let limit = info.max_model_len;
    if prompt_len >= limit {
        return Err(ApiError::invalid(
            prompt_param,
            format!(
                "this model's maximum context length is {limit} tokens, and the prompt has {prompt_len}"
            ),
        ));
    }
    if prompt_len + max_tokens as usize > limit {
        return Err(ApiError::invalid(
            max_param,
            format!(
                "this model's maximum context length is {limit} tokens; the prompt ({prompt_len}) \
                 plus {max_param} ({max_tokens}) exceeds it"
            ),
        ));
    }
    Ok(())
}

/// Token ids from a JSON array, each below the vocabulary size.
fn token_ids(value: &[Value], info: &ModelInfo, param: &str) -> Result<Vec<TokenId>, ApiError> {
    value
        .iter()
        .map(|v| {
            v.as_u64().filter(|&id| id < info.vocab_size as u64).map(|id| id as TokenId).ok_or_else(
                || {
                    ApiError::invalid(
                        param,
                        format!("token ids must be integers in [0, {}), got {v}", info.vocab_size),
                    )
                },
            )
        })
        .collect()
}

/// Encodes a text prompt.
fn encode(state: &AppState, text: &str, param: &str) -> Result<Vec<TokenId>, ApiError> {
    state
        .tokenizer()
        .encode(text)
        .map_err(|e| ApiError::invalid(param, format!("cannot tokenize: {e}")))
}

/// The prompts of `/v1/completions`: a string, token ids, or a batch of either.
fn completion_prompts(state: &AppState, prompt: &Value) -> Result<Vec<Vec<TokenId>>, ApiError> {
    let info = state.info();
    let wrong = || {
        ApiError::invalid(
            "prompt",
            "prompt must be a string, an array of token ids, or an array of either",
        )
    };
    let prompts = match prompt {
        Value::String(s) => vec![encode(state, s, "prompt")?],
        Value::Array(items) if items.iter().all(Value::is_number) && !items.is_empty() => {
            vec![token_ids(items, info, "prompt")?]
        }
        Value::Array(items) if !items.is_empty() => items
            .iter()
            .map(|item| match item {
                Value::String(s) => encode(state, s, "prompt"),
                Value::Array(ids) => token_ids(ids, info, "prompt"),
                _ => Err(wrong()),
            })
            .collect::<Result<_, _>>()?,
        Value::Array(_) => return Err(ApiError::invalid("prompt", "prompt must not be empty")),
        _ => return Err(wrong()),
    };
    if prompts.iter().any(Vec::is_empty) {
        return Err(ApiError::invalid("prompt", "a prompt must have at least one token"));
    }
    Ok(prompts)
}

/// The checks and defaults both OpenAI routes share; returns the routing request and stream mode.
fn common_job(
    state: &AppState,
    c: &CommonFields,
    prompt_lens: &[usize],
) -> Result<(usize, Option<RoutingRequest>, Option<bool>), ApiError> {
    refuse_unsupported(c)?;
    let n = c.n.unwrap_or(1);
    if !(1..=MAX_N).contains(&n) {
        return Err(ApiError::invalid("n", format!("n must be between 1 and {MAX_N}, got {n}")));
    }
    if c.cache_salt.as_deref() == Some("") {
        return Err(ApiError::invalid("cache_salt", "cache_salt must be a non-empty string"));
    }
    let stream = c.stream.unwrap_or(false);
    if c.stream_options.is_some() && !stream {
        return Err(ApiError::invalid("stream_options", "stream_options needs stream: true"));
    }
    let include_usage = c.stream_options.as_ref().and_then(|o| o.include_usage).unwrap_or(false);
    let routing = routing_wire::resolve(
        state.info(),
        &RoutingFields {
            return_routed_experts: c.return_routed_experts,
            start_len: c.routed_experts_start_len,
            prompt_start: c.routed_experts_prompt_start,
            format: c.routed_experts_format.clone(),
        },
        prompt_lens,
    )?;
    Ok((n as usize, routing, stream.then_some(include_usage)))
}

fn sampling_fields(c: &CommonFields) -> SamplingFields {
    SamplingFields {
        temperature: c.temperature,
        top_p: c.top_p,
        top_k: c.top_k,
        seed: c.seed,
        min_tokens: c.min_tokens,
        ignore_eos: c.ignore_eos,
        stop: c.stop.clone(),
        stop_token_ids: c.stop_token_ids.clone(),
        prefix: "",
        min_tokens_name: "min_tokens",
    }
}

fn requests(
    prompts: Vec<Vec<TokenId>>,
    sampling: &SamplingParams,
    n: usize,
    routing: Option<RoutingRequest>,
    cache_salt: Option<String>,
) -> Vec<GenerateRequest> {
    prompts
        .into_iter()
        .map(|prompt| GenerateRequest {
            prompt_token_ids: prompt,
            sampling: sampling.clone(),
            n,
            return_routing: routing.is_some(),
            routing_start: routing.map_or(0, |r| r.start),
            cache_salt: cache_salt.clone(),
        })
        .collect()
}

/// Validates a `/v1/completions` body.
pub(crate) fn completions(state: &AppState, body: &Value) -> Result<Job, ApiError> {
    let c: CommonFields = parse(body)?;
    let f: CompletionFields = parse(body)?;
    check_model(state.info(), c.model.as_deref())?;
    if f.suffix.as_deref().is_some_and(|s| !s.is_empty()) {
        return Err(ApiError::unsupported("suffix", "suffix is not supported"));
    }
    let prompts = completion_prompts(state, &f.prompt)?;
    let lens: Vec<usize> = prompts.iter().map(Vec::len).collect();
    let (n, routing, stream) = common_job(state, &c, &lens)?;
    let max_tokens = f.max_tokens.unwrap_or(16);
    if max_tokens == 0 {
        return Err(ApiError::invalid("max_tokens", "max_tokens must be at least 1"));
    }
    for &len in &lens {
        check_length(state.info(), len, max_tokens, "prompt", "max_tokens")?;
    }
    let sampling = sampling(sampling_fields(&c), max_tokens, f.logprobs, state.default_seed())?;
    Ok(Job {
        stop: sampling.stop.clone(),
        requests: requests(prompts, &sampling, n, routing, c.cache_salt.clone()),
        n,
        routing,
        stream,
        return_token_ids: c.return_token_ids.unwrap_or(false),
        logprobs: f.logprobs,
    })
}

/// Renders chat messages with the checkpoint's template.
fn render_chat(state: &AppState, f: &ChatFields) -> Result<Vec<TokenId>, ApiError> {
    if f.messages.is_empty() {
        return Err(ApiError::invalid("messages", "messages must not be empty"));
    }
    let tokenizer = state.tokenizer();
    if !tokenizer.has_chat_template() {
        return Err(ApiError::invalid(
            "messages",
            "this model has no chat template; use /v1/completions with a prompt",
        ));
    }
    let mut messages = Vec::with_capacity(f.messages.len());
    for (i, m) in f.messages.iter().enumerate() {
        let content = match &m.content {
            None => String::new(),
            Some(MessageContent::Text(t)) => t.clone(),
            Some(MessageContent::Parts(parts)) => {
                let mut text = String::new();
                for part in parts {
                    match (part.kind.as_str(), &part.text) {
                        ("text", Some(t)) => text.push_str(t),
                        _ => {
                            return Err(ApiError::unsupported(
                                &format!("messages[{i}].content"),
                                format!("content parts of type '{}' are not supported", part.kind),
                            ));
                        }
                    }
                }
                text
            }
        };
        messages.push(ChatMessage { role: m.role.clone(), content });
    }
    let add_generation_prompt = f.add_generation_prompt.unwrap_or(true);
    let text = tokenizer.apply_chat_template(&messages, add_generation_prompt).map_err(|e| {
        ApiError::invalid("messages", format!("cannot apply the chat template: {e}"))
    })?;
    let ids = encode(state, &text, "messages")?;
    if ids.is_empty() {
        return Err(ApiError::invalid("messages", "the rendered prompt has no tokens"));
    }
    Ok(ids)
}

/// Validates a `/v1/chat/completions` body.
pub(crate) fn chat(state: &AppState, body: &Value) -> Result<Job, ApiError> {
    let c: CommonFields = parse(body)?;
    let f: ChatFields = parse(body)?;
    check_model(state.info(), c.model.as_deref())?;
    if f.tools.as_ref().is_some_and(|t| !t.is_empty()) {
        return Err(ApiError::unsupported("tools", "tools are not supported"));
    }
    if let Some(format) = &f.response_format
        && format.get("type").and_then(Value::as_str) != Some("text")
    {
        return Err(ApiError::unsupported(
            "response_format",
            "only the text response_format is supported",
        ));
    }
    let top_logprobs = f.top_logprobs.unwrap_or(0);
    if top_logprobs > MAX_LOGPROBS {
        return Err(ApiError::invalid(
            "top_logprobs",
            format!("top_logprobs must be at most {MAX_LOGPROBS}"),
        ));
    }
    let logprobs = f.logprobs.unwrap_or(false);
    if top_logprobs > 0 && !logprobs {
        return Err(ApiError::invalid("top_logprobs", "top_logprobs needs logprobs: true"));
    }
    let prompt = render_chat(state, &f)?;
    let len = prompt.len();
    let (n, routing, stream) = common_job(state, &c, &[len])?;
    let (max_param, max_tokens) = match (f.max_completion_tokens, f.max_tokens) {
        (Some(m), _) => ("max_completion_tokens", m),
        (None, Some(m)) => ("max_tokens", m),
        (None, None) => (
            "max_tokens",
            state.info().max_model_len.saturating_sub(len).min(u32::MAX as usize) as u32,
        ),
    };
    check_length(state.info(), len, max_tokens, "messages", max_param)?;
    if max_tokens == 0 {
        return Err(ApiError::invalid(max_param, format!("{max_param} must be at least 1")));
    }
    let logprobs = logprobs.then_some(top_logprobs);
    let sampling = sampling(sampling_fields(&c), max_tokens, logprobs, state.default_seed())?;
    Ok(Job {
        stop: sampling.stop.clone(),
        requests: requests(vec![prompt], &sampling, n, routing, c.cache_salt.clone()),
        n,
        routing,
        stream,
        return_token_ids: c.return_token_ids.unwrap_or(false),
        logprobs,
    })
}

/// Validates a `/generate` body. Routing, when returned, is always raw int32.
pub(crate) fn generate(state: &AppState, body: &Value) -> Result<Job, ApiError> {
    let b: GenerateBody = parse(body)?;
    let info = state.info();
    let prompt = match (&b.text, &b.input_ids) {
        (Some(_), Some(_)) => {
            return Err(ApiError::invalid("text", "give either text or input_ids, not both"));
        }
        (Some(Value::String(s)), None) => encode(state, s, "text")?,
        (None, Some(Value::Array(ids))) if ids.iter().all(Value::is_number) => {
            token_ids(ids, info, "input_ids")?
        }
        (Some(_), None) => {
            return Err(ApiError::invalid(
                "text",
                "text must be one string (batches are not supported)",
            ));
        }
        (None, Some(_)) => {
            return Err(ApiError::invalid(
                "input_ids",
                "input_ids must be one array of token ids (batches are not supported)",
            ));
        }
        (None, None) => return Err(ApiError::invalid("text", "give text or input_ids")),
    };
    if prompt.is_empty() {
        return Err(ApiError::invalid("input_ids", "the prompt must have at least one token"));
    }
    let sp = b.sampling_params.unwrap_or_default();
    if sp.n.is_some_and(|n| n != 1) {
        return Err(ApiError::unsupported(
            "sampling_params.n",
            "n > 1 is not supported on /generate",
        ));
    }
    let max_tokens = sp.max_new_tokens.unwrap_or(128);
    if max_tokens == 0 {
        return Err(ApiError::invalid(
            "sampling_params.max_new_tokens",
            "max_new_tokens must be at least 1",
        ));
    }
    check_length(info, prompt.len(), max_tokens, "input_ids", "sampling_params.max_new_tokens")?;
    let routing = routing_wire::resolve(
        info,
        &RoutingFields {
            return_routed_experts: b.return_routed_experts,
            start_len: b.routed_experts_start_len,
            prompt_start: None,
            format: Some("raw_b64_int32".into()),
        },
        &[prompt.len()],
    )?;
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
    let logprobs = b.return_logprob.unwrap_or(false).then_some(0);
    let sampling = sampling(fields, max_tokens, logprobs, state.default_seed())?;
    Ok(Job {
        stop: sampling.stop.clone(),
        requests: requests(vec![prompt], &sampling, 1, routing, None),
        n: 1,
        routing,
        stream: b.stream.unwrap_or(false).then_some(false),
        return_token_ids: true,
        logprobs,
    })
}
