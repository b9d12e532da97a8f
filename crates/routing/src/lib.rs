//! Routing host store: the expert ids the router chose, kept per KV block, rebuilt per request,
//! and encoded for the wire.
//!
//! Pure, synchronous and deterministic: no threads, no async, no tensors. The routing host-cache
//! actor owns one [`RoutingStore`]; everything here runs inside its handlers.
//!
//! # Rows and blocks
//!
//! Row `p` of a request is the top-k expert ids, for every MoE layer, computed when token `p` was
//! the model's input. The store keeps rows where the KV cache keeps the token: slot
//! `block_id * block_size + offset`. Each block holds one `[block_size, L, K]` array of ids, one
//! byte per id when `num_experts <= 256`, two otherwise ([`IdWidth`], one width per store), and a
//! bitmap of which offsets were written, so a row never written is told apart from a written one.
//!
//! Rows are keyed by `BlockRef` (block id and generation). Generations of one block must increase every
//! time the block is handed to a new owner, including across [`RoutingStore::reset`]. That is
//! what makes late messages harmless whatever order they arrive in:
//!
//! - [`RoutingStore::store_step`] scatters a step's `(L, N, K)` int16 ids through its slot
//!   mapping. For each block the step names, an older generation than the store knows, or one
//!   already freed or lost, is dropped; a newer generation replaces the old owner's rows.
//! - [`RoutingStore::free_block`], [`RoutingStore::release`] and [`RoutingStore::acquire`] name
//!   the generation too, and ignore or refuse stale ones.
//! - [`RoutingStore::reconstruct`] returns exactly the rows written for the block generations of
//!   a block table, or an error naming the first position that is missing, stale or lost. It
//!   never fills a gap.
//!
//! # Lifecycle of a block's rows
//!
//! The store mirrors the KV cache manager's view of each block:
//!
//! - **held**: the first accepted write gives the block a buffer; a live request holds it.
//! - **cached-only**: [`RoutingStore::release`] when no request holds the block any more but it
//!   stays in the prefix cache; its rows stay for prefix hits. [`RoutingStore::acquire`] on a
//!   prefix hit makes it held again.
//! - **freed**: [`RoutingStore::free_block`] when the KV block is freed or evicted; the rows go.
//!
//! # Memory cap
//!
//! [`RoutingStore::bytes_held`] counts the bytes of stored row buffers and never exceeds the cap
//! ([`RoutingStoreConfig::max_bytes`]). The default cap holds a buffer for every KV block, so it
//! is never reached and nothing below happens. With a smaller cap, when a block needs a buffer
//! and none fits:
//!
//! 1. The store evicts cached-only blocks, least recently released first, until one fits. Each
//!    victim's generation is recorded as lost and reported by [`RoutingStore::take_lost`] with
//!    [`LossReason::Evicted`]: the KV cache manager must make those blocks stop matching prefix
//!    lookups, so a later hit never lacks rows. A hit that races the report fails in
//!    [`RoutingStore::acquire`] (and in reconstruction) with an explicit error.
//! 2. If only held blocks remain, held rows are never dropped: the new write is refused. The
//!    block generation is recorded as lost ([`LossReason::Refused`]), counted in
//!    [`StepOutcome::blocks_refused`] and reported by [`RoutingStore::take_lost`]; its later
//!    writes are dropped, and reconstructing a request over it fails with
//!    [`RoutingError::RowsLost`] naming the position. The engine fails or recomputes the
//!    requests holding that block.
//!
//! A block released before any of its rows arrived has nothing to give a prefix hit, so it is
//! reported the same way ([`LossReason::NeverWritten`]).
//!
//! # Encodings
//!
//! [`encode_npy`] writes a `.npy` v1.0 file (`|u1` or `<u2`, shape `[rows, L, K]`, C order, data
//! aligned to 64 bytes); [`encode_raw_i32`] writes the flat little-endian int32 array.
//!
//! # Cost
//!
//! `store_step` allocates nothing per token: it validates the step, judges each listed block
//! once (allocating a buffer only for a block's first write), then copies each token's `L * K`
//! ids into its block with one pass over the step.

#![warn(missing_docs)]

mod buffers;
mod config;
mod encode;
mod error;
mod load;
mod lru;
mod store;
mod width;

pub use config::{LostBlock, RoutingStoreConfig, StepOutcome};
pub use encode::{encode_npy, encode_raw_i32, npy_header};
pub use error::{LossReason, RoutingError};
pub use load::{ExpertLoad, Phase};
pub use store::RoutingStore;
pub use width::{IdWidth, MAX_ENCODE_EXPERTS, MAX_STORE_EXPERTS};
