//! Request bodies as they arrive on the wire.
//!
//! Each body is parsed from a `serde_json::Value` with `serde_path_to_error`, so a wrong type is
//! a 400 naming the field. Unknown fields are ignored, as OpenAI and vLLM do. Every field is
//! optional here; defaults and ranges are applied in `validate`.

use std::fmt;

use serde::de::value::{MapAccessDeserializer, SeqAccessDeserializer};
use serde::de::{DeserializeOwned, MapAccess, SeqAccess, Visitor};
use serde::{Deserialize, Deserializer};
use serde_json::Value;

use crate::error::{ApiError, from_serde};

/// Parses `value` as `T`, naming the field of the first type error.
pub(crate) fn parse<T: DeserializeOwned>(value: &Value) -> Result<T, ApiError> {
    if !value.is_object() {
        return Err(ApiError::InvalidRequest {
            message: "the request body must be a JSON object".into(),
            param: None,
            code: "invalid_type",
        });
    }
    serde_path_to_error::deserialize(value).map_err(from_serde)
}

/// `stop`: one string or a list of them.
#[derive(Clone, Debug, Deserialize)]
#[serde(untagged)]
pub(crate) enum StopField {
    One(String),
    Many(Vec<String>),
}

impl StopField {
    pub(crate) fn into_vec(self) -> Vec<String> {
        match self {
            Self::One(s) => vec![s],
            Self::Many(v) => v,
        }
    }
}

/// `stream_options`.
#[derive(Clone, Debug, Default, Deserialize)]
pub(crate) struct StreamOptions {
    pub include_usage: Option<bool>,
    /// vLLM's: every chunk carries its choice's usage so far (with `include_usage`).
    pub continuous_usage_stats: Option<bool>,
}

/// Fields shared by `/v1/completions` and `/v1/chat/completions`.
#[derive(Clone, Debug, Default, Deserialize)]
pub(crate) struct CommonFields {
    pub model: Option<String>,
    /// SGLang's id for the request (the response's `id`, what `/abort_request` names).
    pub rid: Option<Value>,
    /// vLLM's id for the request (the response's `id` after its prefix).
    pub request_id: Option<Value>,
    pub n: Option<u32>,
    pub best_of: Option<u32>,
    pub seed: Option<u64>,
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    pub top_k: Option<i64>,
    pub stop: Option<StopField>,
    /// SGLang's: patterns that end the request where the text matches one.
    pub stop_regex: Option<StopField>,
    /// vLLM's: words the output never contains.
    pub bad_words: Option<StopField>,
    pub stop_token_ids: Option<Vec<u32>>,
    pub ignore_eos: Option<bool>,
    pub min_tokens: Option<u32>,
    /// vLLM's: keep a matched stop string in the text.
    pub include_stop_str_in_output: Option<bool>,
    /// vLLM's: leave special tokens out of the text (default true).
    pub skip_special_tokens: Option<bool>,
    pub stream: Option<bool>,
    pub stream_options: Option<StreamOptions>,
    pub cache_salt: Option<String>,
    /// SGLang's second cache namespace; combined with `cache_salt`.
    pub extra_key: Option<String>,
    pub return_token_ids: Option<bool>,
    /// vLLM's: logprobs name tokens `token_id:<id>`.
    pub return_tokens_as_token_ids: Option<bool>,
    pub echo: Option<bool>,
    pub presence_penalty: Option<f32>,
    pub frequency_penalty: Option<f32>,
    pub repetition_penalty: Option<f32>,
    pub min_p: Option<f32>,
    /// OpenAI's map from token id (a string) to a bias; checked in `validate`.
    pub logit_bias: Option<serde_json::Map<String, Value>>,
    /// vLLM's prompt logprobs: alternatives per prompt token (signed, so -1 gets a message of
    /// its own).
    pub prompt_logprobs: Option<i64>,
    pub return_routed_experts: Option<bool>,
    pub routed_experts_start_len: Option<i64>,
    pub routed_experts_prompt_start: Option<i64>,
    pub routed_experts_format: Option<String>,
    pub routed_experts_layers: Option<String>,
    /// vLLM's: keep only the prompt's last tokens (-1: `max_model_len` of them).
    pub truncate_prompt_tokens: Option<i64>,
}

/// vLLM's fields of both OpenAI routes that would change the answer and are not served; each is
/// refused unless it holds its neutral value (false, null, an empty list). Parsed apart from
/// [`CommonFields`] (a flattened struct would buffer every other field, the prompt included).
#[derive(Clone, Debug, Default, Deserialize)]
pub(crate) struct UnservedFields {
    /// vLLM's beam search.
    pub use_beam_search: Option<bool>,
    /// vLLM's logits processors, by name.
    pub logits_processors: Option<Value>,
    /// vLLM's request priority (0 unless the server schedules by priority, which routed does
    /// not).
    pub priority: Option<i64>,
    /// vLLM's prompt embeddings (`--enable-prompt-embeds`).
    pub prompt_embeds: Option<Value>,
    /// vLLM's stop on a repeated token pattern (all 0 unless asked).
    pub max_repetition_pattern_size: Option<i64>,
    pub min_repetition_pattern_size: Option<i64>,
    pub repetition_min_count: Option<i64>,
    /// vLLM's arguments for custom extensions, and for disaggregated serving.
    pub vllm_xargs: Option<Value>,
    pub kv_transfer_params: Option<Value>,
}

/// SGLang's `/generate` fields that would change the answer or what it carries and are not
/// served; each is refused unless neutral (null, false, an empty list or string).
#[derive(Clone, Debug, Default, Deserialize)]
pub(crate) struct SglUnservedFields {
    /// Prompt embeddings instead of ids.
    pub input_embeds: Option<Value>,
    /// Multimodal inputs.
    pub image_data: Option<Value>,
    pub video_data: Option<Value>,
    pub audio_data: Option<Value>,
    /// A LoRA adapter to apply.
    pub lora_path: Option<Value>,
    /// A serialized logit processor.
    pub custom_logit_processor: Option<Value>,
    /// The last layer's hidden states in `meta_info`.
    pub return_hidden_states: Option<bool>,
}

/// Fields only `/v1/completions` has.
#[derive(Clone, Debug, Deserialize)]
pub(crate) struct CompletionFields {
    /// A string, token ids, or a batch of either; checked in `validate`.
    pub prompt: Value,
    pub max_tokens: Option<u32>,
    pub logprobs: Option<u32>,
    pub suffix: Option<String>,
    /// vLLM's: encode a text prompt with the tokenizer's own special tokens (default true).
    pub add_special_tokens: Option<bool>,
}

/// One chat message.
#[derive(Clone, Debug, Deserialize)]
pub(crate) struct WireMessage {
    pub role: String,
    pub content: Option<MessageContent>,
    /// An assistant message's calls: `{"id", "type", "function": {"name", "arguments"}}`, the
    /// arguments as JSON text (OpenAI's shape) or as an object.
    pub tool_calls: Option<Vec<Value>>,
    /// A tool message's call.
    pub tool_call_id: Option<String>,
    pub name: Option<String>,
}

/// A message's content: text, or a list of parts of which only `text` parts are supported.
#[derive(Clone, Debug, Deserialize)]
#[serde(untagged)]
pub(crate) enum MessageContent {
    Text(String),
    Parts(Vec<ContentPart>),
}

/// One part of a multi-part message.
#[derive(Clone, Debug, Deserialize)]
pub(crate) struct ContentPart {
    #[serde(rename = "type")]
    pub kind: String,
    pub text: Option<String>,
}

/// Fields only `/v1/chat/completions` has.
#[derive(Clone, Debug, Deserialize)]
pub(crate) struct ChatFields {
    pub messages: Vec<WireMessage>,
    pub max_tokens: Option<u32>,
    pub max_completion_tokens: Option<u32>,
    pub logprobs: Option<bool>,
    pub top_logprobs: Option<u32>,
    pub add_generation_prompt: Option<bool>,
    pub continue_final_message: Option<bool>,
    pub tools: Option<Vec<Value>>,
    pub tool_choice: Option<Value>,
    /// `false` keeps only an answer's first call, as vLLM does.
    pub parallel_tool_calls: Option<bool>,
    /// `false` drops the reasoning a reasoning parser splits off, as vLLM does.
    pub include_reasoning: Option<bool>,
    /// `false` leaves the answer whole, its thinking in the content, as SGLang does.
    pub separate_reasoning: Option<bool>,
    /// vLLM's template variables: documents for a RAG template (Granite's), and the effort a
    /// template may ask of its reasoning.
    pub documents: Option<Value>,
    pub reasoning_effort: Option<Value>,
    /// A template of the request's own, refused as vLLM refuses it by default.
    pub chat_template: Option<Value>,
    pub chat_template_kwargs: Option<serde_json::Map<String, Value>>,
    /// vLLM's: add the tokenizer's own special tokens to the rendered chat (default false).
    pub add_special_tokens: Option<bool>,
}

/// `sampling_params` of `/generate` (SGLang names).
#[derive(Clone, Debug, Default, Deserialize)]
pub(crate) struct SglSamplingParams {
    pub max_new_tokens: Option<u32>,
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    pub top_k: Option<i64>,
    pub min_new_tokens: Option<u32>,
    pub stop: Option<StopField>,
    pub stop_token_ids: Option<Vec<u32>>,
    pub ignore_eos: Option<bool>,
    /// Keep a matched stop string in the text (vLLM's `include_stop_str_in_output`).
    pub no_stop_trim: Option<bool>,
    pub skip_special_tokens: Option<bool>,
    pub seed: Option<u64>,
    pub sampling_seed: Option<u64>,
    pub n: Option<u32>,
    pub presence_penalty: Option<f32>,
    pub frequency_penalty: Option<f32>,
    pub repetition_penalty: Option<f32>,
    pub min_p: Option<f32>,
    pub logit_bias: Option<serde_json::Map<String, Value>>,
    /// SGLang's output constraints (one of them): `json_schema`, `regex`, `ebnf` and
    /// `structural_tag`.
    pub json_schema: Option<Value>,
    pub regex: Option<Value>,
    pub ebnf: Option<Value>,
    pub structural_tag: Option<Value>,
    /// Patterns that end the request where the text matches one.
    pub stop_regex: Option<StopField>,
}

/// `/generate`'s `sampling_params`: one object for every prompt, or a list with one per prompt of
/// a batch. Told apart by the JSON type (not `untagged`), so a bad field inside is a 400 naming
/// its path (`sampling_params[1].temperature`), not "no variant matched".
#[derive(Clone, Debug)]
pub(crate) enum SamplingParamsField {
    One(Box<SglSamplingParams>),
    PerPrompt(Vec<SglSamplingParams>),
}

impl<'de> Deserialize<'de> for SamplingParamsField {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Dispatch;
        impl<'de> Visitor<'de> for Dispatch {
            type Value = SamplingParamsField;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("an object or a list of objects")
            }
            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Self::Value, A::Error> {
                let one = SglSamplingParams::deserialize(MapAccessDeserializer::new(map))?;
                Ok(SamplingParamsField::One(Box::new(one)))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Self::Value, A::Error> {
                let each = Vec::deserialize(SeqAccessDeserializer::new(seq))?;
                Ok(SamplingParamsField::PerPrompt(each))
            }
        }
        deserializer.deserialize_any(Dispatch)
    }
}

/// The body of `/generate`.
#[derive(Clone, Debug, Deserialize)]
pub(crate) struct GenerateBody {
    /// The request's id (`meta_info.id`, and what `/abort_request` names it by).
    pub rid: Option<Value>,
    pub text: Option<Value>,
    pub input_ids: Option<Value>,
    pub sampling_params: Option<SamplingParamsField>,
    pub return_logprob: Option<bool>,
    /// Prompt logprobs from this position; -1 (SGLang's default) asks for none.
    pub logprob_start_len: Option<i64>,
    /// Top alternatives per sampled token (`output_top_logprobs`).
    pub top_logprobs_num: Option<u32>,
    /// Put each token's text in the logprob triples instead of `null`.
    pub return_text_in_logprobs: Option<bool>,
    /// Tokens whose logprobs each reported position carries (`output_token_ids_logprobs`,
    /// `input_token_ids_logprobs`): one list for every prompt, or a list per prompt.
    pub token_ids_logprob: Option<Value>,
    pub return_routed_experts: Option<bool>,
    pub routed_experts_start_len: Option<i64>,
    pub routed_experts_layers: Option<String>,
    pub cache_salt: Option<String>,
    pub extra_key: Option<String>,
    pub stream: Option<bool>,
}

/// The body of `/tokenize`: vLLM's completion form (`prompt`) or chat form (`messages`).
#[derive(Clone, Debug, Deserialize)]
pub(crate) struct TokenizeBody {
    pub model: Option<String>,
    pub prompt: Option<Value>,
    pub messages: Option<Vec<WireMessage>>,
    pub add_special_tokens: Option<bool>,
    pub add_generation_prompt: Option<bool>,
    pub continue_final_message: Option<bool>,
    pub return_token_strs: Option<bool>,
    pub tools: Option<Vec<Value>>,
    pub chat_template: Option<String>,
    pub chat_template_kwargs: Option<serde_json::Map<String, Value>>,
}

/// The body of `/detokenize`.
#[derive(Clone, Debug, Deserialize)]
pub(crate) struct DetokenizeBody {
    pub model: Option<String>,
    pub tokens: Vec<Value>,
}
