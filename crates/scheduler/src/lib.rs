//! The scheduling policy of `routed`, as plain synchronous code the scheduler actor drives.
//!
//! A step goes:
//!
//! 1. [`Scheduler::begin_step`] drains what the cache manager must hear about (new requests,
//!    sampled tokens, commits of the last forward, frees) into one [`CacheStep`] together with
//!    the step's candidates in priority order and the token budget: one round trip per step.
//! 2. The cache manager answers with a [`GrantedStep`]; [`Scheduler::build_plan`] turns it into the
//!    runner's [`StepPlan`], admitting, preempting and chunking as the grants say.
//! 3. [`Scheduler::apply_output`] appends sampled tokens and checks stop conditions, returning
//!    the events to stream.
//!
//! Sequences that finish wait in `finishing` until the engine has read their routing rows; only
//! [`Scheduler::release`] then frees their blocks, so rows are never read from freed blocks.

mod exchange;
mod grammar;
mod json_lex;
pub mod json_mode;
mod json_schema;
mod lazy_dfa;
mod policy;
mod seq;
mod stop;
mod structural_tag;

pub use exchange::{CacheStep, GrantedStep, PlanError};
pub use policy::{Scheduler, SchedulerConfig, SeqEvent};
pub use seq::{NewSeq, Seq, SeqStatus};
pub use stop::check_stop;

/// Errors of the scheduling policy.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum SchedulerError {
    /// The waiting queue is full.
    #[error("{0} requests are already waiting")]
    Overloaded(usize),
    /// A request id is already in use.
    #[error("duplicate request id {0:?}")]
    Duplicate(routed_types::SeqId),
    /// A request asks for a constrained output and the scheduler was given no vocabulary to
    /// constrain it with.
    #[error("constrained output (response_format) needs the vocabulary's bytes")]
    NoVocabulary,
}
