//! Per-request sampling parameters and the reasons a request ends.

use crate::TokenId;

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
    /// Strings that end the request; the match is cut from the text.
    pub stop: Vec<String>,
    /// How many top alternatives to report beside the sampled token's logprob (`None`: no
    /// logprobs at all).
    pub logprobs: Option<u32>,
    /// Logprobs of the prompt's tokens (each given the tokens before it), with this many top
    /// alternatives; `None`: none. A request asking for them computes its whole prompt (it never
    /// reads the prefix cache).
    pub prompt_logprobs: Option<u32>,
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
            logprobs: None,
            prompt_logprobs: None,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            repetition_penalty: 1.0,
            min_p: 0.0,
            logit_bias: Vec::new(),
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

    /// Whether the logits are changed before a token is chosen (penalties, bias, `min_p`).
    pub fn processes_logits(&self) -> bool {
        self.needs_history() || !self.logit_bias.is_empty() || self.min_p > 0.0
    }
}

/// Why a request stopped generating.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum FinishReason {
    /// EOS, a stop token or a stop string; `matched` says which stop token or string, and is
    /// `None` for EOS.
    Stop {
        /// The stop token or string that matched; `None` for EOS.
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
}
