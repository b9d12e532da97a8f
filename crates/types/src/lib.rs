//! Vocabulary shared by every `routed` crate.
//!
//! This crate holds only plain data: newtype ids, sampling parameters (and the ranges they must
//! lie in, with the output constraints: JSON schemas, and regular expressions and grammars compiled
//! where they are given) and the routing-row layout. It does no I/O and knows nothing of tensors, threads or
//! HTTP, so every other crate can depend on it without pulling anything else in.

mod grammar;
mod history;
mod ids;
mod json_schema;
mod mask;
mod regex;
mod routing;
mod sampling;
mod step;
mod stop_regex;
mod structural_tag;

pub use grammar::{Grammar, GrammarElement, GrammarError};
pub use history::{TokenCount, TokenCounts};
pub use ids::{
    BlockGeneration, BlockHash, BlockId, BlockRef, RequestId, SeqId, SnapshotSlotId, TokenId,
};
pub use json_schema::{JsonSchema, NumberBound, Property, SchemaNode, SchemaNodeId};
pub use mask::TokenMask;
pub use regex::{Regex, RegexError, RegexState};
pub use routing::{ExpertId, RoutingMeta, RoutingRows};
pub use sampling::{
    FinishReason, MAX_LOGIT_BIAS, MAX_LOGPROB_TOKEN_IDS, MAX_LOGPROBS, MAX_PENALTY, ResponseFormat,
    SamplingError, SamplingParams, StopMatch, ThinkingTags, check_num_logprobs,
};
pub use step::{
    PromptLogprobs, SampledToken, ScheduledSeq, SeqContext, StepId, StepOutput, StepPlan,
    StepTokens,
};
pub use stop_regex::{StopPrefix, StopRegex};
pub use structural_tag::{StructuralTag, TagStructure};
