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
