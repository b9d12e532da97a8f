//! Per-request sampling parameters, their ranges, and the reasons a request ends.

use std::{cmp::Ordering, sync::Arc};

use crate::{Grammar, JsonSchema, Regex, StopRegex, StructuralTag, TokenId};

/// Most top alternatives per token a request may ask for, for sampled tokens (`logprobs`) and
/// prompt tokens (`prompt_logprobs`) alike: OpenAI's and vLLM's limit.
pub const MAX_LOGPROBS: u32 = 20;

/// Most tokens a request may name for their logprobs at every position
/// ([`SamplingParams::logprob_token_ids`]).
pub const MAX_LOGPROB_TOKEN_IDS: usize = 1024;

/// Largest magnitude of a `logit_bias` value (OpenAI's range).
pub const MAX_LOGIT_BIAS: f32 = 100.0;

/// Largest magnitude of `presence_penalty` and `frequency_penalty` (OpenAI's range).
pub const MAX_PENALTY: f32 = 2.0;

/// How to pick each next token, and when to stop. Defaults follow the OpenAI API.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct SamplingParams {
    /// 0 means greedy (argmax, first maximum on ties).
    pub temperature: f32,
    /// Nucleus mass in (0, 1]; 1 disables it.
    pub top_p: f32,
    /// Keep only the `top_k` most likely tokens; `None` disables it.
    pub top_k: Option<u32>,
    /// Seed of this request's private random stream, so its samples do not depend on its batch.
    pub seed: u64,
    /// Most tokens to generate.
    pub max_tokens: u32,
    /// Fewest tokens to generate before EOS or a stop token may end the request.
    pub min_tokens: u32,
    /// Keep generating past EOS.
    pub ignore_eos: bool,
    /// Extra token ids that end the request.
    pub stop_token_ids: Vec<TokenId>,
    /// Strings that end the request; the match is cut from the text unless
    /// `include_stop_str_in_output`.
    pub stop: Vec<String>,
    /// Patterns that end the request when the text matches one anywhere (SGLang's
    /// `stop_regex`); the text is cut where the leftmost match starts, as at a stop string.
    #[serde(default)]
    pub stop_regex: Vec<Arc<StopRegex>>,
    /// Keep a matched stop string (or a stop pattern's match) at the end of the text, and the
    /// text of the token (EOS, a stop token) that ended the request (vLLM's
    /// `include_stop_str_in_output`, SGLang's `no_stop_trim`).
    pub include_stop_str_in_output: bool,
    /// Leave special tokens (EOS, chat markers) out of the text, as vLLM and SGLang do by default.
    /// With `false` they are in it, but for the one that ended the request (unless
    /// `include_stop_str_in_output`). Only the text changes: token ids and logprobs are the same.
    pub skip_special_tokens: bool,
    /// How many top alternatives to report beside the sampled token's logprob (`None`: no
    /// logprobs at all).
    pub logprobs: Option<u32>,
    /// Logprobs of the prompt's tokens (each given the tokens before it), with this many top
    /// alternatives; `None`: none. A request asking for them computes its whole prompt (it never
    /// reads the prefix cache).
    pub prompt_logprobs: Option<u32>,
    /// Tokens whose logprobs are reported at every position that reports logprobs (each
    /// sampled token's with `logprobs`, each prompt token's with `prompt_logprobs`), in this
    /// order, under the raw model distribution (SGLang's `token_ids_logprob`). Empty: none.
    #[serde(default)]
    pub logprob_token_ids: Arc<[TokenId]>,
    /// Subtracted once from the logit of every token the output already contains (OpenAI's
    /// `presence_penalty`, -2..=2).
    pub presence_penalty: f32,
    /// Subtracted from a token's logit once per time the output already contains it (OpenAI's
    /// `frequency_penalty`, -2..=2).
    pub frequency_penalty: f32,
    /// Divides positive and multiplies negative logits of every token in the prompt or the output
    /// (vLLM's `repetition_penalty`, > 0; 1 is off).
    pub repetition_penalty: f32,
    /// Drops tokens whose probability (after temperature) is below `min_p` times the most likely
    /// token's (0 is off).
    pub min_p: f32,
    /// Added to the logits of these tokens before anything else, sorted by token id.
    pub logit_bias: Vec<(TokenId, f32)>,
    /// Token sequences the output never contains (vLLM's `bad_words`, encoded): a sequence's
    /// last token is ruled out wherever the output ends with the rest of it.
    #[serde(default)]
    pub bad_words: Vec<Vec<TokenId>>,
    /// What the output must be (OpenAI's `response_format`).
    #[serde(default)]
    pub response_format: ResponseFormat,
    /// A reasoning model's thinking tags, when the response format constrains only the answer
    /// after the thinking (a server with a reasoning parser): the constraint applies from the
    /// start when the prompt's last tag is the end tag (the template closed the thinking), else
    /// from the first end tag sampled.
    #[serde(default)]
    pub thinking_tags: Option<ThinkingTags>,
}

/// The single tokens that open and close a reasoning model's thinking (`<think>`, `</think>`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ThinkingTags {
    /// Opens the thinking.
    pub start: TokenId,
    /// Closes it.
    pub end: TokenId,
}

impl ThinkingTags {
    /// Whether the thinking is over by the end of `tokens`: its last tag is the end tag.
    pub fn ended_in(&self, tokens: &[TokenId]) -> bool {
        tokens.iter().rev().find(|&&t| t == self.start || t == self.end) == Some(&self.end)
    }
}

/// What a request's output must be (OpenAI's `response_format`).
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum ResponseFormat {
    /// Any text.
    #[default]
    Text,
    /// One JSON object (`{"type": "json_object"}`): each token is chosen among those that keep
    /// the output a prefix of a JSON object, and EOS only once the object is closed.
    JsonObject,
    /// [`Self::JsonObject`] without whitespace outside strings (vLLM's
    /// `disable_any_whitespace`).
    CompactJsonObject,
    /// One JSON value of `schema` (`{"type": "json_schema"}`), each token chosen among those
    /// that keep the output a prefix of such a value, EOS only once it is whole; `compact`: no
    /// whitespace outside strings.
    JsonSchema {
        /// The schema, reduced to the shape it gives the value.
        schema: Arc<JsonSchema>,
        /// No whitespace outside strings.
        compact: bool,
    },
    /// Exactly one of these texts (vLLM's `choice`), each token chosen among those that keep
    /// the output a prefix of one, EOS only once it is one.
    Choice(Arc<[String]>),
    /// Text that `regex` matches whole (vLLM's and SGLang's `regex`), each token chosen among
    /// those that keep the output a prefix of such a text, EOS only once it is one.
    Regex(Arc<Regex>),
    /// A text of `grammar`'s `root` rule (vLLM's `guided_grammar`, SGLang's `ebnf`), each token
    /// chosen among those that keep the output a prefix of such a text, EOS only once it is one.
    Grammar(Arc<Grammar>),
    /// Every token one of these, sorted and each once (vLLM's `allowed_token_ids`; EOS ends the
    /// output only if it is one of them).
    Tokens(Arc<[TokenId]>),
    /// Free text in which each trigger opens one of the tag's structures (SGLang's and vLLM's
    /// `structural_tag`), each token chosen among those that keep the output a prefix of such a
    /// text; EOS only in free text.
    StructuralTag(Arc<StructuralTag>),
}

impl Default for SamplingParams {
    fn default() -> Self {
        Self {
            temperature: 1.0,
            top_p: 1.0,
            top_k: None,
            seed: 0,
            max_tokens: 16,
            min_tokens: 0,
            ignore_eos: false,
            stop_token_ids: Vec::new(),
            stop: Vec::new(),
            stop_regex: Vec::new(),
            include_stop_str_in_output: false,
            skip_special_tokens: true,
            logprobs: None,
            prompt_logprobs: None,
            logprob_token_ids: Arc::from([]),
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            repetition_penalty: 1.0,
            min_p: 0.0,
            logit_bias: Vec::new(),
            bad_words: Vec::new(),
            response_format: ResponseFormat::Text,
            thinking_tags: None,
        }
    }
}

impl SamplingParams {
    /// Greedy decoding of `max_tokens` tokens.
    pub fn greedy(max_tokens: u32) -> Self {
        Self { temperature: 0.0, max_tokens, ..Self::default() }
    }

    /// Whether sampling is deterministic argmax.
    pub fn is_greedy(&self) -> bool {
        self.temperature <= 0.0 || self.top_k == Some(1)
    }

    /// Whether choosing a token needs the tokens generated so far (and, for the repetition
    /// penalty, the prompt's).
    pub fn needs_history(&self) -> bool {
        self.presence_penalty != 0.0
            || self.frequency_penalty != 0.0
            || self.repetition_penalty != 1.0
    }

    /// Whether the logits are changed before a token is chosen (penalties, bias, `min_p`, bad
    /// words, an output constraint).
    pub fn processes_logits(&self) -> bool {
        self.needs_history()
            || !self.logit_bias.is_empty()
            || self.min_p > 0.0
            || !self.bad_words.is_empty()
            || self.is_constrained()
    }

    /// The tokens [`Self::bad_words`] rule out after `output`, into `out` (cleared first): the
    /// last token of each word whose other tokens end the output (of a one-token word, always),
    /// sorted and each once.
    pub fn banned_after(&self, output: &[TokenId], out: &mut Vec<TokenId>) {
        out.clear();
        for word in &self.bad_words {
            if let Some((&last, before)) = word.split_last()
                && output.ends_with(before)
            {
                out.push(last);
            }
        }
        out.sort_unstable();
        out.dedup();
    }

    /// Whether the output is constrained (`response_format` other than text): each choice is
    /// among the tokens the scheduler's mask allows.
    pub fn is_constrained(&self) -> bool {
        self.response_format != ResponseFormat::Text
    }

    /// Checks every parameter against its range, and `logit_bias`'s token ids against a
    /// vocabulary of `vocab_size` tokens; the error names the first bad field. What needs the
    /// model's context length (`max_tokens` against the prompt) is the engine's check, not this.
    ///
    /// Every comparison is written so that NaN fails it: a NaN would otherwise pass through the
    /// sampler and poison every probability of its row.
    pub fn check(&self, vocab_size: usize) -> Result<(), SamplingError> {
        let bad = |param, message| Err(SamplingError { param, message });
        let t = self.temperature;
        if !(t.is_finite() && t >= 0.0) {
            return bad("temperature", format!("temperature must be a number >= 0, got {t}"));
        }
        let top_p = self.top_p;
        if !(top_p > 0.0 && top_p <= 1.0) {
            return bad("top_p", format!("top_p must be in (0, 1], got {top_p}"));
        }
        if self.top_k == Some(0) {
            // Keeping no token leaves nothing to sample; "off" is `None`.
            return bad("top_k", "top_k must be at least 1 (None keeps every token), got 0".into());
        }
        if self.min_tokens > self.max_tokens {
            let (min, max) = (self.min_tokens, self.max_tokens);
            let message = format!("min_tokens ({min}) must not exceed the maximum tokens ({max})");
            return bad("min_tokens", message);
        }
        if self.bad_words.iter().any(Vec::is_empty) {
            return bad("bad_words", "bad_words must not be empty".into());
        }
        if let Some(&t) = self.bad_words.iter().flatten().find(|&&t| t as usize >= vocab_size) {
            let message = format!("bad_words must encode to tokens in [0, {vocab_size}), got {t}");
            return bad("bad_words", message);
        }
        if self.stop.iter().any(String::is_empty) {
            // An empty string matches everywhere: the request would stop before its first token.
            return bad("stop", "stop strings must not be empty".into());
        }
        if let Some(k) = self.logprobs {
            check_num_logprobs("logprobs", k)?;
        }
        if let Some(k) = self.prompt_logprobs {
            check_num_logprobs("prompt_logprobs", k)?;
        }
        let ids = &self.logprob_token_ids;
        if ids.len() > MAX_LOGPROB_TOKEN_IDS {
            let message = format!(
                "logprob_token_ids names at most {MAX_LOGPROB_TOKEN_IDS} tokens, got {}",
                ids.len()
            );
            return bad("logprob_token_ids", message);
        }
        if let Some(&t) = ids.iter().find(|&&t| t as usize >= vocab_size) {
            let message = format!("logprob_token_ids must be in [0, {vocab_size}), got {t}");
            return bad("logprob_token_ids", message);
        }
        for (param, v) in [
            ("presence_penalty", self.presence_penalty),
            ("frequency_penalty", self.frequency_penalty),
        ] {
            if !(-MAX_PENALTY..=MAX_PENALTY).contains(&v) {
                let message =
                    format!("{param} must be between -{MAX_PENALTY} and {MAX_PENALTY}, got {v}");
                return bad(param, message);
            }
        }
        let r = self.repetition_penalty;
        if !(r.is_finite() && r > 0.0) {
            // It scales logits: 0 would divide by zero, a negative one would flip their order.
            let message = format!("repetition_penalty must be greater than 0 (1 is off), got {r}");
            return bad("repetition_penalty", message);
        }
        if !(0.0..=1.0).contains(&self.min_p) {
            return bad("min_p", format!("min_p must be in [0, 1], got {}", self.min_p));
        }
        match &self.response_format {
            ResponseFormat::JsonSchema { schema, .. } if !schema.is_well_formed() => {
                let message = "response_format's JSON schema is empty, names nodes it does not \
                               have or exceeds its counts"
                    .into();
                return bad("response_format", message);
            }
            ResponseFormat::Choice(choices)
                if !JsonSchema::of_choices(choices).is_well_formed() =>
            {
                let message = format!(
                    "response_format's choices must be 1 to {} non-empty texts of at most as \
                     many bytes",
                    JsonSchema::MAX_ITEMS
                );
                return bad("response_format", message);
            }
            ResponseFormat::StructuralTag(tag) => {
                if let Some(problem) = tag.problem() {
                    return bad("response_format", format!("response_format: {problem}"));
                }
            }
            ResponseFormat::Tokens(ids) => {
                let sorted = ids.windows(2).all(|w| w[0] < w[1]);
                if ids.is_empty() || !sorted {
                    let message = "allowed_token_ids must name at least one token, sorted and \
                                   each once"
                        .into();
                    return bad("allowed_token_ids", message);
                }
                if let Some(&t) = ids.iter().find(|&&t| t as usize >= vocab_size) {
                    let message =
                        format!("allowed_token_ids must be in [0, {vocab_size}), got {t}");
                    return bad("allowed_token_ids", message);
                }
            }
            _ => {}
        }
        self.check_logit_bias(vocab_size)
    }

    /// `logit_bias`: ids in the vocabulary, values in range, sorted by id and each id once (two
    /// entries for one id would add up, and sorted entries find a repeat beside its twin).
    fn check_logit_bias(&self, vocab_size: usize) -> Result<(), SamplingError> {
        let bad = |message| Err(SamplingError { param: "logit_bias", message });
        let mut previous: Option<TokenId> = None;
        for &(token, bias) in &self.logit_bias {
            if token as usize >= vocab_size {
                return bad(format!(
                    "logit_bias token ids must be in [0, {vocab_size}), got {token}"
                ));
            }
            if !(-MAX_LOGIT_BIAS..=MAX_LOGIT_BIAS).contains(&bias) {
                return bad(format!(
                    "logit_bias values must be numbers in [-{MAX_LOGIT_BIAS}, {MAX_LOGIT_BIAS}]; \
                     token {token} has {bias}"
                ));
            }
            if let Some(p) = previous {
                match p.cmp(&token) {
                    Ordering::Less => {}
                    Ordering::Equal => {
                        return bad(format!("logit_bias names token {token} more than once"));
                    }
                    Ordering::Greater => {
                        return bad(format!(
                            "logit_bias must be sorted by token id; got {p} before {token}"
                        ));
                    }
                }
            }
            previous = Some(token);
        }
        Ok(())
    }
}

/// Checks a number of top alternatives per token against [`MAX_LOGPROBS`], naming the field
/// `param`. [`SamplingParams::check`] runs it on `logprobs` and `prompt_logprobs`; a gateway
/// runs it on a count it is given but does not pass on (SGLang's `top_logprobs_num` without
/// `return_logprob`), so that the limit stays one rule.
pub fn check_num_logprobs(param: &'static str, k: u32) -> Result<(), SamplingError> {
    if k <= MAX_LOGPROBS {
        return Ok(());
    }
    Err(SamplingError {
        param,
        message: format!("{param} must be between 0 and {MAX_LOGPROBS}, got {k}"),
    })
}

/// A sampling parameter out of its range.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct SamplingError {
    /// The field, as [`SamplingParams`] names it (one of [`SamplingError::PARAMS`]).
    pub param: &'static str,
    /// What is wrong with it; it names the field by `param` too, so a gateway that calls the
    /// field otherwise can rename it in the message.
    pub message: String,
}

impl SamplingError {
    /// Every name [`SamplingParams::check`] gives a field, so a gateway can tell a sampling
    /// field from the engine's other checks (`/generate` nests these under `sampling_params`).
    pub const PARAMS: [&'static str; 16] = [
        "temperature",
        "top_p",
        "top_k",
        "min_p",
        "presence_penalty",
        "frequency_penalty",
        "repetition_penalty",
        "logit_bias",
        "logprobs",
        "prompt_logprobs",
        "logprob_token_ids",
        "min_tokens",
        "stop",
        "response_format",
        "allowed_token_ids",
        "bad_words",
    ];
}

/// Why a request stopped generating.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum FinishReason {
    /// EOS, a stop token, a stop string or a stop pattern; `matched` says which, and is `None`
    /// for EOS.
    Stop {
        /// The stop token, string or pattern that matched; `None` for EOS.
        matched: Option<StopMatch>,
    },
    /// `max_tokens` reached (or the model length).
    Length,
    /// The client or the engine aborted the request.
    Abort,
}

/// What ended a request with [`FinishReason::Stop`].
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum StopMatch {
    /// A token id (EOS or from `stop_token_ids`).
    Token(TokenId),
    /// One of the request's stop strings.
    Text(String),
    /// One of the request's stop patterns, as given.
    Regex(String),
}

#[cfg(test)]
mod tests {
    use super::*;

    const VOCAB: usize = 100;

    #[test]
    fn the_last_thinking_tag_says_whether_the_thinking_ended() {
        let tags = ThinkingTags { start: 5, end: 6 };
        assert!(!tags.ended_in(&[]) && !tags.ended_in(&[1, 2]));
        assert!(tags.ended_in(&[5, 1, 6, 2]), "closed by the template");
        assert!(!tags.ended_in(&[5, 6, 1, 5, 2]), "an earlier turn closed, this one opened");
        assert!(tags.ended_in(&[6]));
    }

    /// The field `check` names for `params`, `None` when they pass.
    fn param(params: SamplingParams) -> Option<&'static str> {
        let err = params.check(VOCAB).err()?;
        assert!(SamplingError::PARAMS.contains(&err.param), "{} is not in PARAMS", err.param);
        assert!(err.message.contains(err.param), "the message names the field: {}", err.message);
        Some(err.param)
    }

    fn with(f: impl FnOnce(&mut SamplingParams)) -> SamplingParams {
        let mut p = SamplingParams::default();
        f(&mut p);
        p
    }

    #[test]
    fn the_defaults_greedy_and_the_edges_pass() {
        assert_eq!(param(SamplingParams::default()), None);
        assert_eq!(param(SamplingParams::greedy(1)), None);
        let edges = SamplingParams {
            temperature: 0.0,
            top_p: 1.0,
            top_k: Some(1),
            min_tokens: 16,
            max_tokens: 16,
            stop: vec!["x".into()],
            logprobs: Some(MAX_LOGPROBS),
            prompt_logprobs: Some(0),
            presence_penalty: -MAX_PENALTY,
            frequency_penalty: MAX_PENALTY,
            repetition_penalty: 0.01,
            min_p: 1.0,
            logit_bias: vec![(0, -MAX_LOGIT_BIAS), (VOCAB as TokenId - 1, MAX_LOGIT_BIAS)],
            logprob_token_ids: vec![VOCAB as TokenId - 1; MAX_LOGPROB_TOKEN_IDS].into(),
            ..SamplingParams::default()
        };
        assert_eq!(param(edges), None);
        assert_eq!(param(with(|p| p.top_p = f32::MIN_POSITIVE)), None);
    }

    #[test]
    fn bad_words_rule_out_a_words_last_token_after_the_rest_of_it() {
        let p = SamplingParams {
            bad_words: vec![vec![7], vec![1, 2, 3], vec![2, 3]],
            ..Default::default()
        };
        let banned = |output: &[TokenId]| {
            let mut out = vec![99];
            p.banned_after(output, &mut out);
            out
        };
        assert_eq!(banned(&[]), [7], "a one-token word always");
        assert_eq!(banned(&[5, 1]), [7]);
        assert_eq!(banned(&[1, 2]), [3, 7], "two words end in 3, once");
        assert_eq!(banned(&[9, 2]), [3, 7]);
        assert_eq!(banned(&[1, 2, 3]), [7]);
    }

    #[test]
    fn each_bad_field_is_named() {
        // Each case breaks one field of the defaults.
        type Break = fn(&mut SamplingParams);
        let cases: &[(&str, Break)] = &[
            ("temperature", |p| p.temperature = -0.5),
            ("temperature", |p| p.temperature = f32::NAN),
            ("temperature", |p| p.temperature = f32::INFINITY),
            ("top_p", |p| p.top_p = 0.0),
            ("top_p", |p| p.top_p = 1.5),
            ("top_p", |p| p.top_p = f32::NAN),
            ("top_k", |p| p.top_k = Some(0)),
            ("bad_words", |p| p.bad_words = vec![vec![3], vec![]]),
            ("bad_words", |p| p.bad_words = vec![vec![3, VOCAB as TokenId]]),
            ("min_tokens", |p| (p.min_tokens, p.max_tokens) = (20, 10)),
            ("stop", |p| p.stop = vec!["ok".into(), String::new()]),
            ("logprobs", |p| p.logprobs = Some(MAX_LOGPROBS + 1)),
            ("prompt_logprobs", |p| p.prompt_logprobs = Some(MAX_LOGPROBS + 1)),
            ("presence_penalty", |p| p.presence_penalty = 2.5),
            ("presence_penalty", |p| p.presence_penalty = -2.01),
            ("presence_penalty", |p| p.presence_penalty = f32::NAN),
            ("frequency_penalty", |p| p.frequency_penalty = -7.0),
            ("frequency_penalty", |p| p.frequency_penalty = f32::INFINITY),
            ("repetition_penalty", |p| p.repetition_penalty = 0.0),
            ("repetition_penalty", |p| p.repetition_penalty = -1.5),
            ("repetition_penalty", |p| p.repetition_penalty = f32::INFINITY),
            ("repetition_penalty", |p| p.repetition_penalty = f32::NAN),
            ("min_p", |p| p.min_p = 1.5),
            ("min_p", |p| p.min_p = -0.1),
            ("min_p", |p| p.min_p = f32::NAN),
            ("logprob_token_ids", |p| p.logprob_token_ids = vec![0, VOCAB as TokenId].into()),
            ("logprob_token_ids", |p| {
                p.logprob_token_ids = vec![0; MAX_LOGPROB_TOKEN_IDS + 1].into()
            }),
            ("logit_bias", |p| p.logit_bias = vec![(VOCAB as TokenId, 1.0)]),
            ("logit_bias", |p| p.logit_bias = vec![(5, 100.5)]),
            ("logit_bias", |p| p.logit_bias = vec![(5, -101.0)]),
            ("logit_bias", |p| p.logit_bias = vec![(5, f32::NAN)]),
            ("allowed_token_ids", |p| p.response_format = ResponseFormat::Tokens(Arc::from([]))),
            ("allowed_token_ids", |p| {
                p.response_format = ResponseFormat::Tokens(vec![3, 1].into())
            }),
            ("allowed_token_ids", |p| {
                p.response_format = ResponseFormat::Tokens(vec![1, 1].into())
            }),
            ("allowed_token_ids", |p| {
                p.response_format = ResponseFormat::Tokens(vec![1, VOCAB as TokenId].into())
            }),
            ("response_format", |p| {
                p.response_format = ResponseFormat::Choice(vec!["a".into(), String::new()].into())
            }),
            ("response_format", |p| {
                let schema = Arc::new(JsonSchema { nodes: Vec::new() });
                p.response_format = ResponseFormat::JsonSchema { schema, compact: false }
            }),
            ("response_format", |p| {
                let nodes = vec![crate::SchemaNode::AnyOf(vec![crate::SchemaNodeId(1)])];
                let schema = Arc::new(JsonSchema { nodes });
                p.response_format = ResponseFormat::JsonSchema { schema, compact: true }
            }),
            ("logit_bias", |p| p.logit_bias = vec![(5, 1.0), (5, 2.0)]),
            ("logit_bias", |p| p.logit_bias = vec![(7, 1.0), (5, 2.0)]),
        ];
        for &(field, bad) in cases {
            let params = with(bad);
            assert_eq!(param(params.clone()), Some(field), "{params:?}");
        }
    }

    #[test]
    fn the_messages_say_what_is_wrong() {
        let message = |p: SamplingParams| p.check(VOCAB).unwrap_err().to_string();
        assert_eq!(
            message(with(|p| p.presence_penalty = 3.0)),
            "presence_penalty must be between -2 and 2, got 3"
        );
        assert_eq!(
            message(with(|p| p.logit_bias = vec![(2, 1.0), (100, 1.0)])),
            "logit_bias token ids must be in [0, 100), got 100"
        );
        assert_eq!(
            message(with(|p| p.logit_bias = vec![(5, -101.0)])),
            "logit_bias values must be numbers in [-100, 100]; token 5 has -101"
        );
        assert_eq!(
            message(with(|p| p.logit_bias = vec![(3, 1.0), (5, 1.0), (5, 2.0)])),
            "logit_bias names token 5 more than once"
        );
        assert_eq!(
            message(with(|p| p.logprobs = Some(21))),
            "logprobs must be between 0 and 20, got 21"
        );
    }

    #[test]
    fn a_count_of_alternatives_is_checked_under_any_name() {
        assert_eq!(check_num_logprobs("top_logprobs_num", MAX_LOGPROBS), Ok(()));
        let err = check_num_logprobs("top_logprobs_num", MAX_LOGPROBS + 1).unwrap_err();
        assert_eq!(err.param, "top_logprobs_num");
        assert_eq!(err.message, "top_logprobs_num must be between 0 and 20, got 21");
    }
}
