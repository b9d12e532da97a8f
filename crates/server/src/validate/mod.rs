//! From wire bodies to engine requests: defaults, ranges and the checks that make every bad
//! input a 400 naming its field before anything reaches the engine.
//!
//! The rules about one engine request (token ids in the vocabulary, the prompt and `max_tokens`
//! against `max_model_len` and the KV cache, `n`, the routing start, the sampling parameters'
//! ranges) live in the engine, `routed_runtime::validate`; this module runs them on each request
//! before submitting any of a batch, and names the field as the route's wire does
//! ([`WireNames`]). What is checked here is the wire: types, shapes, field names, values the
//! wire spells differently from the engine (`top_k: -1`, `logit_bias`'s keys), and what only the
//! gateway knows (a batch's size, a text's size before it is encoded).

mod chat;
mod generate;
mod grammar;
mod json_schema;
mod prompt;
mod regex;
mod sampling;
mod structural_tag;

use std::borrow::Cow;
use std::sync::Arc;

use routed_model::Tokenizer;
use routed_runtime::{EngineError, GenerateRequest, MAX_N, ModelInfo};
use routed_types::{
    MAX_LOGPROBS, ResponseFormat, SamplingError, SamplingParams, ThinkingTags, TokenId,
};
use serde_json::{Value, json};

use crate::AppState;
use crate::error::ApiError;
use crate::reasoning::ReasoningParser;
use crate::response::TokenNames;
use crate::routing_wire::{self, RoutingFields, RoutingRequest};
use crate::tools::ToolUse;
use crate::wire::{ChatFields, CommonFields, CompletionFields, UnservedFields, parse};

pub(crate) use chat::ChatExtras;
pub(crate) use generate::{GenerateJob, generate};
pub(crate) use prompt::{ChatRender, encode, render_chat, render_messages, token_ids};
use prompt::{completion_prompts, echoed_message, truncate, truncation};
use sampling::{SamplingFields, bad_words, sampling};

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
    /// Every streamed chunk carries its choice's usage so far (vLLM's
    /// `stream_options.continuous_usage_stats`, with `include_usage`).
    pub continuous_usage: bool,
    /// Add `token_ids` / `prompt_token_ids` to choices.
    pub return_token_ids: bool,
    /// Logprobs name tokens `token_id:<id>` (vLLM's `return_tokens_as_token_ids`).
    pub tokens_as_ids: bool,
    /// Top alternatives per token, when logprobs were asked for.
    pub logprobs: Option<u32>,
    /// `echo`: on completions each prompt's text, in prompt order, to put before its choices'
    /// text (and, with `logprobs`, its tokens before theirs); on chat the one text to put before
    /// every choice's content (`prompt::echoed_message`).
    pub echo: Option<Vec<String>>,
    /// Alternatives per prompt token in vLLM's `prompt_logprobs` response field, when it is
    /// returned.
    pub prompt_logprobs: Option<u32>,
    /// How a chat's tool calls come out of its answer (`tool_choice`).
    pub tool_use: ToolUse,
    /// Only an answer's first call is returned (`parallel_tool_calls: false`).
    pub first_call_only: bool,
    /// How a chat's reasoning is split off its content (the server's parser).
    pub reasoning: Option<ReasoningParser>,
    /// The reasoning split off is returned (vLLM's `include_reasoning`, default true).
    pub include_reasoning: bool,
    /// The response's id as the client named the request, if it did.
    pub client_id: Option<ClientId>,
}

/// A response id the client chose: SGLang's `rid` (the id itself) or vLLM's `request_id` (the
/// route's prefix before it).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct ClientId {
    /// The response's id.
    pub id: String,
    /// The field that named it, for the refusal of an id already in flight.
    pub param: &'static str,
}

/// The response id `c` names (`prefix`: the route's, for vLLM's `request_id`): each 1 to 256
/// bytes, not both.
fn client_id(c: &CommonFields, prefix: &str) -> Result<Option<ClientId>, ApiError> {
    let text = |param: &'static str, value: Option<&Value>| match value {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) if !s.is_empty() && s.len() <= 256 => Ok(Some(s.clone())),
        Some(Value::String(_)) => {
            Err(ApiError::invalid(param, format!("{param} must be 1 to 256 bytes")))
        }
        Some(_) => Err(ApiError::invalid(
            param,
            format!("{param} must be a string (one response, one id)"),
        )),
    };
    match (text("rid", c.rid.as_ref())?, text("request_id", c.request_id.as_ref())?) {
        (Some(_), Some(_)) => {
            Err(ApiError::invalid("request_id", "give rid or request_id, not both"))
        }
        (Some(rid), None) => Ok(Some(ClientId { id: rid, param: "rid" })),
        (None, Some(id)) => {
            Ok(Some(ClientId { id: format!("{prefix}-{id}"), param: "request_id" }))
        }
        (None, None) => Ok(None),
    }
}

impl Job {
    /// How this job's logprobs name tokens.
    pub(crate) fn names<'a>(&self, tokenizer: &'a Tokenizer) -> TokenNames<'a> {
        TokenNames { tokenizer, as_ids: self.tokens_as_ids }
    }

    /// How prompt `prompt` samples: its stop strings and special tokens shape streamed text.
    pub(crate) fn sampling(&self, prompt: usize) -> &SamplingParams {
        &self.requests[prompt].sampling
    }

    /// Prompt lengths, one per prompt.
    pub(crate) fn prompt_lens(&self) -> Vec<usize> {
        self.requests.iter().map(|r| r.prompt_token_ids.len()).collect()
    }
}

/// Answers 404 when the body names a model this server does not serve.
pub(crate) fn check_model(info: &ModelInfo, model: Option<&str>) -> Result<(), ApiError> {
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

/// Whether an unserved field's value asks for nothing: absent, null, an empty list, object or
/// string.
pub(crate) fn is_neutral(value: Option<&Value>) -> bool {
    match value {
        None | Some(Value::Null) => true,
        Some(Value::Array(list)) => list.is_empty(),
        Some(Value::Object(map)) => map.is_empty(),
        Some(Value::String(s)) => s.is_empty(),
        Some(_) => false,
    }
}

/// Refuses fields we parse but do not implement, unless they hold their neutral value: an
/// answer computed without one of them would be taken for one computed with it.
fn refuse_unsupported(c: &CommonFields, body: &Value) -> Result<(), ApiError> {
    if let Some(best_of) = c.best_of
        && best_of != c.n.unwrap_or(1)
    {
        return Err(ApiError::unsupported("best_of", "best_of different from n is not supported"));
    }
    let u: UnservedFields = parse(body)?;
    if let Some(priority) = u.priority.filter(|&p| p != 0) {
        return Err(ApiError::unsupported(
            "priority",
            format!("got priority {priority}, but requests are served first come, first served"),
        ));
    }
    let asked = |size: Option<i64>| size.is_some_and(|s| s != 0);
    refuse_given([
        ("use_beam_search", u.use_beam_search == Some(true)),
        ("logits_processors", !is_neutral(u.logits_processors.as_ref())),
        ("prompt_embeds", !is_neutral(u.prompt_embeds.as_ref())),
        ("max_repetition_pattern_size", asked(u.max_repetition_pattern_size)),
        ("min_repetition_pattern_size", asked(u.min_repetition_pattern_size)),
        ("repetition_min_count", asked(u.repetition_min_count)),
        ("vllm_xargs", !is_neutral(u.vllm_xargs.as_ref())),
        ("kv_transfer_params", !is_neutral(u.kv_transfer_params.as_ref())),
    ])
}

/// The first of `fields` (a name, and whether it asks for something) that was given, refused.
pub(crate) fn refuse_given<const N: usize>(fields: [(&str, bool); N]) -> Result<(), ApiError> {
    match fields.into_iter().find(|&(_, given)| given) {
        Some((field, _)) => Err(ApiError::unsupported(field, format!("{field} is not supported"))),
        None => Ok(()),
    }
}

/// vLLM's `prompt_logprobs`: alternatives per prompt token (at most [`MAX_LOGPROBS`], which the
/// engine checks; a value that is not even a `u32` is the wire's to refuse). A stream has nothing
/// that would carry them, so with `stream` it is refused unless 0 (which vLLM accepts there and
/// returns nothing for); `None` when nothing is to be computed.
fn prompt_logprobs(value: Option<i64>, stream: bool) -> Result<Option<u32>, ApiError> {
    let Some(k) = value else { return Ok(None) };
    let k = u32::try_from(k).map_err(|_| {
        ApiError::invalid(
            "prompt_logprobs",
            format!("prompt_logprobs must be between 0 and {MAX_LOGPROBS}, got {k}"),
        )
    })?;
    match (stream, k) {
        (false, k) => Ok(Some(k)),
        (true, 0) => Ok(None),
        (true, _) => Err(ApiError::invalid(
            "prompt_logprobs",
            "prompt_logprobs are not available when stream is true",
        )),
    }
}

/// How one route names the fields the engine's checks are about.
#[derive(Clone, Copy, Debug)]
pub(crate) struct WireNames {
    /// The prompt (`prompt`, `messages`, `input_ids` or `text`).
    pub prompt: &'static str,
    /// `max_tokens` as the request named it (`max_completion_tokens`,
    /// `sampling_params.max_new_tokens`).
    pub max_tokens: &'static str,
    /// `min_tokens` as the route names it (`sampling_params.min_new_tokens`).
    pub min_tokens: &'static str,
    /// The top alternatives per sampled token (`logprobs`, chat's `top_logprobs`,
    /// `top_logprobs_num`).
    pub logprobs: &'static str,
    /// The alternatives per prompt token (`prompt_logprobs`; `/generate` asks with
    /// `top_logprobs_num`).
    pub prompt_logprobs: &'static str,
    /// The routing start as the request named it (`routed_experts_start_len` or its alias).
    pub routing_start: &'static str,
    /// Put before the other sampling fields' names (`sampling_params.` on `/generate`).
    pub sampling_prefix: &'static str,
}

impl WireNames {
    /// The names of `/v1/completions`, which are the engine's.
    fn openai(routing_start: &'static str) -> Self {
        Self {
            prompt: "prompt",
            max_tokens: "max_tokens",
            min_tokens: "min_tokens",
            logprobs: "logprobs",
            prompt_logprobs: "prompt_logprobs",
            routing_start,
            sampling_prefix: "",
        }
    }

    /// The wire name of the engine's field `param`.
    fn of(&self, param: &'static str) -> Cow<'static, str> {
        match param {
            "prompt" => self.prompt.into(),
            "max_tokens" => self.max_tokens.into(),
            "min_tokens" => self.min_tokens.into(),
            "logprobs" => self.logprobs.into(),
            "prompt_logprobs" => self.prompt_logprobs.into(),
            "routed_experts_start_len" => self.routing_start.into(),
            // SGLang's top-level field for the tokens named for their logprobs.
            "logprob_token_ids" if !self.sampling_prefix.is_empty() => "token_ids_logprob".into(),
            "n" => format!("{}n", self.sampling_prefix).into(),
            // SGLang's field for the one output format `/generate` takes.
            "response_format" if !self.sampling_prefix.is_empty() => {
                format!("{}json_schema", self.sampling_prefix).into()
            }
            p if !self.sampling_prefix.is_empty() && SamplingError::PARAMS.contains(&p) => {
                format!("{}{p}", self.sampling_prefix).into()
            }
            other => other.into(),
        }
    }
}

/// Runs the engine's checks on `request` (`routed_runtime::validate`) and answers a failure as a
/// 400 naming the field as the route's wire does. A message that names the engine's field by
/// name names the wire's instead (`max_new_tokens must be at least 1`, `top_logprobs must be
/// between 0 and 20`); the prompt is "the prompt" whatever field carried it.
pub(crate) fn check_request(
    info: &ModelInfo,
    request: &GenerateRequest,
    names: &WireNames,
) -> Result<(), ApiError> {
    routed_runtime::validate(request, info).map_err(|err| match err {
        EngineError::InvalidRequest { param, message } => {
            let wire = names.of(param);
            let short = wire.rsplit('.').next().unwrap_or(&wire);
            let message = match param {
                "prompt" => message,
                _ => message.replace(param, short),
            };
            ApiError::invalid(&wire, message)
        }
        other => other.into(),
    })
}

/// How a route names the two fields of a batch's size.
#[derive(Clone, Copy, Debug)]
pub(crate) struct BatchNames {
    /// The continuations per prompt (`n`, `sampling_params.n`).
    pub n: &'static str,
    /// The prompts (`prompt`, `text`, `input_ids`).
    pub prompt: &'static str,
}

/// A batch whose sequences (prompts x `n`) outnumber the waiting queue could never be admitted
/// at once, whatever the load: a 400 naming the limit, not a 503 that invites a retry. (One
/// request's `n` alone is the engine's rule.) Checked before any prompt is encoded.
pub(crate) fn check_batch(
    info: &ModelInfo,
    num_prompts: usize,
    n: usize,
    names: BatchNames,
) -> Result<(), ApiError> {
    let total = num_prompts.saturating_mul(n);
    if num_prompts < 2 || !(1..=MAX_N).contains(&n) || total <= info.max_waiting_requests {
        return Ok(());
    }
    let param = if n > 1 { names.n } else { names.prompt };
    let n_name = names.n.rsplit('.').next().unwrap_or(names.n);
    Err(ApiError::invalid(
        param,
        format!(
            "{num_prompts} prompts x {n_name}={n} are {total} sequences, more than the server's \
             waiting queue holds (--max-waiting-requests {})",
            info.max_waiting_requests
        ),
    ))
}

/// One engine cache salt for a request's two namespaces, vLLM's `cache_salt` and SGLang's
/// `extra_key`: two requests share cached blocks only when both match. The pair is written as a
/// JSON array, which no other pair writes, so distinct pairs never share a salt.
pub(crate) fn cache_namespace(
    cache_salt: Option<&str>,
    extra_key: Option<&str>,
) -> Result<Option<String>, ApiError> {
    for (param, value) in [("cache_salt", cache_salt), ("extra_key", extra_key)] {
        if value == Some("") {
            return Err(ApiError::invalid(param, format!("{param} must be a non-empty string")));
        }
    }
    if cache_salt.is_none() && extra_key.is_none() {
        return Ok(None);
    }
    Ok(Some(json!([cache_salt, extra_key]).to_string()))
}

/// What both OpenAI routes decide the same way.
struct Common {
    n: usize,
    routing: Option<RoutingRequest>,
    /// The routing start's field name in this request.
    routing_start: &'static str,
    /// `Some(include_usage)` for a streamed answer.
    stream: Option<bool>,
    /// vLLM's `continuous_usage_stats` (with `include_usage`).
    continuous_usage: bool,
    cache_salt: Option<String>,
}

/// The checks and defaults both OpenAI routes share.
fn common_job(
    state: &AppState,
    body: &Value,
    c: &CommonFields,
    num_prompts: usize,
) -> Result<Common, ApiError> {
    refuse_unsupported(c, body)?;
    let n = c.n.unwrap_or(1) as usize;
    check_batch(state.info(), num_prompts, n, BatchNames { n: "n", prompt: "prompt" })?;
    let cache_salt = cache_namespace(c.cache_salt.as_deref(), c.extra_key.as_deref())?;
    let stream = c.stream.unwrap_or(false);
    if c.stream_options.is_some() && !stream {
        return Err(ApiError::invalid("stream_options", "stream_options needs stream: true"));
    }
    let include_usage = c.stream_options.as_ref().and_then(|o| o.include_usage).unwrap_or(false);
    let continuous_usage = include_usage
        && c.stream_options.as_ref().and_then(|o| o.continuous_usage_stats).unwrap_or(false);
    let fields = RoutingFields {
        return_routed_experts: c.return_routed_experts,
        start_len: c.routed_experts_start_len,
        prompt_start: c.routed_experts_prompt_start,
        format: c.routed_experts_format.clone(),
        layers: c.routed_experts_layers.clone(),
    };
    let routing = routing_wire::resolve(state.info(), &fields)?;
    let routing_start = routing_wire::start_param(&fields);
    Ok(Common {
        n,
        routing,
        routing_start,
        stream: stream.then_some(include_usage),
        continuous_usage,
        cache_salt,
    })
}

fn sampling_fields(c: &CommonFields, prompt_logprobs: Option<u32>) -> SamplingFields {
    SamplingFields {
        temperature: c.temperature,
        top_p: c.top_p,
        top_k: c.top_k,
        seed: c.seed,
        min_tokens: c.min_tokens,
        ignore_eos: c.ignore_eos,
        stop: c.stop.clone(),
        stop_regex: c.stop_regex.clone(),
        stop_token_ids: c.stop_token_ids.clone(),
        include_stop_str: c.include_stop_str_in_output,
        skip_special_tokens: c.skip_special_tokens,
        presence_penalty: c.presence_penalty,
        frequency_penalty: c.frequency_penalty,
        repetition_penalty: c.repetition_penalty,
        min_p: c.min_p,
        logit_bias: c.logit_bias.clone(),
        prompt_logprobs,
        prefix: "",
    }
}

/// The request's `bad_words`, encoded ([`bad_words`]); none when absent.
fn bad_words_of(state: &AppState, c: &CommonFields) -> Result<Vec<Vec<TokenId>>, ApiError> {
    match c.bad_words.clone() {
        Some(words) => bad_words(state.tokenizer(), words),
        None => Ok(Vec::new()),
    }
}

/// The request's `response_format`, and, with a reasoning parser, the thinking tags it waits
/// for: as vLLM's reasoning parsers have it, a constraint applies to the answer after the
/// thinking, not to the thinking.
fn output_format(
    state: &AppState,
    body: &Value,
) -> Result<(ResponseFormat, Option<ThinkingTags>), ApiError> {
    let format = sampling::response_format(body)?;
    let tags = thinking_tags(state, &format);
    Ok((format, tags))
}

/// The thinking tags a constraint of `format` waits for: with a reasoning parser, as vLLM's
/// reasoning parsers have it, a constraint applies to the answer after the thinking.
fn thinking_tags(state: &AppState, format: &ResponseFormat) -> Option<ThinkingTags> {
    match (format, state.reasoning_parser()) {
        // A token set applies from the first token, thinking or not (as vLLM's
        // `allowed_token_ids` does).
        (ResponseFormat::Text | ResponseFormat::Tokens(_), _) | (_, None) => None,
        (_, Some(parser)) => parser.thinking_tags(state.tokenizer()),
    }
}

/// The engine request for one prompt, sampling `n` continuations.
pub(crate) fn request(
    prompt: Vec<TokenId>,
    sampling: &SamplingParams,
    n: usize,
    routing: Option<RoutingRequest>,
    cache_salt: Option<&String>,
) -> GenerateRequest {
    GenerateRequest {
        prompt_token_ids: prompt,
        sampling: sampling.clone(),
        n,
        return_routing: routing.is_some(),
        routing_start: routing.map_or(0, |r| r.start),
        cache_salt: cache_salt.cloned(),
    }
}

/// Validates a `/v1/completions` body. Each prompt is encoded and checked in turn, so a batch
/// stops at its first bad prompt.
pub(crate) fn completions(state: &AppState, body: &Value) -> Result<Job, ApiError> {
    let c: CommonFields = parse(body)?;
    let f: CompletionFields = parse(body)?;
    check_model(state.info(), c.model.as_deref())?;
    if f.suffix.as_deref().is_some_and(|s| !s.is_empty()) {
        return Err(ApiError::unsupported("suffix", "suffix is not supported"));
    }
    let prompts = completion_prompts(&f.prompt)?;
    let Common { n, routing, routing_start, stream, continuous_usage, cache_salt } =
        common_job(state, body, &c, prompts.len())?;
    let echo = c.echo.unwrap_or(false);
    let asked = prompt_logprobs(c.prompt_logprobs, stream.is_some())?;
    // As vLLM: `echo` with `logprobs` scores the prompt too, and the choice shows those prompt
    // logprobs (with `prompt_logprobs` alternatives when that is given as well).
    let echoed = f.logprobs.filter(|_| echo);
    let shown = asked.or(echoed).filter(|_| stream.is_none());
    let max_tokens = f.max_tokens.unwrap_or(16);
    let fields = sampling_fields(&c, asked.max(echoed));
    let info = state.info();
    let (response_format, thinking_tags) = output_format(state, body)?;
    let sampling = SamplingParams {
        response_format,
        thinking_tags,
        bad_words: bad_words_of(state, &c)?,
        ..sampling(fields, max_tokens, f.logprobs, state.default_seed())?
    };
    let names = WireNames::openai(routing_start);
    let keep = truncation(c.truncate_prompt_tokens, info)?;
    // As vLLM (and SGLang, whose tokenizer adds them by default): a text prompt gets the
    // tokenizer's own special tokens, a BOS for the tokenizers that add one.
    let add_special_tokens = f.add_special_tokens.unwrap_or(true);
    let mut texts = Vec::new();
    let requests = prompts
        .into_iter()
        .map(|prompt| {
            let mut ids = prompt.tokens(state, "prompt", keep, add_special_tokens)?;
            let truncated = truncate(&mut ids, keep);
            let r = request(ids, &sampling, n, routing, cache_salt.as_ref());
            check_request(info, &r, &names)?;
            if echo {
                texts.push(prompt.text(state, &r.prompt_token_ids, truncated)?);
            }
            Ok(r)
        })
        .collect::<Result<Vec<_>, ApiError>>()?;
    Ok(Job {
        requests,
        n,
        routing,
        stream,
        continuous_usage,
        return_token_ids: c.return_token_ids.unwrap_or(false),
        tokens_as_ids: c.return_tokens_as_token_ids.unwrap_or(false),
        logprobs: f.logprobs,
        echo: echo.then_some(texts),
        prompt_logprobs: shown,
        tool_use: ToolUse::None,
        first_call_only: false,
        include_reasoning: true,
        client_id: client_id(&c, "cmpl")?,
        reasoning: None,
    })
}

/// Validates a `/v1/chat/completions` body.
pub(crate) fn chat(state: &AppState, body: &Value) -> Result<Job, ApiError> {
    let c: CommonFields = parse(body)?;
    let f: ChatFields = parse(body)?;
    check_model(state.info(), c.model.as_deref())?;
    if !is_neutral(f.chat_template.as_ref()) {
        return Err(ApiError::unsupported(
            "chat_template",
            "a chat template in the request is not accepted: the checkpoint's template renders \
             every chat",
        ));
    }
    let kwargs = chat::template_kwargs(&f)?;
    let extras = ChatExtras::new(f.tools.as_deref(), kwargs.as_ref())?;
    let (tool_use, forced) = chat::tool_use(state, f.tool_choice.as_ref(), f.tools.as_deref())?;
    let (mut response_format, mut tags) = output_format(state, body)?;
    if let Some(schema) = forced {
        if response_format != ResponseFormat::Text {
            return Err(ApiError::invalid(
                "tool_choice",
                "tool_choice \"required\" or naming a function constrains the output to tool \
                 calls, and so does a response format: give one of them",
            ));
        }
        let schema = Arc::new(json_schema::reduce(&schema, "tools")?);
        response_format = ResponseFormat::JsonSchema { schema, compact: false };
        tags = thinking_tags(state, &response_format);
    }
    let echo = match c.echo {
        Some(true) => Some(vec![echoed_message(&f)?]),
        _ => None,
    };
    let top_logprobs = f.top_logprobs.unwrap_or(0);
    let logprobs = f.logprobs.unwrap_or(false);
    if top_logprobs > 0 && !logprobs {
        return Err(ApiError::invalid("top_logprobs", "top_logprobs needs logprobs: true"));
    }
    let Common { n, routing, routing_start, stream, continuous_usage, cache_salt } =
        common_job(state, body, &c, 1)?;
    let asked = prompt_logprobs(c.prompt_logprobs, stream.is_some())?;
    let keep = truncation(c.truncate_prompt_tokens, state.info())?;
    let prompt = render_chat(state, &f, extras, keep)?;
    let (max_param, max_tokens) = match (f.max_completion_tokens, f.max_tokens) {
        (Some(m), _) => ("max_completion_tokens", m),
        (None, Some(m)) => ("max_tokens", m),
        (None, None) => (
            "max_tokens",
            state.info().max_model_len.saturating_sub(prompt.len()).min(u32::MAX as usize) as u32,
        ),
    };
    let logprobs = logprobs.then_some(top_logprobs);
    let fields = sampling_fields(&c, asked);
    let mut sampling = SamplingParams {
        response_format,
        thinking_tags: tags,
        bad_words: bad_words_of(state, &c)?,
        ..sampling(fields, max_tokens, logprobs, state.default_seed())?
    };
    if state.tool_call_parser().is_some() && tool_use != ToolUse::None {
        // As vLLM's parsers have it: the token that opens a call may be a special one
        // (Mistral's `[TOOL_CALLS]`), so the text keeps special tokens for the parser to see.
        sampling.skip_special_tokens = false;
    }
    let r = request(prompt, &sampling, n, routing, cache_salt.as_ref());
    let names = WireNames {
        prompt: "messages",
        max_tokens: max_param,
        logprobs: "top_logprobs",
        ..WireNames::openai(routing_start)
    };
    check_request(state.info(), &r, &names)?;
    Ok(Job {
        requests: vec![r],
        n,
        routing,
        stream,
        continuous_usage,
        return_token_ids: c.return_token_ids.unwrap_or(false),
        tokens_as_ids: c.return_tokens_as_token_ids.unwrap_or(false),
        logprobs,
        echo,
        prompt_logprobs: asked,
        tool_use,
        first_call_only: f.parallel_tool_calls == Some(false),
        include_reasoning: f.include_reasoning.unwrap_or(true),
        client_id: client_id(&c, "chatcmpl")?,
        reasoning: state.reasoning_parser().filter(|_| f.separate_reasoning != Some(false)),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generate_nests_the_sampling_fields_and_renames_its_own() {
        let generate = WireNames {
            prompt: "input_ids",
            max_tokens: "sampling_params.max_new_tokens",
            min_tokens: "sampling_params.min_new_tokens",
            logprobs: "top_logprobs_num",
            prompt_logprobs: "top_logprobs_num",
            routing_start: "routed_experts_start_len",
            sampling_prefix: "sampling_params.",
        };
        for (engine, wire) in [
            ("prompt", "input_ids"),
            ("max_tokens", "sampling_params.max_new_tokens"),
            ("min_tokens", "sampling_params.min_new_tokens"),
            ("top_p", "sampling_params.top_p"),
            ("logit_bias", "sampling_params.logit_bias"),
            ("logprobs", "top_logprobs_num"),
            ("prompt_logprobs", "top_logprobs_num"),
            ("logprob_token_ids", "token_ids_logprob"),
            // SGLang counts the continuations among the sampling parameters.
            ("n", "sampling_params.n"),
            // Not sampling fields: top-level on /generate too.
            ("return_routed_experts", "return_routed_experts"),
            ("routed_experts_start_len", "routed_experts_start_len"),
        ] {
            assert_eq!(generate.of(engine), wire);
        }
        let openai = WireNames::openai("routed_experts_start_len");
        for param in SamplingError::PARAMS {
            assert_eq!(openai.of(param), param, "/v1/completions names it as the engine does");
        }
        assert_eq!(openai.of("n"), "n");
    }
}
