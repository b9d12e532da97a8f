//! The crate's one error type.

use std::fmt;

use routed_types::{BlockGeneration, BlockId};

/// Why a block generation's rows are gone although its block may still be cached or held.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum LossReason {
    /// Dropped at the memory cap to make room: the block was cached-only (evictable).
    Evicted,
    /// Never stored: the cap was reached while every stored block was held by a live request.
    Refused,
    /// Released as cached-only before any row for it had been stored, so it has nothing to give
    /// a prefix hit.
    NeverWritten,
}

impl fmt::Display for LossReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Evicted => "evicted at the routing memory cap",
            Self::Refused => "refused at the routing memory cap while every stored block was held",
            Self::NeverWritten => "released before any of its rows was stored",
        })
    }
}

/// Everything the routing store and the encoders can refuse.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum RoutingError {
    /// The store's configuration cannot work.
    #[error("invalid routing store configuration: {0}")]
    InvalidConfig(String),
    /// A step's id slice does not hold `num_moe_layers * tokens * top_k` ids.
    #[error("step rows hold {got} ids, expected {expected} (num_moe_layers x tokens x top_k)")]
    StepShape {
        /// Ids the slot mapping implies.
        expected: usize,
        /// Ids given.
        got: usize,
    },
    /// A step id is negative or not below `num_experts`.
    #[error("step rows: value {value} at index {index} is not an expert id below {num_experts}")]
    ExpertOutOfRange {
        /// Flat index into the `(L, N, K)` slice.
        index: usize,
        /// The offending value.
        value: i16,
        /// The model's expert count.
        num_experts: u32,
    },
    /// A slot lies outside the KV pool.
    #[error("token {token} of the step maps to slot {slot}, outside the {num_slots} slots")]
    SlotOutOfRange {
        /// Index of the token in the step.
        token: usize,
        /// The offending slot.
        slot: usize,
        /// Slots in the pool (`num_blocks * block_size`).
        num_slots: usize,
    },
    /// A block id lies outside the KV pool.
    #[error("block {block} is outside the pool of {num_blocks} blocks")]
    BlockOutOfRange {
        /// The offending block.
        block: BlockId,
        /// Blocks in the pool.
        num_blocks: usize,
    },
    /// A token's slot lies in a block the step's block list does not name.
    #[error("token {token} of the step maps to block {block}, which the step's block list lacks")]
    BlockNotListed {
        /// Index of the token in the step.
        token: usize,
        /// Its block.
        block: BlockId,
    },
    /// The step's block list names one block with two generations.
    #[error("block {block} is listed with generations {first} and {second} in one step")]
    ConflictingGeneration {
        /// The block.
        block: BlockId,
        /// The first generation listed.
        first: BlockGeneration,
        /// The second, different generation listed.
        second: BlockGeneration,
    },
    /// `start` is past the request's row count.
    #[error("routing start {start} is past the request's {num_rows} rows")]
    StartOutOfRange {
        /// The requested first row.
        start: usize,
        /// The request's row count.
        num_rows: usize,
    },
    /// The block table cannot hold the requested rows.
    #[error("a block table of {num_blocks} blocks holds {capacity} rows, fewer than {num_rows}")]
    BlockTableTooShort {
        /// Blocks in the table.
        num_blocks: usize,
        /// `num_blocks * block_size`.
        capacity: usize,
        /// Rows requested.
        num_rows: usize,
    },
    /// No row was ever stored for this position of this block generation.
    #[error(
        "routing row {position} is missing: block {block} generation {generation} has no row at offset {offset}"
    )]
    MissingRow {
        /// Position (row index) in the request.
        position: usize,
        /// The block holding that position.
        block: BlockId,
        /// The generation the block table names.
        generation: BlockGeneration,
        /// Offset of the position in the block.
        offset: usize,
    },
    /// The block was freed or handed to a newer owner: its rows for this generation are gone.
    #[error(
        "routing row {position}: block {block} generation {generation} is stale (freed or reallocated)"
    )]
    StaleBlock {
        /// First position of the request that lies in this block.
        position: usize,
        /// The block.
        block: BlockId,
        /// The generation the block table names.
        generation: BlockGeneration,
    },
    /// The block generation's rows were dropped or never stored because of the memory cap.
    #[error(
        "routing row {position}: rows of block {block} generation {generation} are gone: {reason}"
    )]
    RowsLost {
        /// First position of the request that lies in this block.
        position: usize,
        /// The block.
        block: BlockId,
        /// The generation the block table names.
        generation: BlockGeneration,
        /// Why they are gone.
        reason: LossReason,
    },
    /// A prefix hit asked for a block generation whose rows the store does not hold.
    #[error("block {block} generation {generation} cannot be acquired: no rows are stored for it")]
    NotStored {
        /// The block.
        block: BlockId,
        /// The generation asked for.
        generation: BlockGeneration,
    },
    /// A prefix hit asked for a block generation whose rows were lost.
    #[error("block {block} generation {generation} cannot be acquired: {reason}")]
    AcquireLost {
        /// The block.
        block: BlockId,
        /// The generation asked for.
        generation: BlockGeneration,
        /// Why its rows are gone.
        reason: LossReason,
    },
    /// A `RoutingRows` whose `ids` length disagrees with its shape.
    #[error("routing rows of shape {shape:?} carry {len} ids")]
    RowsShape {
        /// `[rows, L, K]`.
        shape: [usize; 3],
        /// Ids present.
        len: usize,
    },
    /// An id that the requested encoding cannot represent for this model.
    #[error("expert id {id} at index {index} is not below num_experts {num_experts}")]
    IdOutOfRange {
        /// Flat index into the rows.
        index: usize,
        /// The offending id.
        id: u16,
        /// The model's expert count.
        num_experts: u32,
    },
}

impl RoutingError {
    /// The request position a reconstruction failed at, so the caller can recompute from there.
    pub fn position(&self) -> Option<usize> {
        match self {
            Self::MissingRow { position, .. }
            | Self::StaleBlock { position, .. }
            | Self::RowsLost { position, .. } => Some(*position),
            _ => None,
        }
    }
}
