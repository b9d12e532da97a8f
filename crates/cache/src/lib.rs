//! The KV cache bookkeeping of `routed`: a fixed pool of KV blocks with reference counts and
//! generations, chained block hashes for prefix matching, and, for hybrid Mamba2/attention models,
//! a pool of Mamba state snapshots. Pure, synchronous and deterministic: it deals in ids and plain
//! arrays; the tensors live in the model runner.
//!
//! # The step protocol
//!
//! The cache-manager actor owns one [`KvCacheManager`] and serves one round trip per engine step:
//!
//! 1. [`KvCacheManager::add_request`] when a request arrives; [`KvCacheManager::append_token_ids`]
//!    for every sampled token before the step that feeds it back.
//! 2. [`KvCacheManager::get_computed_blocks`] (optional, read-only): the usable cached prefix of a
//!    waiting request.
//! 3. [`KvCacheManager::allocate_slots`] with the step's candidates in priority order and the token
//!    budget: in one call it matches and pins each admission's prefix, allocates blocks, plans the
//!    Mamba snapshots to take, preempts lower-priority running requests when blocks run out, and
//!    returns the exact tokens each request computes ([`SlotGrant`]) or why it got nothing
//!    ([`Deferral`]). Running out of room is an outcome, never an error.
//! 4. The runner executes the step: restores each [`SlotGrant::restore_from`] snapshot into the
//!    request's private live state, runs the forward over the grant's slots
//!    ([`KvCacheManager::slot_mapping`]), writes each [`PlannedSnapshot`].
//! 5. [`KvCacheManager::commit`] with one [`CommitEntry`] per completed grant: only now do the
//!    blocks the forward completed and the snapshots it wrote become matchable.
//! 6. [`KvCacheManager::free`] for finished or aborted requests (after their routing rows were
//!    read), [`KvCacheManager::preempt`] to send a running request back to waiting.
//!
//! [`KvCacheManager::take_dropped_blocks`] reports, after any of these, which blocks' contents
//! died, so the routing store can drop their rows; [`KvCacheManager::forget`] goes the other way
//! when the routing store lost rows. [`KvCacheManager::reset_prefix_cache`] is the explicit
//! reset (admin endpoint, weight change); nothing else ever clears the cache.
//!
//! # Invariants
//!
//! - **Publish after compute.** A block hash or snapshot is matchable only after the forward that
//!   wrote it was committed; an aborted writer publishes nothing; a reset makes every grant made
//!   before it publish nothing.
//! - **Pin before allocate.** An admission's hit blocks are pinned before any block is allocated
//!   for it, so its own allocation can never evict its hit.
//! - **Ref count = owners.** Each block's count is the number of requests whose table holds it;
//!   a release decrements once per request, never once per distinct id.
//! - **No leak.** Every block is exactly one of free, idle (published, unowned, evictable), held,
//!   or scratch. Scratch blocks are never handed out nor evicted.
//! - **Leaf-first eviction.** An idle block is evicted only after its idle descendants.
//! - **Generations.** A block's generation changes each time it is allocated, so data keyed by
//!   `(block, generation)` that belonged to an earlier owner is recognisable.
//! - **Hybrid hits end at a snapshot.** A hybrid request skips exactly to a block boundary whose
//!   snapshot exists; KV matched beyond it is recomputed and not reported as cached. A snapshot
//!   lives only while its KV block is published.
//! - **At least one token computed.** A hit never covers a request's last token.
//! - **Budget.** Skipped tokens are free; granted tokens never exceed the budget.

#![warn(missing_docs)]

mod block_pool;
mod config;
mod error;
mod hash;
mod manager;
mod outcome;
mod slots;
mod snapshot_pool;

pub use block_pool::{AllocatedBlock, BlockPool, EvictedBlock, Released};
pub use config::{CacheConfig, MambaCacheConfig};
pub use error::CacheError;
pub use hash::{ChainParams, ExtraKeys, Fnv1a128, extend_block_hashes, hash_block_tokens};
pub use manager::{KvCacheManager, snapshot_positions};
pub use outcome::{
    CacheRequest, CacheStats, CommitEntry, CommitSummary, ComputedBlocks, DeferReason, Deferral,
    GrantId, PlannedSnapshot, SlotGrant, SlotRequest, StepAllocation,
};
pub use slots::{extend_slot_mapping, slot_for_position};
pub use snapshot_pool::{ReservedSlot, SnapshotPool};
