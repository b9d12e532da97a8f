//! Vocabulary shared by every `routed` crate.
//!
//! This crate holds only plain data: newtype ids, sampling parameters and the routing-row layout.
//! It does no I/O and knows nothing of tensors, threads or HTTP, so every other crate can depend
//! on it without pulling anything else in.

mod ids;
mod routing;
mod sampling;
mod step;

pub use ids::{
    BlockGeneration, BlockHash, BlockId, BlockRef, RequestId, SeqId, SnapshotSlotId, TokenId,
};
pub use routing::{ExpertId, RoutingMeta, RoutingRows};
pub use sampling::{FinishReason, SamplingParams, StopMatch};
pub use step::{
    PromptLogprobs, SampledToken, ScheduledSeq, SeqContext, StepId, StepOutput, StepPlan,
};
