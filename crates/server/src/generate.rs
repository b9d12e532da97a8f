//! `POST /generate`: the token-in, SGLang-shaped route.
//!
//! One prompt (`text` or `input_ids`) with one continuation answers one object; a batch (a list
//! of texts or of token-id lists) or `sampling_params.n > 1` answers a list with one object per
//! continuation, prompt-major, as SGLang does. Routing, when returned, is base64 of the flat
//! little-endian int32 array with its `[rows, L, K]` shape beside it (decoder-layer layout unless
//! the request asks for `routed_experts_layers: "moe"`). Logprobs are SGLang's
//! `[logprob, token_id, text-or-null]` triples. Streamed, each event is one continuation's
//! response so far (cumulative `text` and `output_ids`; in a list answer, with its `index` in the
//! list), and its last one carries the finish reason and the routing.

use std::sync::Arc;

use actix_web::{HttpResponse, web};
use futures_util::stream::{self, StreamExt};
use routed_model::Tokenizer;
use routed_runtime::{FinalOutput, RequestEvent, TokenEvent, WeightVersionSpan, WeightVersions};
use routed_types::{FinishReason, RoutingMeta, StopMatch, TokenId};
use serde_json::{Value, json};

use crate::AppState;
use crate::body::{JsonBody, prepare};
use crate::detok::Detokenizer;
use crate::error::ApiError;
use crate::response::{set_weight_versions, token_text};
use crate::routing_wire::encode_sglang;
use crate::run::{self, Merged};
use crate::stream::{sse_done, sse_event};
use crate::validate::{self, GenerateJob};

/// SGLang's `finish_reason` object.
fn finish_json(reason: Option<&FinishReason>) -> Value {
    match reason {
        None => Value::Null,
        Some(FinishReason::Stop { matched }) => {
            let matched = match matched {
                Some(StopMatch::Token(id)) => json!(id),
                Some(StopMatch::Text(s) | StopMatch::Regex(s)) => json!(s),
                None => Value::Null,
            };
            json!({"type": "stop", "matched": matched})
        }
        Some(FinishReason::Length) => json!({"type": "length", "matched": null}),
        Some(FinishReason::Abort) => json!({"type": "abort", "matched": null}),
    }
}

/// The body of one continuation's object (or of one streamed event).
struct Body<'a> {
    id: &'a str,
    request: &'a GenerateJob,
    /// The continuation's prompt.
    prompt: &'a [TokenId],
    /// The tokens whose logprobs every reported position carries (`token_ids_logprob`).
    logprob_ids: &'a [TokenId],
    tokenizer: &'a Tokenizer,
    text: &'a str,
    tokens: &'a [TokenEvent],
    output: Option<&'a FinalOutput>,
    /// Which weights sampled `tokens`.
    weight_versions: &'a [WeightVersionSpan],
}

/// SGLang's logprob triple `[logprob, token_id, text-or-null]`.
fn triple(tokenizer: &Tokenizer, with_text: bool, id: TokenId, logprob: f32) -> Value {
    let text = with_text.then(|| token_text(tokenizer, id));
    json!([logprob, id, text])
}

/// The triples of the tokens `token_ids_logprob` names, in its order, with their logprobs.
fn id_triples(b: &Body<'_>, logprobs: &[f32]) -> Value {
    let with_text = b.request.text_in_logprobs;
    let pairs = b.logprob_ids.iter().zip(logprobs);
    Value::Array(pairs.map(|(&id, &lp)| triple(b.tokenizer, with_text, id, lp)).collect())
}

/// `output_token_logprobs` and, with `top_logprobs_num`, `output_top_logprobs`; with
/// `token_ids_logprob`, `output_token_ids_logprobs`.
fn add_logprobs(b: &Body<'_>, meta_info: &mut Value) {
    let with_text = b.request.text_in_logprobs;
    let lps = b.tokens.iter().map(|t| triple(b.tokenizer, with_text, t.token, t.logprob));
    meta_info["output_token_logprobs"] = Value::Array(lps.collect());
    if b.request.top_logprobs_num.is_some() {
        let tops = b.tokens.iter().map(|t| {
            let top = t.top_logprobs.iter().map(|&(id, lp)| triple(b.tokenizer, with_text, id, lp));
            Value::Array(top.collect())
        });
        meta_info["output_top_logprobs"] = Value::Array(tops.collect());
    }
    if !b.logprob_ids.is_empty() {
        let named = b.tokens.iter().map(|t| id_triples(b, &t.token_id_logprobs));
        meta_info["output_token_ids_logprobs"] = Value::Array(named.collect());
    }
    if let (Some(start), Some(output)) = (b.request.logprob_start_len, b.output) {
        add_input_logprobs(b, start, output, meta_info);
    }
}

/// `input_token_logprobs` (and, with `top_logprobs_num`, `input_top_logprobs`; with
/// `token_ids_logprob`, `input_token_ids_logprobs`) for the prompt tokens from `start` on, as SGLang returns them: the first entry's logprob is `null` whatever
/// `start` is (SGLang pads it so), then each prompt token's logprob given the tokens before it.
/// A position the engine did not score (an aborted request) has `null` too.
fn add_input_logprobs(b: &Body<'_>, start: usize, output: &FinalOutput, meta_info: &mut Value) {
    let with_text = b.request.text_in_logprobs;
    let prompt = b.prompt;
    let scores = output.prompt_logprobs.as_deref().unwrap_or_default();
    let score = |p: usize| {
        let s = p.checked_sub(1).and_then(|i| scores.get(i)).filter(|s| s.token == prompt[p]);
        s.filter(|_| p > start)
    };
    let positions = start..prompt.len();
    let lps = positions.clone().map(|p| {
        let text = with_text.then(|| token_text(b.tokenizer, prompt[p]));
        json!([score(p).map(|s| s.logprob), prompt[p], text])
    });
    meta_info["input_token_logprobs"] = Value::Array(lps.collect());
    if b.request.top_logprobs_num.is_some() {
        let tops = positions.map(|p| match score(p) {
            Some(s) => {
                let top =
                    s.top_logprobs.iter().map(|&(id, lp)| triple(b.tokenizer, with_text, id, lp));
                Value::Array(top.collect())
            }
            None => Value::Null,
        });
        meta_info["input_top_logprobs"] = Value::Array(tops.collect());
    }
    if !b.logprob_ids.is_empty() {
        let named = (start..prompt.len()).map(|p| match score(p) {
            Some(s) => id_triples(b, &s.token_id_logprobs),
            None => Value::Null,
        });
        meta_info["input_token_ids_logprobs"] = Value::Array(named.collect());
    }
}

fn body_json(b: Body<'_>, meta: Option<&RoutingMeta>) -> Result<Value, ApiError> {
    let job = &b.request.job;
    let output_ids: Vec<u32> = b.tokens.iter().map(|t| t.token).collect();
    let prompt_tokens = b.prompt.len();
    let mut meta_info = json!({
        "id": b.id,
        "prompt_tokens": prompt_tokens,
        "completion_tokens": output_ids.len(),
        "cached_tokens": b.output.map_or(0, |o| o.num_cached_tokens),
        "finish_reason": finish_json(b.output.map(|o| &o.finish_reason)),
    });
    set_weight_versions(&mut meta_info, b.weight_versions);
    if job.logprobs.is_some() {
        add_logprobs(&b, &mut meta_info);
    }
    if let (Some(output), Some(routing), Some(meta)) = (b.output, job.routing, meta) {
        match &output.routing {
            Some(rows) => {
                let (data, shape) = encode_sglang(rows, meta, routing.layers)?;
                meta_info["routed_experts"] = json!(data);
                meta_info["routed_experts_shape"] = json!(shape);
            }
            None => {
                meta_info["routed_experts"] = Value::Null;
                meta_info["routed_experts_shape"] = Value::Null;
            }
        }
    }
    Ok(json!({"text": b.text, "output_ids": output_ids, "meta_info": meta_info}))
}

/// The id of each prompt's response: the client's `rid`s, refused while one is in flight, or
/// fresh ones.
fn response_ids(state: &AppState, request: &GenerateJob) -> Result<Vec<String>, ApiError> {
    let Some(rids) = &request.rids else {
        return Ok(request.job.requests.iter().map(|_| state.new_id("gen")).collect());
    };
    match rids.iter().find(|rid| state.registry().contains_response(rid)) {
        Some(rid) => {
            Err(ApiError::invalid("rid", format!("a request with rid {rid:?} is in flight")))
        }
        None => Ok(rids.clone()),
    }
}

/// The `meta_info.id` of continuation `index` of a prompt whose response id is `id`: the id
/// itself, suffixed with the index when the prompt has `n > 1` continuations (which run as one
/// engine request: aborting `id` ends them all).
fn choice_id(id: &str, index: usize, n: usize) -> String {
    if n > 1 { format!("{id}-{index}") } else { id.to_owned() }
}

/// The response id and index a suffixed [`choice_id`] was made from, if `id` has that form.
pub(crate) fn split_choice_id(id: &str) -> Option<(&str, usize)> {
    let (base, suffix) = id.rsplit_once('-')?;
    let index: usize = suffix.parse().ok()?;
    // Exactly what `choice_id` writes: no sign, no leading zeros.
    (index.to_string() == suffix).then_some((base, index))
}

/// `POST /generate`.
pub(crate) async fn generate(
    state: web::Data<AppState>,
    body: JsonBody,
) -> Result<HttpResponse, ApiError> {
    let request = prepare(&state, body, validate::generate).await?;
    let ids = response_ids(&state, &request)?;
    let response_ids = ids.iter().map(|id| Arc::from(id.as_str())).collect();
    let job = &request.job;
    let merged =
        run::submit_each(state.handle(), state.registry(), job, "/generate", response_ids).await?;
    let meta = state.info().routing.clone();
    if job.stream.is_some() {
        let num_choices = job.requests.len() * job.n;
        let body = SglStream {
            ids,
            tokenizer: Arc::clone(state.tokenizer()),
            meta,
            merged: Some(merged),
            choices: (0..num_choices).map(|_| ChoiceState::default()).collect(),
            request,
            done: false,
        };
        return Ok(HttpResponse::Ok()
            .content_type("text/event-stream")
            .insert_header(("Cache-Control", "no-cache"))
            .streaming(body.into_body()));
    }
    let choices = run::collect(merged, job).await?;
    let mut bodies = Vec::with_capacity(choices.len());
    for (i, choice) in choices.iter().enumerate() {
        let (prompt, index) = (i / job.n, i % job.n);
        let output = choice.output(i)?;
        let body = Body {
            id: &choice_id(&ids[prompt], index, job.n),
            request: &request,
            prompt: &job.requests[prompt].prompt_token_ids,
            logprob_ids: &job.requests[prompt].sampling.logprob_token_ids,
            tokenizer: state.tokenizer(),
            text: &output.text,
            tokens: &choice.tokens,
            output: Some(output),
            weight_versions: &output.weight_versions,
        };
        bodies.push(body_json(body, meta.as_ref())?);
    }
    if request.batch {
        return Ok(HttpResponse::Ok().json(bodies));
    }
    let body = bodies.pop().ok_or_else(|| ApiError::Internal("no continuation ran".into()))?;
    Ok(HttpResponse::Ok().json(body))
}

/// What one continuation of a streamed `/generate` has produced so far.
#[derive(Default)]
struct ChoiceState {
    detok: Detokenizer,
    text: String,
    tokens: Vec<TokenEvent>,
    versions: WeightVersions,
    finished: bool,
}

/// The streamed `/generate` body.
struct SglStream {
    /// Each prompt's response id.
    ids: Vec<String>,
    request: GenerateJob,
    tokenizer: Arc<Tokenizer>,
    meta: Option<RoutingMeta>,
    merged: Option<Merged>,
    /// Prompt-major, as the list answer orders them.
    choices: Vec<ChoiceState>,
    done: bool,
}

impl SglStream {
    fn into_body(
        self,
    ) -> impl futures_util::Stream<Item = Result<web::Bytes, std::convert::Infallible>> + 'static
    {
        stream::unfold(self, |mut s| async move {
            let next = s.next_event().await?;
            Some((Ok(next), s))
        })
    }

    async fn next_event(&mut self) -> Option<web::Bytes> {
        let n = self.request.job.n;
        loop {
            let Some(merged) = self.merged.as_mut() else {
                return (!std::mem::replace(&mut self.done, true)).then(sse_done);
            };
            let result = match merged.next().await {
                Some((prompt, RequestEvent::Token(t))) => {
                    let i = run::choice_index(prompt, t.index, n);
                    let Some(c) = self.choices.get_mut(i) else { continue };
                    let delta =
                        c.detok.push(&self.tokenizer, t.token, self.request.job.sampling(prompt));
                    c.versions.push(&t.weight_version);
                    c.tokens.push(t);
                    if delta.is_empty() {
                        continue;
                    }
                    c.text.push_str(&delta);
                    self.event(i, None)
                }
                Some((prompt, RequestEvent::Finished(out))) => {
                    let i = run::choice_index(prompt, out.index, n);
                    let Some(c) = self.choices.get_mut(i) else { continue };
                    c.text.push_str(&c.detok.finish(&out.text));
                    c.finished = true;
                    if self.choices.iter().all(|c| c.finished) {
                        self.merged = None;
                    }
                    self.event(i, Some(&out))
                }
                Some((_, RequestEvent::Error(e))) => Err(e.into()),
                None => Err(ApiError::Internal(
                    "the engine ended the request without a final output".into(),
                )),
            };
            return Some(result.unwrap_or_else(|err| {
                self.merged = None;
                sse_event(&err.body())
            }));
        }
    }

    /// Continuation `i`'s response so far; in a list answer, with its `index` in the list.
    fn event(&self, i: usize, output: Option<&FinalOutput>) -> Result<web::Bytes, ApiError> {
        let job = &self.request.job;
        let (prompt, index) = (i / job.n, i % job.n);
        let c = &self.choices[i];
        let body = Body {
            id: &choice_id(&self.ids[prompt], index, job.n),
            request: &self.request,
            prompt: &job.requests[prompt].prompt_token_ids,
            logprob_ids: &job.requests[prompt].sampling.logprob_token_ids,
            tokenizer: &self.tokenizer,
            text: &c.text,
            tokens: &c.tokens,
            output,
            weight_versions: output.map_or(c.versions.spans(), |o| &o.weight_versions),
        };
        let mut event = body_json(body, self.meta.as_ref())?;
        if self.request.batch {
            event["index"] = json!(i);
        }
        Ok(sse_event(&event))
    }
}
