//! Sampling parameters shared by every route: defaults, and what only the wire can get wrong.
//! Their ranges are the engine's rules ([`SamplingParams::check`]), which `check_request` runs
//! and names as the route does.

use std::sync::Arc;

use routed_model::Tokenizer;
use routed_types::{
    Grammar, JsonSchema, Regex, ResponseFormat, SamplingParams, StructuralTag, TokenId,
};
use serde_json::{Map, Value};

use super::grammar::grammar_of;
use super::json_schema::reduce;
use super::regex::{regex_of, stop_regexes};
use super::structural_tag::structural_tag_of;
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
    /// SGLang's stop patterns: one or a list.
    pub stop_regex: Option<StopField>,
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
        stop_regex: match f.stop_regex {
            Some(patterns) => stop_regexes(patterns, &name("stop_regex"))?,
            None => Vec::new(),
        },
        include_stop_str_in_output: f.include_stop_str.unwrap_or(false),
        skip_special_tokens: f.skip_special_tokens.unwrap_or(true),
        logprobs,
        prompt_logprobs: f.prompt_logprobs,
        logprob_token_ids: Arc::from([]),
        presence_penalty: f.presence_penalty.unwrap_or(0.0),
        frequency_penalty: f.frequency_penalty.unwrap_or(0.0),
        repetition_penalty: f.repetition_penalty.unwrap_or(1.0),
        min_p: f.min_p.unwrap_or(0.0),
        logit_bias,
        bad_words: Vec::new(),
        response_format: ResponseFormat::Text,
        thinking_tags: None,
    })
}

/// vLLM's `bad_words` as token sequences, as vLLM encodes them: each word without its leading
/// whitespace, and again after a space when that gives a different first token and as many
/// tokens (the word inside a text rather than at its start).
pub(crate) fn bad_words(
    tokenizer: &Tokenizer,
    words: StopField,
) -> Result<Vec<Vec<TokenId>>, ApiError> {
    const PARAM: &str = "bad_words";
    let encode = |text: &str| {
        tokenizer
            .encode_with(text, false)
            .map_err(|e| ApiError::invalid(PARAM, format!("cannot tokenize '{text}': {e}")))
    };
    let mut out = Vec::new();
    for word in words.into_vec() {
        let word = word.trim_start();
        let alone = encode(word)?;
        let Some(&first) = alone.first() else {
            return Err(ApiError::invalid(PARAM, "bad_words must not be empty or only spaces"));
        };
        let inside = encode(&format!(" {word}"))?;
        let differs = inside.first() != Some(&first) && inside.len() == alone.len();
        out.push(alone);
        if differs {
            out.push(inside);
        }
    }
    Ok(out)
}

/// vLLM's older structured-output field that is not served: refused rather than ignored, so
/// that a client never takes an unconstrained answer for a constrained one.
/// (`guided_decoding_backend` only names an implementation, and is accepted.)
const GUIDED_REFUSED: [&str; 1] = ["guided_whitespace_pattern"];

/// Constraints of vLLM's `structured_outputs` that are not served, refused by name.
const STRUCTURED_OUTPUTS_REFUSED: [&str; 1] = ["whitespace_pattern"];

/// The constraints of vLLM's `structured_outputs`, of which a request gives one.
const STRUCTURED_OUTPUTS: [&str; 6] =
    ["json", "json_object", "choice", "regex", "grammar", "structural_tag"];

/// How a field's value is read into a constraint (the field's name given for the errors).
type Read = fn(&Value, &str) -> Result<Constraint, ApiError>;

/// What one of a request's fields asks the output to be.
enum Constraint {
    /// One JSON object.
    Object,
    /// One value of a schema.
    Schema(JsonSchema),
    /// One of these texts.
    Choice(Vec<String>),
    /// A text the regex matches whole.
    Regex(Arc<Regex>),
    /// A text of the grammar's root rule.
    Grammar(Arc<Grammar>),
    /// Tokens of a set, sorted and each once.
    Tokens(Arc<[TokenId]>),
    /// Free text with a structural tag's structures.
    Tagged(StructuralTag),
}

/// The output format a request asks for, by one of: OpenAI's `response_format` (on both OpenAI
/// routes, as vLLM takes it: `text`, `json_object`, or `json_schema` with its `schema`), vLLM's
/// `structured_outputs` (`json_object: true`, `json` with a schema, `choice` with a list of
/// texts, `regex`, or `grammar`; compact with its `disable_any_whitespace`) or its older
/// `guided_json`, `guided_choice`, `guided_regex` and `guided_grammar`, or SGLang's top-level
/// `json_schema`, `regex` and `ebnf`. A schema is reduced to what the reader
/// follows ([`super::json_schema`]); vLLM's other ways to constrain the output are a 400 naming
/// the field, and so are two constraints at once.
pub(crate) fn response_format(body: &Value) -> Result<ResponseFormat, ApiError> {
    let given = |f: &str| body.get(f).is_some_and(|v| !v.is_null());
    if let Some(field) = GUIDED_REFUSED.iter().find(|f| given(f)) {
        return Err(ApiError::unsupported(
            field,
            format!(
                "{field} is not supported; response_format json_object, json_schema and structural_tag, choice, regex and grammar are"
            ),
        ));
    }
    let (structured, compact) = structured_outputs(body)?;
    let read = |field: &'static str, how: Read| -> Result<_, ApiError> {
        let value = body.get(field).filter(|v| !v.is_null());
        Ok((field, value.map(|v| how(v, field)).transpose()?))
    };
    let fields = [
        // vLLM's older fields, and its own.
        read("guided_json", |v, f| schema_of(v, f).map(Constraint::Schema))?,
        read("guided_choice", |v, f| choices(v, f).map(Constraint::Choice))?,
        read("guided_regex", |v, f| regex_of(v, f).map(Constraint::Regex))?,
        read("guided_grammar", |v, f| grammar_of(v, f).map(Constraint::Grammar))?,
        read("allowed_token_ids", |v, _| allowed_token_ids(v).map(Constraint::Tokens))?,
        // SGLang's on its OpenAI routes.
        read("json_schema", |v, f| schema_of(v, f).map(Constraint::Schema))?,
        read("regex", |v, f| regex_of(v, f).map(Constraint::Regex))?,
        read("ebnf", |v, f| grammar_of(v, f).map(Constraint::Grammar))?,
    ];
    let openai = openai_response_format(body)?;
    let mut asked = [("structured_outputs", structured)]
        .into_iter()
        .chain(fields)
        .chain([("response_format", openai)])
        .filter_map(|(field, c)| c.map(|c| (field, c)));
    let Some((first, constraint)) = asked.next() else { return Ok(ResponseFormat::Text) };
    if let Some((second, _)) = asked.next() {
        return Err(ApiError::invalid(
            second,
            format!("{first} and {second} both constrain the output: give one of them"),
        ));
    }
    Ok(match (constraint, compact) {
        (Constraint::Object, false) => ResponseFormat::JsonObject,
        (Constraint::Object, true) => ResponseFormat::CompactJsonObject,
        (Constraint::Schema(schema), compact) => {
            ResponseFormat::JsonSchema { schema: Arc::new(schema), compact }
        }
        (Constraint::Choice(choices), _) => ResponseFormat::Choice(choices.into()),
        (Constraint::Regex(regex), _) => ResponseFormat::Regex(regex),
        (Constraint::Grammar(grammar), _) => ResponseFormat::Grammar(grammar),
        (Constraint::Tokens(ids), _) => ResponseFormat::Tokens(ids),
        (Constraint::Tagged(tag), _) => ResponseFormat::StructuralTag(Arc::new(tag)),
    })
}

/// vLLM's `allowed_token_ids`: a non-empty list of token ids, sorted here and each kept once
/// (whether they are in the vocabulary is the engine's check).
fn allowed_token_ids(value: &Value) -> Result<Arc<[TokenId]>, ApiError> {
    const PARAM: &str = "allowed_token_ids";
    let Some(list) = value.as_array() else {
        return Err(ApiError::InvalidRequest {
            message: format!("{PARAM} must be a list of token ids, got {value}"),
            param: Some(PARAM.to_owned()),
            code: "invalid_type",
        });
    };
    let mut ids = super::token_ids(list, PARAM)?;
    if ids.is_empty() {
        return Err(ApiError::invalid(PARAM, format!("{PARAM} must name at least one token")));
    }
    ids.sort_unstable();
    ids.dedup();
    Ok(ids.into())
}

/// vLLM's `choice`: a non-empty list of non-empty texts, the output exactly one of them.
fn choices(value: &Value, param: &str) -> Result<Vec<String>, ApiError> {
    let texts: Option<Vec<String>> = value
        .as_array()
        .filter(|l| !l.is_empty() && l.len() <= JsonSchema::MAX_ITEMS)
        .and_then(|l| l.iter().map(|v| v.as_str().map(str::to_owned)).collect());
    match texts {
        Some(texts) if texts.iter().all(|t| !t.is_empty() && t.len() <= JsonSchema::MAX_ITEMS) => {
            Ok(texts)
        }
        _ => Err(ApiError::invalid(
            param,
            format!(
                "{param} must be a list of 1 to {} non-empty strings (of at most as many bytes)",
                JsonSchema::MAX_ITEMS
            ),
        )),
    }
}

/// A schema given as a JSON object (or boolean), or as the JSON text of one, reduced.
pub(crate) fn schema_of(value: &Value, param: &str) -> Result<JsonSchema, ApiError> {
    match value {
        Value::String(text) => match serde_json::from_str::<Value>(text) {
            Ok(schema) => reduce(&schema, param),
            Err(e) => Err(ApiError::invalid(param, format!("{param} is not JSON: {e}"))),
        },
        schema @ (Value::Object(_) | Value::Bool(_)) => reduce(schema, param),
        other => Err(ApiError::InvalidRequest {
            message: format!("{param} must be a JSON schema (an object), got {other}"),
            param: Some(param.to_owned()),
            code: "invalid_type",
        }),
    }
}

/// What OpenAI's `response_format` asks for, if anything.
fn openai_response_format(body: &Value) -> Result<Option<Constraint>, ApiError> {
    let Some(format) = body.get("response_format").filter(|v| !v.is_null()) else {
        return Ok(None);
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
        Some("text") => Ok(None),
        Some("json_object") => Ok(Some(Constraint::Object)),
        Some("json_schema") => {
            let Some(spec) = format.get("json_schema").filter(|v| v.is_object()) else {
                return Err(ApiError::missing(
                    "response_format.json_schema",
                    "response_format json_schema needs a json_schema object with its schema",
                ));
            };
            // OpenAI's `schema` is optional: without one, any JSON value.
            let any = Value::Bool(true);
            let schema = spec.get("schema").filter(|v| !v.is_null()).unwrap_or(&any);
            Ok(Some(Constraint::Schema(schema_of(schema, "response_format.json_schema.schema")?)))
        }
        Some("structural_tag") => {
            Ok(Some(Constraint::Tagged(structural_tag_of(format, "response_format")?)))
        }
        _ => Err(ApiError::invalid(
            "response_format.type",
            format!(
                "response_format.type must be \"text\", \"json_object\", \"json_schema\" or \"structural_tag\", got {kind}"
            ),
        )),
    }
}

/// vLLM's `structured_outputs`: what it asks for (`json_object: true`, or `json` with a schema)
/// and whether without whitespace outside strings (`disable_any_whitespace: true`, which, as in
/// vLLM, only shapes a structured output). Its other constraints are a 400 naming the key; its
/// other switches concern backends, and change nothing here.
fn structured_outputs(body: &Value) -> Result<(Option<Constraint>, bool), ApiError> {
    let Some(value) = body.get("structured_outputs").filter(|v| !v.is_null()) else {
        return Ok((None, false));
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
            format!(
                "{param} is not supported; structured_outputs.json, json_object, choice, regex, grammar and structural_tag are"
            ),
        ));
    }
    // `json_object: false` asks for nothing; any other value given is a constraint to read.
    let given = |key: &&str| match *key {
        "json_object" => set(key),
        _ => fields.get(*key).is_some_and(|v| !v.is_null()),
    };
    let mut given = STRUCTURED_OUTPUTS.into_iter().filter(given);
    let key = given.next();
    if given.next().is_some() {
        return Err(ApiError::invalid(
            "structured_outputs",
            "structured_outputs.json, json_object, choice, regex, grammar and structural_tag each \
             constrain the output: give one of them",
        ));
    }
    let param = |key: &str| format!("structured_outputs.{key}");
    let value = |key: &str| &fields[key];
    let constraint = match key {
        None => None,
        Some(key @ "json") => Some(Constraint::Schema(schema_of(value(key), &param(key))?)),
        Some("json_object") => Some(Constraint::Object),
        Some(key @ "choice") => Some(Constraint::Choice(choices(value(key), &param(key))?)),
        Some(key @ "regex") => Some(Constraint::Regex(regex_of(value(key), &param(key))?)),
        Some(key @ "structural_tag") => {
            Some(Constraint::Tagged(structural_tag_of(value(key), &param(key))?))
        }
        Some(key) => Some(Constraint::Grammar(grammar_of(value(key), &param(key))?)),
    };
    Ok((constraint, set("disable_any_whitespace")))
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
