//! The crate's error type: misuse only. Running out of blocks or snapshot slots is an outcome
//! ([`crate::DeferReason`], a skipped snapshot), never an error.

use routed_types::SeqId;

/// A call the cache cannot honour because the caller broke the protocol or the configuration.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum CacheError {
    /// The configuration cannot describe a working cache.
    #[error("invalid cache configuration: {0}")]
    InvalidConfig(String),
    /// The request id is not known to the manager (never added, or already freed).
    #[error("unknown request {0}")]
    UnknownRequest(SeqId),
    /// `add_request` for an id that is already known.
    #[error("request {0} is already known to the cache")]
    DuplicateRequest(SeqId),
    /// The same request id appears twice in one batch call.
    #[error("request {0} appears twice in one call")]
    RepeatedRequest(SeqId),
    /// A request with no prompt tokens.
    #[error("request {0} has an empty prompt")]
    EmptyPrompt(SeqId),
    /// `get_computed_blocks` for a request that already holds blocks.
    #[error("request {0} already holds blocks; prefix lookup is only for waiting requests")]
    AlreadyAdmitted(SeqId),
    /// A slot mapping asked for positions outside the request's allocated blocks.
    #[error("request {seq_id}: positions up to {end} exceed its {num_slots} allocated slots")]
    PositionOutOfRange {
        /// The request.
        seq_id: SeqId,
        /// End (exclusive) of the asked range.
        end: usize,
        /// Slots covered by the request's block table.
        num_slots: usize,
    },
    /// A commit named a grant that is still pending behind an earlier grant of the same request.
    #[error("request {0}: grants must be committed in the order they were made")]
    OutOfOrderCommit(SeqId),
}
