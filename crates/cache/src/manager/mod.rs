//! [`KvCacheManager`]: per-request block tables over the block pool and the snapshot pool, and the
//! step protocol (see the crate docs).

mod allocate;
mod commit;
mod invariants;
mod snapshots;

use std::collections::{HashMap, VecDeque};
use std::ops::Range;

use routed_types::{BlockGeneration, BlockHash, BlockId, BlockRef, SeqId, TokenId};

pub use snapshots::snapshot_positions;

use crate::block_pool::{BlockPool, Released};
use crate::hash::{BlockHashMap, ChainParams, extend_block_hashes};
use crate::outcome::{CacheRequest, CacheStats, GrantId, PlannedSnapshot};
use crate::slots::{extend_slot_mapping, slot_for_position};
use crate::snapshot_pool::SnapshotPool;
use crate::{CacheConfig, CacheError};

/// Owns the KV block pool and, for hybrid models, the Mamba snapshot pool; keeps every request's
/// block table, token ids and block hashes; plans each step's slots and publishes what the forward
/// wrote. Pure and synchronous: it deals in ids, never in tensors.
#[derive(Debug)]
pub struct KvCacheManager {
    config: CacheConfig,
    pool: BlockPool,
    snapshots: Option<SnapshotPool>,
    requests: HashMap<SeqId, RequestState>,
    /// Hashes of blocks that uncommitted grants are computing, with multiplicity.
    pending_blocks: BlockHashMap<u32>,
    /// Hashes that uncommitted grants will publish a snapshot under, with multiplicity.
    pending_snapshots: BlockHashMap<u32>,
    /// Blocks whose content died since the last drain, with the generation it was written under.
    dropped: Vec<BlockRef>,
    next_grant_id: u64,
    counters: Counters,
}

#[derive(Clone, Copy, Debug, Default)]
struct Counters {
    hits: u64,
    prefill_computed: u64,
    prefill_skipped: u64,
    deferrals: u64,
    preemptions: u64,
}

/// What the manager knows of one request.
#[derive(Clone, Debug)]
struct RequestState {
    token_ids: Vec<TokenId>,
    num_prompt_tokens: usize,
    cache_salt: Option<String>,
    skip_reading_prefix_cache: bool,
    /// Hash of every complete block of `token_ids`.
    block_hashes: Vec<BlockHash>,
    block_table: Vec<BlockId>,
    /// Tokens computed or in flight (granted); the next grant starts here.
    num_computed_tokens: usize,
    /// Tokens whose forward was committed.
    num_committed_tokens: usize,
    /// Leading blocks already published, or decided not to be.
    num_published_blocks: usize,
    /// Tokens skipped at the last admission.
    num_cached_tokens: usize,
    /// `Some` from admission until preemption or free.
    admission: Option<Admission>,
    /// Granted, uncommitted steps, oldest first.
    pending: VecDeque<PendingGrant>,
    /// Set when the prefix cache was reset under this running request: what it computes from
    /// now on depends on pre-reset state and must never match.
    publish_disabled: bool,
}

#[derive(Clone, Copy, Debug)]
struct Admission {
    /// Tokens known at admission: the prefill covers `0..prefill_len`.
    prefill_len: usize,
    /// Where the request's KV match ended, when it extends past the usable hit: a sibling sharing
    /// exactly this prefix could resume here if a snapshot were taken.
    divergence: Option<usize>,
}

#[derive(Clone, Debug)]
struct PendingGrant {
    grant_id: GrantId,
    end: usize,
    /// Block indices whose hashes were added to `pending_blocks`.
    pending_block_range: Range<usize>,
    snapshots: Vec<PlannedSnapshot>,
}

impl KvCacheManager {
    /// A manager with an empty cache.
    pub fn new(config: CacheConfig) -> Result<Self, CacheError> {
        config.validate()?;
        let pool = BlockPool::new(config.num_blocks, config.num_scratch_blocks);
        let snapshots = config.mamba.as_ref().map(|m| SnapshotPool::new(m.num_snapshot_slots));
        Ok(Self {
            config,
            pool,
            snapshots,
            requests: HashMap::new(),
            pending_blocks: BlockHashMap::default(),
            pending_snapshots: BlockHashMap::default(),
            dropped: Vec::new(),
            next_grant_id: 0,
            counters: Counters::default(),
        })
    }

    /// The configuration.
    pub fn config(&self) -> &CacheConfig {
        &self.config
    }

    /// Tokens per block.
    pub fn block_size(&self) -> usize {
        self.config.block_size
    }

    /// The block pool, for inspection.
    pub fn block_pool(&self) -> &BlockPool {
        &self.pool
    }

    /// The snapshot pool of a hybrid model, for inspection.
    pub fn snapshot_pool(&self) -> Option<&SnapshotPool> {
        self.snapshots.as_ref()
    }

    /// Starts tracking a request (waiting: it holds nothing until a grant admits it).
    pub fn add_request(&mut self, request: CacheRequest) -> Result<(), CacheError> {
        let CacheRequest { seq_id, prompt_token_ids, cache_salt, skip_reading_prefix_cache } =
            request;
        if self.requests.contains_key(&seq_id) {
            return Err(CacheError::DuplicateRequest(seq_id));
        }
        if prompt_token_ids.is_empty() {
            return Err(CacheError::EmptyPrompt(seq_id));
        }
        let mut state = RequestState {
            num_prompt_tokens: prompt_token_ids.len(),
            token_ids: prompt_token_ids,
            cache_salt,
            skip_reading_prefix_cache,
            block_hashes: Vec::new(),
            block_table: Vec::new(),
            num_computed_tokens: 0,
            num_committed_tokens: 0,
            num_published_blocks: 0,
            num_cached_tokens: 0,
            admission: None,
            pending: VecDeque::new(),
            publish_disabled: false,
        };
        extend_hashes(&self.config, &mut state);
        self.requests.insert(seq_id, state);
        Ok(())
    }

    /// Appends generated tokens to a request (each sampled token, before the step that feeds it
    /// back). Blocks they complete are hashed now and published once computed.
    pub fn append_token_ids(
        &mut self,
        seq_id: SeqId,
        token_ids: &[TokenId],
    ) -> Result<(), CacheError> {
        let state = self.requests.get_mut(&seq_id).ok_or(CacheError::UnknownRequest(seq_id))?;
        state.token_ids.extend_from_slice(token_ids);
        extend_hashes(&self.config, state);
        Ok(())
    }

    /// Releases the blocks of running requests so they wait for re-admission, keeping their
    /// tokens; their uncommitted grants will publish nothing.
    pub fn preempt(&mut self, seq_ids: &[SeqId]) -> Result<(), CacheError> {
        self.validate_ids(seq_ids)?;
        for &seq_id in seq_ids {
            self.release_request(seq_id);
            self.counters.preemptions += 1;
        }
        Ok(())
    }

    /// Forgets requests (finished or aborted), releasing their blocks once per request: a block
    /// several of them share loses one owner per request. Their uncommitted grants will publish
    /// nothing.
    pub fn free(&mut self, seq_ids: &[SeqId]) -> Result<(), CacheError> {
        self.validate_ids(seq_ids)?;
        for &seq_id in seq_ids {
            self.release_request(seq_id);
            self.requests.remove(&seq_id);
        }
        Ok(())
    }

    fn validate_ids(&self, seq_ids: &[SeqId]) -> Result<(), CacheError> {
        let mut seen = std::collections::HashSet::with_capacity(seq_ids.len());
        for &seq_id in seq_ids {
            if !self.requests.contains_key(&seq_id) {
                return Err(CacheError::UnknownRequest(seq_id));
            }
            if !seen.insert(seq_id) {
                return Err(CacheError::RepeatedRequest(seq_id));
            }
        }
        Ok(())
    }

    /// Drops a request's uncommitted grants and releases its blocks, tail first, leaving it
    /// waiting with its tokens.
    fn release_request(&mut self, seq_id: SeqId) {
        let state = self.requests.get_mut(&seq_id).expect("validated");
        let pending = std::mem::take(&mut state.pending);
        let table = std::mem::take(&mut state.block_table);
        state.admission = None;
        state.num_computed_tokens = 0;
        state.num_committed_tokens = 0;
        state.num_published_blocks = 0;
        state.publish_disabled = false;
        for grant in pending {
            self.abandon_grant(seq_id, grant);
        }
        for &block_id in table.iter().rev() {
            self.release_block(block_id);
        }
    }

    fn release_block(&mut self, block_id: BlockId) {
        match self.pool.release(block_id) {
            Released::StillHeld => {}
            Released::Idle => {
                if let Some(snapshots) = &mut self.snapshots {
                    snapshots.set_block_idle(block_id, true);
                }
            }
            Released::Freed { generation } => {
                self.dropped.push(BlockRef::new(block_id, generation))
            }
        }
    }

    /// Drops every cached block no request holds, with its snapshot, and makes every held block
    /// stop matching (so nothing computed before the reset, e.g. with old weights, is ever hit
    /// again). Returns the dropped blocks, whose routing rows should go; they are also reported by
    /// [`KvCacheManager::take_dropped_blocks`]. Running requests keep their blocks but publish
    /// nothing more.
    pub fn reset_prefix_cache(&mut self) -> Vec<BlockRef> {
        for state in self.requests.values_mut() {
            state.publish_disabled |= state.admission.is_some();
        }
        if let Some(snapshots) = &mut self.snapshots {
            let blocks: Vec<BlockId> = snapshots.iter_published().map(|(_, _, b)| b).collect();
            for block_id in blocks {
                snapshots.drop_block(block_id);
            }
        }
        let dropped: Vec<_> = self
            .pool
            .drop_all_published()
            .into_iter()
            .map(|evicted| BlockRef::new(evicted.block_id, evicted.generation))
            .collect();
        self.dropped.extend_from_slice(&dropped);
        dropped
    }

    /// Makes the given blocks stop matching (the routing store lost their rows). An entry whose
    /// generation is not the block's current one is ignored: that content is already gone. A held
    /// block stays with its owners but is never published in this generation. Returns how many
    /// blocks were affected.
    pub fn forget(&mut self, blocks: &[BlockRef]) -> usize {
        let mut num_forgotten = 0;
        for &BlockRef { block: block_id, generation } in blocks {
            let in_range = block_id.index() < self.pool.num_blocks();
            if !in_range
                || self.pool.is_scratch(block_id)
                || self.pool.generation(block_id) != generation
            {
                continue;
            }
            let held = self.pool.ref_count(block_id) > 0;
            if held {
                self.pool.forbid_publish(block_id);
            }
            let Some(evicted) = self.pool.unregister(block_id) else {
                num_forgotten += usize::from(held);
                continue;
            };
            if let Some(snapshots) = &mut self.snapshots {
                snapshots.drop_block(block_id);
            }
            if !held {
                self.dropped.push(BlockRef::new(block_id, evicted.generation));
            }
            num_forgotten += 1;
        }
        num_forgotten
    }

    /// Blocks whose content died (evicted, freed unpublished, reset, forgotten) since the last
    /// call, with the generation that content was written under. The routing store drops their
    /// rows.
    pub fn take_dropped_blocks(&mut self) -> Vec<BlockRef> {
        std::mem::take(&mut self.dropped)
    }

    /// Current and cumulative figures.
    pub fn stats(&self) -> CacheStats {
        let snapshots = self.snapshots.as_ref();
        CacheStats {
            num_blocks_total: self.pool.num_usable_blocks(),
            num_blocks_free: self.pool.num_free(),
            num_blocks_cached: self.pool.num_cached(),
            num_blocks_evictable: self.pool.num_evictable(),
            num_snapshot_slots_total: snapshots.map_or(0, SnapshotPool::num_slots),
            num_snapshot_slots_used: snapshots.map_or(0, SnapshotPool::num_published),
            num_prefix_cache_hits: self.counters.hits,
            num_prefill_tokens_computed: self.counters.prefill_computed,
            num_prefill_tokens_skipped: self.counters.prefill_skipped,
            num_deferrals: self.counters.deferrals,
            num_preemptions: self.counters.preemptions,
        }
    }

    fn state(&self, seq_id: SeqId) -> Result<&RequestState, CacheError> {
        self.requests.get(&seq_id).ok_or(CacheError::UnknownRequest(seq_id))
    }

    /// Whether the request is known.
    pub fn contains_request(&self, seq_id: SeqId) -> bool {
        self.requests.contains_key(&seq_id)
    }

    /// The request's block table: block `i` holds positions `i * block_size ..`.
    pub fn block_table(&self, seq_id: SeqId) -> Result<&[BlockId], CacheError> {
        Ok(&self.state(seq_id)?.block_table)
    }

    /// The current generation of every block in the request's table, in table order (routing rows
    /// are keyed by `(block, generation)`).
    pub fn block_generations(&self, seq_id: SeqId) -> Result<Vec<BlockGeneration>, CacheError> {
        let table = self.block_table(seq_id)?;
        Ok(table.iter().map(|&block_id| self.pool.generation(block_id)).collect())
    }

    /// Tokens computed or in flight for the request.
    pub fn num_computed_tokens(&self, seq_id: SeqId) -> Result<usize, CacheError> {
        Ok(self.state(seq_id)?.num_computed_tokens)
    }

    /// Tokens the manager knows for the request (prompt plus appended).
    pub fn num_tokens(&self, seq_id: SeqId) -> Result<usize, CacheError> {
        Ok(self.state(seq_id)?.token_ids.len())
    }

    /// Tokens the request skipped at its last admission (the OpenAI `cached_tokens`).
    pub fn num_cached_tokens(&self, seq_id: SeqId) -> Result<usize, CacheError> {
        Ok(self.state(seq_id)?.num_cached_tokens)
    }

    /// Hashes of the request's complete blocks (empty when prefix caching is off).
    pub fn block_hashes(&self, seq_id: SeqId) -> Result<&[BlockHash], CacheError> {
        Ok(&self.state(seq_id)?.block_hashes)
    }

    /// KV slot of every position in `positions` of the request, in order (see
    /// [`slot_for_position`]).
    pub fn slot_mapping(
        &self,
        seq_id: SeqId,
        positions: Range<usize>,
    ) -> Result<Vec<u64>, CacheError> {
        let table = self.block_table(seq_id)?;
        let num_slots = table.len() * self.config.block_size;
        if positions.end > num_slots {
            return Err(CacheError::PositionOutOfRange { seq_id, end: positions.end, num_slots });
        }
        let mut slots = Vec::with_capacity(positions.len());
        extend_slot_mapping(table, self.config.block_size, positions, &mut slots);
        Ok(slots)
    }

    /// The reserved scratch blocks, for dummy forwards.
    pub fn scratch_blocks(&self) -> Vec<BlockId> {
        self.pool.scratch_blocks().map(BlockId).collect()
    }

    /// Slots for a dummy forward of `num_tokens` tokens: the scratch blocks' slots, reused
    /// cyclically. Empty when there are no scratch blocks.
    pub fn scratch_slot_mapping(&self, num_tokens: usize) -> Vec<u64> {
        let scratch = self.scratch_blocks();
        let num_slots = scratch.len() * self.config.block_size;
        if num_slots == 0 {
            return Vec::new();
        }
        (0..num_tokens)
            .map(|p| slot_for_position(&scratch, self.config.block_size, p % num_slots))
            .collect()
    }
}

/// Hashes the blocks `state`'s tokens completed since its last call.
fn extend_hashes(config: &CacheConfig, state: &mut RequestState) {
    if !config.enable_prefix_caching {
        return;
    }
    let params = ChainParams {
        block_size: config.block_size,
        num_prompt_tokens: state.num_prompt_tokens,
        cache_salt: state.cache_salt.as_deref(),
        hash_generated_positions: config.hash_generated_positions,
    };
    extend_block_hashes(&mut state.block_hashes, &state.token_ids, &params);
}
