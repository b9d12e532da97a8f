//! Server-sent events for the OpenAI routes.
//!
//! The body is a stream over the engine's merged events: `data: {chunk}` per token (text deltas
//! from the [`Detokenizer`]), a final chunk per choice carrying its `finish_reason` and its
//! routing (the first such chunk also carries `routed_experts_meta`), SGLang's `sglext` chunk
//! when the request asked SGLang's way, an optional usage chunk, then `data: [DONE]`. When
//! routing was requested every chunk of a choice carries its `routed_experts` key, `null` until
//! the final one. An error ends the stream with one `data: {"error": ...}` event and
//! `[DONE]`. Dropping the body (the client went away) drops the engine streams, which aborts
//! their requests.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::sync::Arc;

use actix_web::web::Bytes;
use futures_util::stream::{self, Stream, StreamExt};
use routed_model::Tokenizer;
use routed_runtime::{FinalOutput, RequestEvent, TokenEvent};
use routed_types::{FinishReason, RoutingMeta};
use serde::Serialize;
use serde_json::{Value, json};

use crate::detok::Detokenizer;
use crate::error::ApiError;
use crate::reasoning::ReasoningStream;
use crate::response::{
    Header, Route, Usage, chat_logprobs, choice_routing, completion_logprobs, echoed_prompt,
    finish_reason, legacy_logprobs, routing_meta, sglext, stop_reason,
};
use crate::run::{Merged, choice_index};
use crate::tools::{CallDelta, ForcedStream, ToolCallParser, ToolStream, ToolUse};
use crate::validate::Job;

/// One SSE event.
pub(crate) fn sse_event(payload: &impl Serialize) -> Bytes {
    let json = serde_json::to_string(payload).unwrap_or_else(|e| {
        format!(r#"{{"error":{{"message":"cannot serialise a chunk: {e}","type":"internal_error","param":null,"code":"internal_error"}}}}"#)
    });
    Bytes::from(format!("data: {json}\n\n"))
}

/// The closing event.
pub(crate) fn sse_done() -> Bytes {
    Bytes::from_static(b"data: [DONE]\n\n")
}

/// The streamed state of one choice.
#[derive(Debug, Default)]
struct ChoiceState {
    detok: Detokenizer,
    text_offset: usize,
    started: bool,
    /// Tokens sent (or held) so far.
    num_tokens: usize,
    output: Option<Box<FinalOutput>>,
    /// Tokens held back until the choice's echoed prompt can be sent: with `echo` and
    /// `logprobs`, the prompt's logprobs (which come with the final output) go out first.
    held: Option<Vec<TokenEvent>>,
    /// The text split into reasoning and the rest, when the chat splits off its reasoning.
    reasoning: Option<ReasoningStream>,
    /// The text split into content and tool calls, when the chat reads tool calls.
    tools: Option<ToolStream>,
    /// The answer read as calls, when a forced `tool_choice` makes it calls.
    forced: Option<ForcedStream>,
    /// Only the first call goes out (`parallel_tool_calls: false`).
    first_call_only: bool,
    /// The reasoning split off goes out (`include_reasoning`).
    include_reasoning: bool,
}

/// What one choice sends for some of its text.
#[derive(Debug, Default)]
struct ChatDelta {
    /// A chat's thinking.
    reasoning: String,
    /// The text (a completion's all of it).
    content: String,
    /// A chat's tool calls, as the delta's `tool_calls` entries.
    calls: Vec<Value>,
}

impl ChoiceState {
    /// Splits the detokenized `text` as the chat reads it: reasoning off first, then tool calls
    /// out of the rest. `end`: the choice's last text, which flushes what was held back.
    fn split(&mut self, text: String, end: bool) -> ChatDelta {
        let mut delta = self.split_all(text, end);
        if self.first_call_only {
            delta.calls.retain(|call| call["index"] == 0);
        }
        if !self.include_reasoning {
            delta.reasoning.clear();
        }
        delta
    }

    /// [`Self::split`] with every call.
    fn split_all(&mut self, text: String, end: bool) -> ChatDelta {
        let (reasoning, content) = match &mut self.reasoning {
            Some(r) => {
                let d = if end { r.finish(&text) } else { r.push(&text) };
                (d.reasoning, d.content)
            }
            None => (String::new(), text),
        };
        if let Some(forced) = &mut self.forced {
            let (content, calls) = forced.push(&content, end);
            return ChatDelta { reasoning, content, calls };
        }
        match &mut self.tools {
            Some(t) => {
                let d = if end { t.finish(&content) } else { t.push(&content) };
                let calls = d.calls.iter().map(CallDelta::to_json);
                ChatDelta { reasoning, content: d.content, calls: calls.collect() }
            }
            None => ChatDelta { reasoning, content, calls: Vec::new() },
        }
    }
}

/// Everything the SSE body needs while it runs.
pub(crate) struct SseState {
    route: Route,
    header: Header,
    job: Job,
    tokenizer: Arc<Tokenizer>,
    meta: Option<RoutingMeta>,
    merged: Option<Merged>,
    choices: Vec<ChoiceState>,
    meta_sent: bool,
    pending: VecDeque<Bytes>,
}

impl SseState {
    /// Prepares the stream; chat streams open with one role chunk per choice.
    pub(crate) fn new(
        route: Route,
        header: Header,
        job: Job,
        tokenizer: Arc<Tokenizer>,
        meta: Option<RoutingMeta>,
        merged: Merged,
    ) -> Self {
        let num_choices = job.requests.len() * job.n;
        let chat = route == Route::Chat;
        let parser = match job.tool_use {
            ToolUse::Parsed(parser) if chat => Some(parser),
            _ => None,
        };
        let forced = Some(job.tool_use.clone()).filter(|t| chat && t.is_forced());
        let reasoning = job.reasoning.filter(|_| route == Route::Chat);
        let (first_call_only, include_reasoning) = (job.first_call_only, job.include_reasoning);
        let mut state = Self {
            route,
            header,
            job,
            tokenizer,
            meta,
            merged: Some(merged),
            choices: (0..num_choices)
                .map(|_| ChoiceState {
                    reasoning: reasoning.map(ReasoningStream::new),
                    tools: parser.map(ToolCallParser::stream),
                    forced: forced.clone().map(ForcedStream::new),
                    first_call_only,
                    include_reasoning,
                    ..ChoiceState::default()
                })
                .collect(),
            meta_sent: false,
            pending: VecDeque::new(),
        };
        if route == Route::Chat {
            for i in 0..num_choices {
                let delta = json!({"role": "assistant", "content": ""});
                let choice =
                    json!({"index": i, "delta": delta, "logprobs": null, "finish_reason": null});
                let chunk = state.chunk(i, choice);
                state.pending.push_back(sse_event(&chunk));
            }
            // As vLLM: the echoed message goes out in a chunk of its own after the role's.
            let echoed = state.job.echo.as_ref().and_then(|texts| texts.first()).cloned();
            let echoed = echoed.filter(|text| !text.is_empty());
            for i in (0..num_choices).filter(|_| echoed.is_some()) {
                let delta = json!({"content": echoed});
                let choice =
                    json!({"index": i, "delta": delta, "logprobs": null, "finish_reason": null});
                let chunk = state.chunk(i, choice);
                state.pending.push_back(sse_event(&chunk));
            }
        }
        if route == Route::Completions && state.job.echo.is_some() {
            for i in 0..num_choices {
                match state.job.logprobs {
                    None => {
                        let echo = state.echo_chunk(i, None);
                        state.pending.push_back(echo);
                    }
                    Some(_) => state.choices[i].held = Some(Vec::new()),
                }
            }
        }
        state
    }

    /// The chunk that echoes choice `i`'s prompt: its text, and with `logprobs` its tokens'
    /// logprobs from `output` (the first token has none).
    fn echo_chunk(&mut self, i: usize, output: Option<&FinalOutput>) -> Bytes {
        let prompt_index = i / self.job.n.max(1);
        let text = self.job.echo.as_ref().and_then(|t| t.get(prompt_index)).cloned();
        let logprobs = self.job.logprobs.map(|k| {
            let prompt = &self.job.requests[prompt_index].prompt_token_ids;
            let scores = output.and_then(|o| o.prompt_logprobs.as_deref());
            let offset = &mut self.choices[i].text_offset;
            legacy_logprobs(
                self.job.names(&self.tokenizer),
                echoed_prompt(prompt, scores, k),
                offset,
            )
        });
        let mut choice = json!({"index": i, "text": text.unwrap_or_default(),
                                "logprobs": logprobs, "finish_reason": null});
        if self.job.return_token_ids {
            choice["token_ids"] = json!([]);
        }
        sse_event(&self.chunk(i, choice))
    }

    /// The SSE body.
    pub(crate) fn into_body(self) -> impl Stream<Item = Result<Bytes, Infallible>> + 'static {
        stream::unfold(self, |mut state| async move {
            let next = state.next_event().await?;
            Some((Ok(next), state))
        })
    }

    async fn next_event(&mut self) -> Option<Bytes> {
        loop {
            if let Some(bytes) = self.pending.pop_front() {
                return Some(bytes);
            }
            let merged = self.merged.as_mut()?;
            match merged.next().await {
                Some((prompt, RequestEvent::Token(t))) => self.on_token(prompt, t),
                Some((prompt, RequestEvent::Finished(out))) => {
                    if let Err(e) = self.on_finished(prompt, out) {
                        self.fail(e);
                    }
                }
                Some((_, RequestEvent::Error(e))) => self.fail(e.into()),
                None => self.on_end(),
            }
        }
    }

    /// Ends the stream with an error event; dropping the engine streams aborts the rest.
    fn fail(&mut self, err: ApiError) {
        self.merged = None;
        self.pending.push_back(sse_event(&err.body()));
        self.pending.push_back(sse_done());
    }

    fn on_end(&mut self) {
        self.merged = None;
        if let Some(i) = self.choices.iter().position(|c| c.output.is_none()) {
            let err =
                ApiError::Internal(format!("the engine ended choice {i} without a final output"));
            self.pending.push_back(sse_event(&err.body()));
            self.pending.push_back(sse_done());
            return;
        }
        // SGLang sends its extension in a chunk of its own once every choice has ended.
        let outputs = self.choices.iter().filter_map(|c| c.output.as_deref());
        match sglext(self.job.routing, self.meta.as_ref(), outputs) {
            Ok(Some(ext)) => {
                let mut chunk = self.envelope();
                chunk["choices"] = json!([]);
                chunk["sglext"] = ext;
                if self.job.stream == Some(true) {
                    chunk["usage"] = Value::Null;
                }
                self.pending.push_back(sse_event(&chunk));
            }
            Ok(None) => {}
            Err(err) => {
                self.pending.push_back(sse_event(&err.body()));
                self.pending.push_back(sse_done());
                return;
            }
        }
        if self.job.stream == Some(true) {
            let outputs: Vec<Option<&FinalOutput>> =
                self.choices.iter().map(|c| c.output.as_deref()).collect();
            let mut chunk = self.envelope();
            chunk["choices"] = json!([]);
            chunk["usage"] = json!(Usage::of(&self.job, &outputs));
            self.pending.push_back(sse_event(&chunk));
        }
        self.pending.push_back(sse_done());
    }

    /// The fields every chunk starts with.
    fn envelope(&self) -> Value {
        json!({
            "id": self.header.id,
            "object": self.route.chunk_object(),
            "created": self.header.created,
            "model": self.header.model,
        })
    }

    /// Wraps one choice into a chunk; the choice's first chunk carries its prompt ids when
    /// asked. With routing requested, a choice that has not ended carries `routed_experts: null`.
    fn chunk(&mut self, i: usize, mut choice: Value) -> Value {
        if self.job.routing.is_some() && choice.get("routed_experts").is_none() {
            choice["routed_experts"] = Value::Null;
        }
        let first = !std::mem::replace(&mut self.choices[i].started, true);
        let mut chunk = self.envelope();
        if first && self.job.return_token_ids {
            let prompt = &self.job.requests[i / self.job.n.max(1)].prompt_token_ids;
            match self.route {
                Route::Completions => choice["prompt_token_ids"] = json!(prompt),
                Route::Chat => chunk["prompt_token_ids"] = json!(prompt),
            }
        }
        chunk["choices"] = json!([choice]);
        if self.job.continuous_usage {
            // vLLM's continuous usage: the choice's prompt and its tokens so far.
            let prompt = self.job.requests[i / self.job.n.max(1)].prompt_token_ids.len();
            let completion = self.choices[i].num_tokens;
            chunk["usage"] = json!({"prompt_tokens": prompt, "completion_tokens": completion,
                                    "total_tokens": prompt + completion});
        } else if self.job.stream == Some(true) {
            chunk["usage"] = Value::Null;
        }
        chunk
    }

    /// The route-specific part of a choice: text delta (and a chat's reasoning and tool calls)
    /// and logprobs.
    fn choice_body(&mut self, i: usize, delta: ChatDelta, tokens: &[TokenEvent]) -> Value {
        let ChatDelta { reasoning, content: text, calls } = delta;
        match self.route {
            Route::Completions => {
                let logprobs = self.job.logprobs.map(|_| {
                    let names = self.job.names(&self.tokenizer);
                    completion_logprobs(names, tokens, &mut self.choices[i].text_offset)
                });
                json!({"index": i, "text": text, "logprobs": logprobs})
            }
            Route::Chat => {
                let names = self.job.names(&self.tokenizer);
                let logprobs = self.job.logprobs.map(|_| chat_logprobs(names, tokens));
                // `content` is always there unless the delta carries reasoning or calls only.
                let mut delta = serde_json::Map::new();
                if !reasoning.is_empty() {
                    // Under both names clients read it by (`response::set_reasoning`).
                    delta.insert("reasoning".into(), json!(reasoning));
                    delta.insert("reasoning_content".into(), json!(reasoning));
                }
                if !text.is_empty() || (reasoning.is_empty() && calls.is_empty()) {
                    delta.insert("content".into(), json!(text));
                }
                if !calls.is_empty() {
                    delta.insert("tool_calls".into(), calls.into());
                }
                json!({"index": i, "delta": delta, "logprobs": logprobs})
            }
        }
    }

    fn on_token(&mut self, prompt: usize, t: TokenEvent) {
        let i = choice_index(prompt, t.index, self.job.n);
        let Some(state) = self.choices.get_mut(i) else { return };
        if let Some(held) = state.held.as_mut() {
            held.push(t);
            return;
        }
        state.num_tokens += 1;
        let text = state.detok.push(&self.tokenizer, t.token, self.job.sampling(prompt));
        let delta = state.split(text, false);
        let nothing =
            delta.reasoning.is_empty() && delta.content.is_empty() && delta.calls.is_empty();
        if nothing && self.job.logprobs.is_none() && !self.job.return_token_ids {
            return;
        }
        let mut choice = self.choice_body(i, delta, std::slice::from_ref(&t));
        choice["finish_reason"] = Value::Null;
        if self.job.return_token_ids {
            choice["token_ids"] = json!([t.token]);
        }
        let chunk = self.chunk(i, choice);
        self.pending.push_back(sse_event(&chunk));
    }

    fn on_finished(&mut self, prompt: usize, out: Box<FinalOutput>) -> Result<(), ApiError> {
        let i = choice_index(prompt, out.index, self.job.n);
        let Some(state) = self.choices.get_mut(i) else { return Ok(()) };
        if let Some(held) = state.held.take() {
            let echo = self.echo_chunk(i, Some(&out));
            self.pending.push_back(echo);
            for t in held {
                self.on_token(prompt, t);
            }
        }
        let state = &mut self.choices[i];
        let rest = state.detok.finish(&out.text);
        let delta = state.split(rest, true);
        // As the whole answer's.
        let stopped = matches!(out.finish_reason, FinishReason::Stop { .. });
        let made_calls = state.tools.as_ref().is_some_and(|t| t.num_calls() > 0)
            || (self.job.tool_use.is_forced() && !delta.calls.is_empty());
        let called_tools = self.job.tool_use.finishes_with_calls(made_calls, stopped);
        let mut choice = self.choice_body(i, delta, &[]);
        choice["logprobs"] = Value::Null;
        choice["finish_reason"] = match called_tools {
            true => json!("tool_calls"),
            false => json!(finish_reason(&out.finish_reason)),
        };
        choice["stop_reason"] = stop_reason(&out.finish_reason);
        if self.job.return_token_ids {
            choice["token_ids"] = json!([]);
        }
        if let Some(routing) = choice_routing(self.job.routing, self.meta.as_ref(), &out)? {
            choice["routed_experts"] = routing;
        }
        let mut chunk_meta = None;
        if !self.meta_sent {
            chunk_meta = routing_meta(&self.job, self.meta.as_ref());
            self.meta_sent = chunk_meta.is_some();
        }
        self.choices[i].output = Some(out);
        let mut chunk = self.chunk(i, choice);
        if let Some(meta) = chunk_meta {
            chunk["routed_experts_meta"] = meta;
        }
        self.pending.push_back(sse_event(&chunk));
        Ok(())
    }
}
