//! The values that cross the manager's boundary: what the scheduler asks for and what it gets.

use routed_types::{BlockHash, BlockId, BlockRef, SeqId, SnapshotSlotId, TokenId};

/// Names one grant of [`crate::KvCacheManager::allocate_slots`], so its commit can name it back.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct GrantId(pub u64);

/// A request as the cache needs to know it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CacheRequest {
    /// The request.
    pub seq_id: SeqId,
    /// Its prompt; at least one token.
    pub prompt_token_ids: Vec<TokenId>,
    /// Mixed into the first block's hash, so only requests with the same salt share a prefix.
    pub cache_salt: Option<String>,
    /// Never read the prefix cache for this request (it wants prompt logprobs from position 0,
    /// which need every prompt position computed). Its blocks are still published.
    pub skip_reading_prefix_cache: bool,
}

impl CacheRequest {
    /// A request with no salt that may read the prefix cache.
    pub fn new(seq_id: SeqId, prompt_token_ids: Vec<TokenId>) -> Self {
        Self { seq_id, prompt_token_ids, ..Self::default() }
    }
}

/// The usable cached prefix of a waiting request, from
/// [`crate::KvCacheManager::get_computed_blocks`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ComputedBlocks {
    /// The cached blocks covering the prefix, in order.
    pub block_ids: Vec<BlockId>,
    /// Tokens the prefix covers: `block_ids.len() * block_size`. Always less than the request's
    /// token count, so at least one token is computed and yields logits.
    pub num_computed_tokens: usize,
    /// Hybrid models: the snapshot holding the Mamba state after `num_computed_tokens` tokens.
    /// `Some` exactly when the hit is not empty.
    pub restore_from: Option<SnapshotSlotId>,
    /// Leading blocks whose hash is cached, before the hybrid snapshot rule and the at-least-one
    /// token cap. The gap to `block_ids.len()` is KV matched but recomputed.
    pub num_kv_matched_blocks: usize,
}

/// One candidate of a step, in priority order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SlotRequest {
    /// The request.
    pub seq_id: SeqId,
    /// Most tokens to compute for it this step (a chunked-prefill cap, `1` for a decode). Skipped
    /// cached tokens do not count.
    pub max_num_new_tokens: usize,
}

impl SlotRequest {
    /// A candidate capped only by the step's token budget.
    pub fn new(seq_id: SeqId) -> Self {
        Self { seq_id, max_num_new_tokens: usize::MAX }
    }

    /// A candidate that computes at most `max_num_new_tokens` tokens this step.
    pub fn with_max(seq_id: SeqId, max_num_new_tokens: usize) -> Self {
        Self { seq_id, max_num_new_tokens }
    }
}

/// A snapshot the runner must take during a granted forward: copy the request's live Mamba state
/// after `position` tokens into `slot`. It becomes matchable under `block_hash` at commit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PlannedSnapshot {
    /// Block boundary (a multiple of `block_size`) the state must be taken at.
    pub position: usize,
    /// Where to write it.
    pub slot: SnapshotSlotId,
    /// Hash of the block that ends at `position`, the key it is published under.
    pub block_hash: BlockHash,
}

/// The slots granted to one request for one step.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SlotGrant {
    /// The request.
    pub seq_id: SeqId,
    /// Names this grant in [`CommitEntry`].
    pub grant_id: GrantId,
    /// Whether this grant admitted the request (its first since it was added or preempted).
    pub is_admission: bool,
    /// Tokens already computed (or skipped) before this step; the step computes positions
    /// `num_computed_tokens .. num_computed_tokens + num_new_tokens`.
    pub num_computed_tokens: usize,
    /// Tokens to compute this step: exactly what was charged to the token budget.
    pub num_new_tokens: usize,
    /// Tokens skipped by a prefix hit at admission (the OpenAI `cached_tokens`); 0 otherwise.
    pub num_cached_tokens: usize,
    /// Blocks appended to the request's block table by this grant, with their new generation
    /// (routing rows are keyed by it). The whole table, hits first, is
    /// [`crate::KvCacheManager::block_table`].
    pub new_blocks: Vec<BlockRef>,
    /// Hybrid admission with a hit: copy this snapshot into the request's live state before the
    /// forward. A hybrid admission without one starts from a zeroed state.
    pub restore_from: Option<SnapshotSlotId>,
    /// Hybrid: snapshots to take during this forward, by increasing position.
    pub snapshots: Vec<PlannedSnapshot>,
}

impl SlotGrant {
    /// Position after the last token this grant computes.
    pub fn end(&self) -> usize {
        self.num_computed_tokens + self.num_new_tokens
    }

    /// The commit to send once the forward completed and wrote every planned snapshot.
    pub fn commit_entry(&self) -> CommitEntry {
        CommitEntry {
            seq_id: self.seq_id,
            grant_id: self.grant_id,
            snapshots_written: self.snapshots.iter().map(|s| s.slot).collect(),
        }
    }
}

/// Why a candidate got nothing this step.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DeferReason {
    /// The step's token budget was spent (or the candidate's own cap was 0).
    TokenBudget,
    /// Not enough free or evictable blocks (for a running candidate: not even after preempting
    /// every lower-priority running candidate).
    NoFreeBlocks,
    /// Another request is computing part of this request's prefix right now; waiting one step
    /// turns that work into a hit.
    PendingSibling,
    /// Every known token is already computed or in flight (the next sampled token is not
    /// appended yet).
    NoNewTokens,
}

/// A candidate that got nothing this step, and why.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Deferral {
    /// The candidate.
    pub seq_id: SeqId,
    /// Why.
    pub reason: DeferReason,
}

/// The outcome of one [`crate::KvCacheManager::allocate_slots`] call: one step's plan.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StepAllocation {
    /// Granted candidates, in candidate order.
    pub grants: Vec<SlotGrant>,
    /// Candidates that got nothing, in candidate order.
    pub deferred: Vec<Deferral>,
    /// Running candidates preempted to make room for higher-priority ones: their blocks are
    /// released and they wait for re-admission (their tokens are kept).
    pub preempted: Vec<SeqId>,
    /// Sum of `num_new_tokens` over the grants; never above the token budget.
    pub num_scheduled_tokens: usize,
}

/// Tells the manager that a granted forward completed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CommitEntry {
    /// The request.
    pub seq_id: SeqId,
    /// The grant whose forward completed.
    pub grant_id: GrantId,
    /// The planned snapshot slots the forward actually wrote; the others are released.
    pub snapshots_written: Vec<SnapshotSlotId>,
}

/// What a [`crate::KvCacheManager::commit`] published.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CommitSummary {
    /// Blocks that became matchable.
    pub num_blocks_published: usize,
    /// Snapshots that became matchable.
    pub num_snapshots_published: usize,
    /// Entries whose request was freed or preempted since the grant: they published nothing.
    pub num_stale_entries: usize,
}

/// Cumulative and current cache figures (the `routed_*` metrics).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CacheStats {
    /// Blocks a request can hold (scratch excluded).
    pub num_blocks_total: usize,
    /// Free blocks.
    pub num_blocks_free: usize,
    /// Published blocks, held or idle.
    pub num_blocks_cached: usize,
    /// Published blocks no request holds; reclaimable.
    pub num_blocks_evictable: usize,
    /// Snapshot slots in the pool (0 for attention-only models).
    pub num_snapshot_slots_total: usize,
    /// Snapshot slots holding a published snapshot.
    pub num_snapshot_slots_used: usize,
    /// Admissions that skipped at least one token.
    pub num_prefix_cache_hits: u64,
    /// Prefill tokens computed (positions below the request's length at admission).
    pub num_prefill_tokens_computed: u64,
    /// Prefill tokens skipped thanks to hits.
    pub num_prefill_tokens_skipped: u64,
    /// Candidates deferred, any reason, counted once per step each.
    pub num_deferrals: u64,
    /// Running requests preempted by `allocate_slots` or `preempt`.
    pub num_preemptions: u64,
}
