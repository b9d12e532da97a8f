//! Response bodies of the OpenAI routes, whole and streamed, and the pieces they share:
//! finish reasons, usage, logprobs and routing.

use std::collections::BTreeMap;

use routed_model::Tokenizer;
use routed_runtime::{FinalOutput, TokenEvent, WeightVersionSpan};
use routed_types::{FinishReason, RoutingMeta, SampledToken, StopMatch, TokenId};
use serde::Serialize;
use serde_json::{Value, json};

use crate::error::ApiError;
use crate::reasoning::ReasoningParser;
use crate::routing_wire::{self, RoutingRequest};
use crate::run::ChoiceResult;
use crate::tools::{ToolCall, ToolUse};
use crate::validate::Job;

/// `usage`.
#[derive(Clone, Debug, Default, Serialize)]
pub(crate) struct Usage {
    pub prompt_tokens: usize,
    pub completion_tokens: usize,
    pub total_tokens: usize,
    pub prompt_tokens_details: PromptTokensDetails,
}

/// `usage.prompt_tokens_details`.
#[derive(Clone, Debug, Default, Serialize)]
pub(crate) struct PromptTokensDetails {
    pub cached_tokens: usize,
}

impl Usage {
    /// Prompt tokens are counted once per prompt, completion tokens once per choice; cached
    /// tokens are those the prompt's first computation skipped.
    pub(crate) fn of(job: &Job, outputs: &[Option<&FinalOutput>]) -> Self {
        let prompt_tokens: usize = job.prompt_lens().iter().sum();
        let completion_tokens = outputs.iter().flatten().map(|o| o.token_ids.len()).sum();
        let cached_tokens = outputs
            .chunks(job.n.max(1))
            .map(|choices| choices.iter().flatten().map(|o| o.num_cached_tokens).max().unwrap_or(0))
            .sum();
        Self {
            prompt_tokens,
            completion_tokens,
            total_tokens: prompt_tokens + completion_tokens,
            prompt_tokens_details: PromptTokensDetails { cached_tokens },
        }
    }
}

/// The OpenAI `finish_reason`.
pub(crate) fn finish_reason(reason: &FinishReason) -> &'static str {
    match reason {
        FinishReason::Stop { .. } => "stop",
        FinishReason::Length => "length",
        FinishReason::Abort => "abort",
    }
}

/// vLLM's `stop_reason`: the stop token id, stop string or stop pattern that matched, else
/// `null`.
pub(crate) fn stop_reason(reason: &FinishReason) -> Value {
    match reason {
        FinishReason::Stop { matched: Some(StopMatch::Token(id)) } => json!(id),
        FinishReason::Stop { matched: Some(StopMatch::Text(s) | StopMatch::Regex(s)) } => json!(s),
        _ => Value::Null,
    }
}

/// The text of one token for logprobs.
pub(crate) fn token_text(tokenizer: &Tokenizer, id: TokenId) -> String {
    tokenizer.decode(&[id]).unwrap_or_default()
}

/// How logprobs name tokens: by their text, or as `token_id:<id>` (vLLM's
/// `return_tokens_as_token_ids`, exact where a token's text alone is not, say half a
/// multi-byte character).
#[derive(Clone, Copy)]
pub(crate) struct TokenNames<'a> {
    pub tokenizer: &'a Tokenizer,
    pub as_ids: bool,
}

impl TokenNames<'_> {
    /// Token `id` as logprobs name it.
    fn name(&self, id: TokenId) -> String {
        if self.as_ids { format!("token_id:{id}") } else { token_text(self.tokenizer, id) }
    }
}

/// One token of the legacy completions logprobs: its logprob (`None` for the first prompt
/// token, which nothing predicts) and its top alternatives.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Scored<'a> {
    pub token: TokenId,
    pub logprob: Option<f32>,
    pub top: &'a [(TokenId, f32)],
}

impl<'a> From<&'a TokenEvent> for Scored<'a> {
    fn from(t: &'a TokenEvent) -> Self {
        Self { token: t.token, logprob: Some(t.logprob), top: &t.top_logprobs }
    }
}

/// vLLM's floor for a logprob on the wire: `-inf` is not JSON.
fn clamp_logprob(logprob: f32) -> f32 {
    logprob.max(-9999.0)
}

/// Legacy completions logprobs over `tokens`; `offset` is the text offset of the first one and
/// is advanced past them.
pub(crate) fn completion_logprobs(
    names: TokenNames<'_>,
    tokens: &[TokenEvent],
    offset: &mut usize,
) -> Value {
    legacy_logprobs(names, tokens.iter().map(Scored::from), offset)
}

/// Legacy completions logprobs: `tokens`, `token_logprobs`, `top_logprobs` (a map from token
/// text to logprob that includes the token itself; `null` where the token has no logprob) and
/// `text_offset`, counted from `offset`, which is advanced past them (by the names' lengths, as
/// vLLM counts them).
pub(crate) fn legacy_logprobs<'a>(
    names: TokenNames<'_>,
    tokens: impl Iterator<Item = Scored<'a>>,
    offset: &mut usize,
) -> Value {
    let (mut texts, mut logprobs, mut tops, mut offsets) = (vec![], vec![], vec![], vec![]);
    for t in tokens {
        let text = names.name(t.token);
        offsets.push(*offset);
        *offset += text.chars().count();
        let top = t.logprob.map(|logprob| {
            let mut top: BTreeMap<String, f32> =
                t.top.iter().map(|&(id, lp)| (names.name(id), clamp_logprob(lp))).collect();
            top.entry(text.clone()).or_insert(clamp_logprob(logprob));
            top
        });
        tops.push(top);
        logprobs.push(t.logprob.map(clamp_logprob));
        texts.push(text);
    }
    json!({"tokens": texts, "token_logprobs": logprobs, "top_logprobs": tops, "text_offset": offsets})
}

/// The prompt's tokens as legacy logprob entries, for `echo`: the first has no logprob; token
/// `p` has `scores[p - 1]` (the engine's prompt logprobs) with at most `k` alternatives. A
/// position the engine did not score (an aborted choice) has none either.
pub(crate) fn echoed_prompt<'a>(
    prompt: &'a [TokenId],
    scores: Option<&'a [SampledToken]>,
    k: u32,
) -> impl Iterator<Item = Scored<'a>> {
    prompt.iter().enumerate().map(move |(p, &token)| {
        let score = p.checked_sub(1).and_then(|i| scores?.get(i)).filter(|s| s.token == token);
        let top =
            score.map_or(&[][..], |s| &s.top_logprobs[..s.top_logprobs.len().min(k as usize)]);
        Scored { token, logprob: score.map(|s| s.logprob), top }
    })
}

/// vLLM's `prompt_logprobs`: one entry per prompt token, `null` for the first (and for any
/// position the engine did not score), else a map from token id (a string) to
/// `{"logprob", "rank", "decoded_token"}` holding the prompt token and its `k` most likely
/// alternatives (ranks 1..=k).
pub(crate) fn prompt_logprobs_json(
    tokenizer: &Tokenizer,
    prompt: &[TokenId],
    scores: Option<&[SampledToken]>,
    k: u32,
) -> Value {
    let entry = |id: TokenId, logprob: f32, rank: Option<u32>| {
        json!({"logprob": clamp_logprob(logprob), "rank": rank,
               "decoded_token": token_text(tokenizer, id)})
    };
    let positions = prompt.iter().enumerate().map(|(p, &token)| {
        let score = p.checked_sub(1).and_then(|i| scores?.get(i)).filter(|s| s.token == token)?;
        let mut map = serde_json::Map::new();
        map.insert(token.to_string(), entry(token, score.logprob, score.rank));
        for (j, &(id, lp)) in score.top_logprobs.iter().take(k as usize).enumerate() {
            map.insert(id.to_string(), entry(id, lp, u32::try_from(j + 1).ok()));
        }
        Some(Value::Object(map))
    });
    Value::Array(positions.map(|p| p.unwrap_or(Value::Null)).collect())
}

/// Chat logprobs entries over `tokens`; `bytes` are the token's text's whatever its name.
pub(crate) fn chat_logprobs(names: TokenNames<'_>, tokens: &[TokenEvent]) -> Value {
    let entry = |id: TokenId, lp: f32| {
        let text = token_text(names.tokenizer, id);
        json!({"token": names.name(id), "logprob": lp, "bytes": text.as_bytes()})
    };
    let content: Vec<Value> = tokens
        .iter()
        .map(|t| {
            let mut e = entry(t.token, t.logprob);
            let top: Vec<Value> = t.top_logprobs.iter().map(|&(id, lp)| entry(id, lp)).collect();
            e["top_logprobs"] = Value::Array(top);
            e
        })
        .collect();
    json!({"content": content})
}

/// Routing of one choice for the response, if the job asked for it.
pub(crate) fn choice_routing(
    routing: Option<RoutingRequest>,
    meta: Option<&RoutingMeta>,
    output: &FinalOutput,
) -> Result<Option<Value>, ApiError> {
    match (routing, meta) {
        (Some(r), Some(meta)) => routing_wire::encode(output.routing.as_ref(), meta, r).map(Some),
        _ => Ok(None),
    }
}

/// SGLang's response-level `sglext`, for a request that asked SGLang's way: `routed_experts` is
/// base64 of the flat int32 rows of the first choice that has rows (SGLang returns one per
/// request), in the request's layer layout. `None` when not asked or no choice has rows.
pub(crate) fn sglext<'a>(
    routing: Option<RoutingRequest>,
    meta: Option<&RoutingMeta>,
    outputs: impl IntoIterator<Item = &'a FinalOutput>,
) -> Result<Option<Value>, ApiError> {
    let (Some(request), Some(meta)) = (routing, meta) else { return Ok(None) };
    if !request.sglext {
        return Ok(None);
    }
    let Some(rows) = outputs.into_iter().find_map(|o| o.routing.as_ref()) else { return Ok(None) };
    let (data, _) = routing_wire::encode_sglang(rows, meta, request.layers)?;
    Ok(Some(json!({"routed_experts": data})))
}

/// The response-level `routed_experts_meta`, if the job asked for routing.
pub(crate) fn routing_meta(job: &Job, meta: Option<&RoutingMeta>) -> Option<Value> {
    Some(routing_wire::meta_json(meta?, job.routing?))
}

/// Which OpenAI route a response is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Route {
    /// `/v1/completions`.
    Completions,
    /// `/v1/chat/completions`.
    Chat,
}

impl Route {
    /// The `object` of a whole response.
    pub(crate) fn object(self) -> &'static str {
        match self {
            Self::Completions => "text_completion",
            Self::Chat => "chat.completion",
        }
    }

    /// The `object` of a streamed chunk.
    pub(crate) fn chunk_object(self) -> &'static str {
        match self {
            Self::Completions => "text_completion",
            Self::Chat => "chat.completion.chunk",
        }
    }

    /// The prefix of response ids.
    pub(crate) fn id_prefix(self) -> &'static str {
        match self {
            Self::Completions => "cmpl",
            Self::Chat => "chatcmpl",
        }
    }
}

/// Sets SGLang's `weight_versions` (which weights sampled which output tokens:
/// `[{"version", "start", "end"}]`) and `weight_version` (the last of them) on `target`.
pub(crate) fn set_weight_versions(target: &mut Value, spans: &[WeightVersionSpan]) {
    let list =
        spans.iter().map(|s| json!({"version": &*s.version, "start": s.start, "end": s.end}));
    target["weight_versions"] = Value::Array(list.collect());
    target["weight_version"] = json!(spans.last().map(|s| &*s.version));
}

/// Identity fields of a response: id, creation time, model.
#[derive(Clone, Debug)]
pub(crate) struct Header {
    pub id: String,
    pub created: u64,
    pub model: String,
}

/// Builds the whole (non-streamed) response of an OpenAI route.
pub(crate) fn whole(
    route: Route,
    header: &Header,
    job: &Job,
    choices: &[ChoiceResult],
    tokenizer: &Tokenizer,
    meta: Option<&RoutingMeta>,
) -> Result<Value, ApiError> {
    let mut outputs = Vec::with_capacity(choices.len());
    let mut out_choices = Vec::with_capacity(choices.len());
    for (i, c) in choices.iter().enumerate() {
        let output = c.output(i)?;
        outputs.push(Some(output));
        let prompt = &job.requests[i / job.n.max(1)].prompt_token_ids;
        let mut called_tools = false;
        let mut choice = match route {
            Route::Completions => completion_choice(i, job, c, output, prompt, tokenizer),
            Route::Chat => {
                let mut message;
                let stopped = matches!(output.finish_reason, FinishReason::Stop { .. });
                (message, called_tools) =
                    chat_message(&job.tool_use, job.reasoning, &output.text, stopped);
                if !job.include_reasoning && message.get("reasoning").is_some() {
                    set_reasoning(&mut message, None);
                }
                let calls = message.get_mut("tool_calls").and_then(Value::as_array_mut);
                if let (true, Some(calls)) = (job.first_call_only, calls) {
                    calls.truncate(1);
                }
                if let Some(echoed) = job.echo.as_ref().and_then(|texts| texts.first()) {
                    // As vLLM: the echoed message, then the content (none read as empty).
                    let content = message["content"].as_str().unwrap_or_default();
                    message["content"] = json!(format!("{echoed}{content}"));
                }
                let names = job.names(tokenizer);
                let logprobs = job.logprobs.map(|_| chat_logprobs(names, &c.tokens));
                json!({"index": i, "message": message, "logprobs": logprobs})
            }
        };
        choice["finish_reason"] = match called_tools {
            true => json!("tool_calls"),
            false => json!(finish_reason(&output.finish_reason)),
        };
        choice["stop_reason"] = stop_reason(&output.finish_reason);
        if job.return_token_ids {
            choice["token_ids"] = json!(output.token_ids);
            choice["prompt_token_ids"] = json!(prompt);
        }
        if let Some(routing) = choice_routing(job.routing, meta, output)? {
            choice["routed_experts"] = routing;
        }
        out_choices.push(choice);
    }
    let mut body = json!({
        "id": header.id,
        "object": route.object(),
        "created": header.created,
        "model": header.model,
        "choices": out_choices,
        "usage": Usage::of(job, &outputs),
    });
    if route == Route::Chat && job.return_token_ids {
        body["prompt_token_ids"] = json!(job.requests[0].prompt_token_ids);
    }
    // vLLM puts a chat's prompt logprobs on the response: its choices share the prompt.
    if let (Route::Chat, Some(k), Some(first)) = (route, job.prompt_logprobs, outputs.first()) {
        let scores = first.and_then(|o| o.prompt_logprobs.as_deref());
        let prompt = &job.requests[0].prompt_token_ids;
        body["prompt_logprobs"] = prompt_logprobs_json(tokenizer, prompt, scores, k);
    }
    if let Some(m) = routing_meta(job, meta) {
        body["routed_experts_meta"] = m;
    }
    // SGLang's response-level `metadata`, from the first choice as SGLang takes it.
    if let Some(first) = outputs.first().copied().flatten() {
        set_weight_versions(&mut body["metadata"], &first.weight_versions);
    }
    if let Some(ext) = sglext(job.routing, meta, outputs.iter().flatten().copied())? {
        body["sglext"] = ext;
    }
    Ok(body)
}

/// A whole chat answer's message, and whether its `finish_reason` is `tool_calls`. With a
/// `reasoning` parser the thinking is split off into `reasoning` and `reasoning_content`
/// (`crate::reasoning`). What remains is read as `tools` says: calls parsed out of it (as the
/// server's vLLM parser reads them, `crate::tools`), the text before them the content; or, for a
/// forced choice, the calls it is, with empty content (a required list cut short stays content).
/// As vLLM answers, the finish reason is `tool_calls` when parsed calls were found, or a required
/// list was whole and the answer `stopped`; a named call keeps the answer's own.
fn chat_message(
    tools: &ToolUse,
    reasoning: Option<ReasoningParser>,
    text: &str,
    stopped: bool,
) -> (Value, bool) {
    let (thinking, answer) = match reasoning {
        Some(parser) => {
            let split = parser.split(text);
            (Some(split.reasoning), split.content)
        }
        None => (None, Some(text.to_owned())),
    };
    let answer_text = answer.as_deref().unwrap_or_default();
    let to_json = |calls: &[ToolCall]| -> Vec<Value> {
        calls.iter().map(ToolCall::to_message_json).collect()
    };
    let (mut message, called) = match tools {
        ToolUse::None => (json!({"role": "assistant", "content": answer}), false),
        ToolUse::Parsed(parser) => {
            let found = parser.extract(answer_text);
            let calls = to_json(&found.calls);
            let called = tools.finishes_with_calls(!calls.is_empty(), stopped);
            (json!({"role": "assistant", "content": found.content, "tool_calls": calls}), called)
        }
        forced => match forced.forced_calls(answer_text) {
            Some(calls) => {
                let called = forced.finishes_with_calls(true, stopped);
                (json!({"role": "assistant", "content": "", "tool_calls": to_json(&calls)}), called)
            }
            None => (json!({"role": "assistant", "content": answer, "tool_calls": []}), false),
        },
    };
    if let Some(thinking) = thinking {
        set_reasoning(&mut message, thinking);
    }
    (message, called)
}

/// Sets a chat message's (or delta's) reasoning under both names clients read it by: vLLM's
/// `reasoning` and SGLang's (and older vLLM's) `reasoning_content`.
pub(crate) fn set_reasoning(message: &mut Value, thinking: Option<String>) {
    message["reasoning"] = json!(thinking);
    message["reasoning_content"] = json!(thinking);
}

/// A whole completions choice: its text and logprobs, the prompt's first with `echo`, and vLLM's
/// `prompt_logprobs` when asked.
fn completion_choice(
    index: usize,
    job: &Job,
    c: &ChoiceResult,
    output: &FinalOutput,
    prompt: &[TokenId],
    tokenizer: &Tokenizer,
) -> Value {
    let scores = output.prompt_logprobs.as_deref();
    let echoed = job.echo.as_ref().and_then(|texts| texts.get(index / job.n.max(1)));
    let text = match echoed {
        Some(prompt_text) => format!("{prompt_text}{}", output.text),
        None => output.text.clone(),
    };
    let logprobs = job.logprobs.map(|k| {
        let generated = c.tokens.iter().map(Scored::from);
        match echoed {
            Some(_) => {
                let all = echoed_prompt(prompt, scores, k).chain(generated);
                legacy_logprobs(job.names(tokenizer), all, &mut 0)
            }
            None => legacy_logprobs(job.names(tokenizer), generated, &mut 0),
        }
    });
    let mut choice = json!({"index": index, "text": text, "logprobs": logprobs});
    if let Some(k) = job.prompt_logprobs {
        choice["prompt_logprobs"] = prompt_logprobs_json(tokenizer, prompt, scores, k);
    }
    choice
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tools::ToolCallParser;

    #[test]
    fn a_chat_message_carries_the_calls_read_from_its_text() {
        let text = "Checking.<tool_call>{\"name\": \"f\", \"arguments\": {\"x\": 1}}</tool_call>";
        let (message, called) =
            chat_message(&ToolUse::Parsed(ToolCallParser::Hermes), None, text, true);
        assert!(called);
        assert_eq!(message["role"], "assistant");
        assert_eq!(message["content"], "Checking.");
        let calls = message["tool_calls"].as_array().expect("tool_calls");
        assert_eq!(calls.len(), 1);
        assert_eq!(calls[0]["function"], json!({"name": "f", "arguments": "{\"x\": 1}"}));
        // Not read: the text as it is.
        let (plain, called) = chat_message(&ToolUse::None, None, text, true);
        assert!(!called);
        assert_eq!(plain, json!({"role": "assistant", "content": text}));
        // Read, without calls.
        let (none, called) =
            chat_message(&ToolUse::Parsed(ToolCallParser::Hermes), None, "just text", true);
        assert!(!called);
        assert_eq!(none, json!({"role": "assistant", "content": "just text", "tool_calls": []}));
    }

    #[test]
    fn a_chat_message_splits_its_reasoning_off_before_reading_calls() {
        let qwen3 = Some(ReasoningParser::Qwen3);
        let text =
            "<think>use f</think>\n\n<tool_call>{\"name\": \"f\", \"arguments\": {}}</tool_call>";
        let (message, called) =
            chat_message(&ToolUse::Parsed(ToolCallParser::Hermes), qwen3, text, true);
        assert!(called);
        assert_eq!(
            (&message["reasoning"], &message["reasoning_content"]),
            (&json!("use f"), &json!("use f"))
        );
        assert_eq!(message["content"], "\n\n");
        assert_eq!(message["tool_calls"][0]["function"]["name"], "f");
        let (plain, _) = chat_message(&ToolUse::None, qwen3, "<think>a</think>", true);
        let want = json!({"role": "assistant", "content": null, "reasoning": "a",
                          "reasoning_content": "a"});
        assert_eq!(plain, want);
        let (none, _) = chat_message(&ToolUse::None, qwen3, "no thinking", true);
        let want = json!({"role": "assistant", "content": "no thinking", "reasoning": null,
                   "reasoning_content": null});
        assert_eq!(none, want);
    }

    #[test]
    fn a_forced_choice_is_its_calls_with_vllms_finish_reason() {
        let named = ToolUse::Named("get".into());
        let (message, called) = chat_message(&named, None, "{\"city\":  \"Paris\"}", true);
        assert!(!called, "a named call keeps the answer's finish reason");
        assert_eq!(message["content"], "");
        let function = &message["tool_calls"][0]["function"];
        assert_eq!(*function, json!({"name": "get", "arguments": "{\"city\":  \"Paris\"}"}));
        let text =
            r#"[{"name":"a","parameters":{"x":1,"y":[1,2]}}, {"name": "b", "parameters": {}}]"#;
        let (message, called) = chat_message(&ToolUse::Required, None, text, true);
        assert!(called);
        assert_eq!(message["content"], "");
        let calls = message["tool_calls"].as_array().unwrap();
        let functions: Vec<&Value> = calls.iter().map(|c| &c["function"]).collect();
        assert_eq!(
            functions,
            [
                &json!({"name": "a", "arguments": "{\"x\": 1, \"y\": [1, 2]}"}),
                &json!({"name": "b", "arguments": "{}"})
            ]
        );
        assert!(calls[0]["id"].as_str().unwrap().starts_with("chatcmpl-tool-"));
        let (_, called) = chat_message(&ToolUse::Required, None, text, false);
        assert!(!called, "cut after the list: the answer's own finish reason");
        let cut = "[{\"name\":\"a\",\"par";
        let (message, called) = chat_message(&ToolUse::Required, None, cut, false);
        assert!(!called);
        assert_eq!(message, json!({"role": "assistant", "content": cut, "tool_calls": []}));
    }
}
