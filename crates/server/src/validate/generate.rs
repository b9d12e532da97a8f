//! `/generate` bodies (SGLang names) to engine requests.

use std::borrow::Cow;
use std::sync::Arc;

use routed_types::{ResponseFormat, SamplingParams, TokenId, check_num_logprobs};
use serde_json::Value;

use super::grammar::grammar_of;
use super::prompt::PromptInput;
use super::regex::regex_of;
use super::sampling::{SamplingFields, sampling, schema_of};
use super::structural_tag::structural_tag_of;
use super::{
    BatchNames, Job, WireNames, cache_namespace, check_batch, check_request, is_neutral,
    refuse_given, request,
};
use crate::AppState;
use crate::error::ApiError;
use crate::routing_wire::{self, RoutingFields};
use crate::tools::ToolUse;
use crate::wire::{GenerateBody, SamplingParamsField, SglSamplingParams, SglUnservedFields, parse};

/// A validated `/generate` request: the job, and how its logprobs are shaped.
#[derive(Clone, Debug)]
pub(crate) struct GenerateJob {
    /// What runs: one engine request per prompt, each sampling `n` continuations.
    pub job: Job,
    /// Top alternatives per sampled token (`output_top_logprobs`), when asked with logprobs.
    pub top_logprobs_num: Option<u32>,
    /// Token texts in the logprob triples instead of `null`.
    pub text_in_logprobs: bool,
    /// The first prompt position of `input_token_logprobs`, when prompt logprobs were asked for.
    pub logprob_start_len: Option<usize>,
    /// The client's ids, one per prompt.
    pub rids: Option<Vec<String>>,
    /// The answer is a list with one object per continuation, prompt-major, as SGLang answers a
    /// batch of prompts or `n > 1`; else it is the one continuation's object.
    pub batch: bool,
}

/// Refuses SGLang's fields that are parsed but not served unless they hold their neutral value:
/// an answer computed without one of them would be taken for one computed with it.
fn refuse_unserved(body: &Value) -> Result<(), ApiError> {
    let u: SglUnservedFields = parse(body)?;
    refuse_given([
        ("input_embeds", !is_neutral(u.input_embeds.as_ref())),
        ("image_data", !is_neutral(u.image_data.as_ref())),
        ("video_data", !is_neutral(u.video_data.as_ref())),
        ("audio_data", !is_neutral(u.audio_data.as_ref())),
        ("lora_path", !is_neutral(u.lora_path.as_ref())),
        ("custom_logit_processor", !is_neutral(u.custom_logit_processor.as_ref())),
        ("return_hidden_states", u.return_hidden_states == Some(true)),
    ])
}

/// SGLang's `rid`: one non-empty string for one prompt, or a list of them, one per prompt of the
/// body (a batch's ids must differ).
fn rids(
    b: &GenerateBody,
    num_prompts: usize,
    listed: bool,
) -> Result<Option<Vec<String>>, ApiError> {
    let one = |v: &Value| match v {
        Value::String(s) if !s.is_empty() && s.len() <= 256 => Ok(s.clone()),
        Value::String(_) => Err(ApiError::invalid("rid", "a rid must be 1 to 256 bytes")),
        _ => Err(ApiError::invalid("rid", "rid must be a string or a list of strings")),
    };
    let rids = match &b.rid {
        None | Some(Value::Null) => return Ok(None),
        Some(Value::Array(items)) => items.iter().map(one).collect::<Result<Vec<_>, _>>()?,
        Some(_) if listed => {
            return Err(ApiError::invalid(
                "rid",
                format!("a batch of {num_prompts} prompts takes a list of {num_prompts} rids"),
            ));
        }
        Some(v) => vec![one(v)?],
    };
    if rids.len() != num_prompts {
        return Err(ApiError::invalid(
            "rid",
            format!("{} rids for {num_prompts} prompts: give one per prompt", rids.len()),
        ));
    }
    let mut sorted: Vec<&String> = rids.iter().collect();
    sorted.sort_unstable();
    if let Some(pair) = sorted.windows(2).find(|w| w[0] == w[1]) {
        return Err(ApiError::invalid("rid", format!("the rid {:?} is given twice", pair[0])));
    }
    Ok(Some(rids))
}

/// The prompts of a `/generate` body: `text` (a string, or a list of strings) or `input_ids`
/// (token ids, or a list of token-id lists), one of the two; checked for shape only, so a batch
/// can be refused by its size before anything is encoded. Also whether they came as a list, and
/// the field they came from.
fn prompts(b: &GenerateBody) -> Result<(Vec<PromptInput<'_>>, bool, &'static str), ApiError> {
    let empty =
        |param: &str| ApiError::invalid(param, format!("{param} must not be an empty list"));
    match (&b.text, &b.input_ids) {
        (Some(_), Some(_)) => {
            Err(ApiError::invalid("text", "give either text or input_ids, not both"))
        }
        (Some(Value::String(s)), None) => Ok((vec![PromptInput::Text(s)], false, "text")),
        (Some(Value::Array(items)), None) if items.is_empty() => Err(empty("text")),
        (Some(Value::Array(items)), None) if items.iter().all(Value::is_string) => {
            let texts = items.iter().filter_map(Value::as_str).map(PromptInput::Text);
            Ok((texts.collect(), true, "text"))
        }
        (Some(_), None) => {
            Err(ApiError::invalid("text", "text must be a string or a list of strings"))
        }
        (None, Some(Value::Array(ids))) if ids.iter().all(Value::is_number) => {
            Ok((vec![PromptInput::Ids(ids)], false, "input_ids"))
        }
        (None, Some(Value::Array(items))) if items.iter().all(Value::is_array) => {
            let lists = items.iter().filter_map(Value::as_array).map(|ids| PromptInput::Ids(ids));
            Ok((lists.collect(), true, "input_ids"))
        }
        (None, Some(_)) => Err(ApiError::invalid(
            "input_ids",
            "input_ids must be a list of token ids or a list of such lists",
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

/// SGLang's `token_ids_logprob`: one list of token ids for every prompt, or a list of such lists
/// with one per prompt (an empty list names none); `None` when absent. Checked against the
/// vocabulary by the engine, with the request.
fn logprob_ids(
    b: &GenerateBody,
    num_prompts: usize,
) -> Result<Option<Vec<Arc<[TokenId]>>>, ApiError> {
    const PARAM: &str = "token_ids_logprob";
    let ids = |v: &Value| -> Option<Arc<[TokenId]>> {
        let list = v.as_array()?;
        list.iter().map(|t| t.as_u64().and_then(|t| TokenId::try_from(t).ok())).collect()
    };
    let shape = || {
        ApiError::invalid(
            PARAM,
            format!(
                "{PARAM} must be a list of token ids, or a list of {num_prompts} such lists (one \
                 per prompt)"
            ),
        )
    };
    match &b.token_ids_logprob {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Array(items)) if !items.is_empty() && items.iter().all(Value::is_array) => {
            if items.len() != num_prompts {
                return Err(shape());
            }
            items.iter().map(|v| ids(v).ok_or_else(shape)).collect::<Result<_, _>>().map(Some)
        }
        Some(v) => ids(v).map(|one| Some(vec![one; num_prompts])).ok_or_else(shape),
    }
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

/// Each prompt's `sampling_params`, and whether they came as a list (one per prompt): a single
/// object (or none) serves every prompt. A list must have one entry per prompt, and the same `n`
/// in every entry (each prompt's continuations are answered `n` apart).
fn sampling_entries(
    params: Option<SamplingParamsField>,
    num_prompts: usize,
) -> Result<(Vec<SglSamplingParams>, bool), ApiError> {
    let entries = match params {
        None => return Ok((vec![SglSamplingParams::default()], false)),
        Some(SamplingParamsField::One(one)) => return Ok((vec![*one], false)),
        Some(SamplingParamsField::PerPrompt(entries)) => entries,
    };
    if entries.len() != num_prompts {
        return Err(ApiError::invalid(
            "sampling_params",
            format!(
                "{} sampling_params for {num_prompts} prompts: give one object, or a list with \
                 one per prompt",
                entries.len()
            ),
        ));
    }
    let n = |e: &SglSamplingParams| e.n.unwrap_or(1);
    if let Some(i) = entries.iter().position(|e| n(e) != n(&entries[0])) {
        return Err(ApiError::invalid(
            &format!("sampling_params[{i}].n"),
            format!(
                "every prompt's n must be the same: sampling_params[0].n is {}, \
                 sampling_params[{i}].n is {}",
                n(&entries[0]),
                n(&entries[i])
            ),
        ));
    }
    Ok((entries, true))
}

/// Names entry `i` of a `sampling_params` list in an error about one of its fields.
fn in_entry(e: ApiError, i: usize) -> ApiError {
    match e {
        ApiError::InvalidRequest { message, param: Some(p), code }
            if p.starts_with("sampling_params.") =>
        {
            let param = p.replacen("sampling_params.", &format!("sampling_params[{i}]."), 1);
            ApiError::InvalidRequest { message, param: Some(param), code }
        }
        other => other,
    }
}

/// The engine's sampling parameters of one `sampling_params` object.
fn entry_sampling(
    state: &AppState,
    sp: SglSamplingParams,
    logprobs: Option<u32>,
    prompt_logprobs: Option<u32>,
) -> Result<SamplingParams, ApiError> {
    let constraints = [
        ("json_schema", &sp.json_schema),
        ("regex", &sp.regex),
        ("ebnf", &sp.ebnf),
        ("structural_tag", &sp.structural_tag),
    ];
    let mut asked = constraints
        .into_iter()
        .filter_map(|(name, v)| Some((name, v.as_ref().filter(|v| !v.is_null())?)));
    let first = asked.next();
    if let Some((second, _)) = asked.next() {
        let (first, _) = first.expect("a first before a second");
        return Err(ApiError::invalid(
            &format!("sampling_params.{second}"),
            format!(
                "sampling_params.{first} and sampling_params.{second} both constrain the output: \
                 give one of them"
            ),
        ));
    }
    let response_format = match first {
        None => ResponseFormat::Text,
        Some(("json_schema", schema)) => {
            let schema = Arc::new(schema_of(schema, "sampling_params.json_schema")?);
            ResponseFormat::JsonSchema { schema, compact: false }
        }
        Some(("regex", pattern)) => {
            ResponseFormat::Regex(regex_of(pattern, "sampling_params.regex")?)
        }
        Some(("structural_tag", tag)) => {
            let tag = structural_tag_of(tag, "sampling_params.structural_tag")?;
            ResponseFormat::StructuralTag(Arc::new(tag))
        }
        Some((_, text)) => ResponseFormat::Grammar(grammar_of(text, "sampling_params.ebnf")?),
    };
    let fields = SamplingFields {
        temperature: sp.temperature,
        top_p: sp.top_p,
        top_k: sp.top_k,
        seed: sp.seed.or(sp.sampling_seed),
        min_tokens: sp.min_new_tokens,
        ignore_eos: sp.ignore_eos,
        stop: sp.stop,
        stop_regex: sp.stop_regex,
        stop_token_ids: sp.stop_token_ids,
        include_stop_str: sp.no_stop_trim,
        skip_special_tokens: sp.skip_special_tokens,
        presence_penalty: sp.presence_penalty,
        frequency_penalty: sp.frequency_penalty,
        repetition_penalty: sp.repetition_penalty,
        min_p: sp.min_p,
        logit_bias: sp.logit_bias,
        prompt_logprobs,
        prefix: "sampling_params.",
    };
    let max_tokens = sp.max_new_tokens.unwrap_or(128);
    let params = sampling(fields, max_tokens, logprobs, state.default_seed())?;
    let thinking_tags = super::thinking_tags(state, &response_format);
    Ok(SamplingParams { response_format, thinking_tags, ..params })
}

/// Validates a `/generate` body. Routing, when returned, is always raw int32. Each prompt of a
/// batch is encoded and checked in turn, so a batch stops at its first bad prompt.
pub(crate) fn generate(state: &AppState, body: &Value) -> Result<GenerateJob, ApiError> {
    refuse_unserved(body)?;
    let mut b: GenerateBody = parse(body)?;
    let params = b.sampling_params.take();
    let info = state.info();
    let (inputs, listed, prompt_param) = prompts(&b)?;
    let rids = rids(&b, inputs.len(), listed)?;
    let (entries, per_prompt) = sampling_entries(params, inputs.len())?;
    let n = entries[0].n.unwrap_or(1) as usize;
    check_batch(
        info,
        inputs.len(),
        n,
        BatchNames { n: "sampling_params.n", prompt: prompt_param },
    )?;
    let routing_fields = RoutingFields {
        return_routed_experts: b.return_routed_experts,
        start_len: b.routed_experts_start_len,
        prompt_start: None,
        format: Some("raw_b64_int32".into()),
        layers: b.routed_experts_layers.clone(),
    };
    let routing = routing_wire::resolve(info, &routing_fields)?;
    let salt = cache_namespace(b.cache_salt.as_deref(), b.extra_key.as_deref())?;
    let logprobs = logprobs(&b)?;
    let start = logprob_start(&b)?;
    let prompt_logprobs = start.and(logprobs);
    // Logprobs of named tokens go with the logprobs asked for, as in SGLang.
    let named_ids = logprob_ids(&b, inputs.len())?.filter(|_| logprobs.is_some());
    // Errors about an entry of a list name it (`sampling_params[1].top_p`).
    let named = |e: ApiError, i: usize| if per_prompt { in_entry(e, i) } else { e };
    let samplings = entries
        .into_iter()
        .enumerate()
        .map(|(i, sp)| {
            entry_sampling(state, sp, logprobs, prompt_logprobs).map_err(|e| named(e, i))
        })
        .collect::<Result<Vec<_>, ApiError>>()?;
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
    let requests = inputs
        .into_iter()
        .enumerate()
        .map(|(i, input)| {
            // SGLang encodes `text` with the tokenizer's special tokens (its default).
            let ids = input.tokens(state, prompt_param, None, true)?;
            check_start(start, ids.len())?;
            let base = &samplings[i.min(samplings.len() - 1)];
            // A copy only where this prompt names tokens of its own.
            let sampling = match &named_ids {
                Some(named) => Cow::Owned(SamplingParams {
                    logprob_token_ids: Arc::clone(&named[i]),
                    ..base.clone()
                }),
                None => Cow::Borrowed(base),
            };
            let r = request(ids, &sampling, n, routing, salt.as_ref());
            check_request(info, &r, &names).map_err(|e| named(e, i))?;
            Ok(r)
        })
        .collect::<Result<Vec<_>, ApiError>>()?;
    let job = Job {
        requests,
        n,
        routing,
        stream: b.stream.unwrap_or(false).then_some(false),
        continuous_usage: false,
        return_token_ids: true,
        tokens_as_ids: false,
        logprobs,
        echo: None,
        prompt_logprobs: None,
        tool_use: ToolUse::None,
        first_call_only: false,
        include_reasoning: true,
        client_id: None,
        reasoning: None,
    };
    Ok(GenerateJob {
        job,
        top_logprobs_num: logprobs.filter(|&k| k > 0),
        text_in_logprobs: b.return_text_in_logprobs.unwrap_or(false),
        logprob_start_len: start,
        rids,
        batch: listed || n > 1,
    })
}
