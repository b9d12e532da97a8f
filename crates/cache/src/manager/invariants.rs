//! Whole-manager consistency checks, for tests and debugging.

use routed_types::{BlockHash, BlockId};

use super::{KvCacheManager, RequestState};
use crate::hash::BlockHashMap;

impl KvCacheManager {
    /// Checks every invariant the manager relies on. O(blocks + tokens of all requests); meant
    /// for tests, which call it after every operation.
    ///
    /// - No request holds a block twice or holds a scratch block.
    /// - Each block's reference count equals the number of requests holding it.
    /// - No block is leaked: free + idle + held + scratch = total.
    /// - Every published snapshot belongs to the block currently published under its hash.
    /// - Reserved snapshot slots and pending hashes are exactly those of uncommitted grants.
    /// - Per request: the block table covers exactly the computed tokens; published blocks carry
    ///   the request's own hashes.
    pub fn check_invariants(&self) -> Result<(), String> {
        self.pool.check_invariants()?;
        let mut owners = vec![0u32; self.pool.num_blocks()];
        let mut pending_blocks: BlockHashMap<u32> = BlockHashMap::default();
        let mut pending_snapshots: BlockHashMap<u32> = BlockHashMap::default();
        for (seq_id, state) in &self.requests {
            self.check_request(state).map_err(|message| format!("request {seq_id}: {message}"))?;
            for &block_id in &state.block_table {
                owners[block_id.index()] += 1;
            }
            for grant in &state.pending {
                count(&mut pending_blocks, &state.block_hashes[grant.pending_block_range.clone()]);
                for planned in &grant.snapshots {
                    count(&mut pending_snapshots, &[planned.block_hash]);
                }
            }
        }
        self.check_owners(&owners)?;
        if pending_blocks != self.pending_blocks {
            return Err("pending block hashes disagree with the pending grants".to_owned());
        }
        if pending_snapshots != self.pending_snapshots {
            return Err("pending snapshot hashes disagree with the pending grants".to_owned());
        }
        self.check_snapshots()
    }

    fn check_request(&self, state: &RequestState) -> Result<(), String> {
        let block_size = self.config.block_size;
        let mut seen = std::collections::HashSet::new();
        for &block_id in &state.block_table {
            if self.pool.is_scratch(block_id) {
                return Err(format!("holds scratch block {block_id:?}"));
            }
            if !seen.insert(block_id) {
                return Err(format!("holds {block_id:?} twice"));
            }
        }
        if state.admission.is_none() && !(state.block_table.is_empty() && state.pending.is_empty())
        {
            return Err("waiting but holds blocks or grants".to_owned());
        }
        if state.block_table.len() != state.num_computed_tokens.div_ceil(block_size) {
            return Err(format!(
                "{} blocks for {} computed tokens",
                state.block_table.len(),
                state.num_computed_tokens
            ));
        }
        if state.num_committed_tokens > state.num_computed_tokens
            || state.num_computed_tokens > state.token_ids.len()
        {
            return Err("committed <= computed <= known tokens does not hold".to_owned());
        }
        let expected_hashes =
            if self.config.enable_prefix_caching { state.token_ids.len() / block_size } else { 0 };
        if state.block_hashes.len() != expected_hashes {
            return Err(format!(
                "{} hashes for {expected_hashes} blocks",
                state.block_hashes.len()
            ));
        }
        let published = state.block_table.iter().take(state.num_published_blocks);
        for (&block_id, &hash) in published.zip(&state.block_hashes) {
            if self.pool.block_hash(block_id).is_some_and(|h| h != hash) {
                return Err(format!("{block_id:?} is published under a foreign hash"));
            }
        }
        Ok(())
    }

    fn check_owners(&self, owners: &[u32]) -> Result<(), String> {
        let mut num_held = 0;
        for (index, &num_owners) in owners.iter().enumerate() {
            let block_id = BlockId(index as u32);
            if self.pool.ref_count(block_id) != num_owners {
                return Err(format!(
                    "{block_id:?} has ref count {} but {num_owners} owners",
                    self.pool.ref_count(block_id)
                ));
            }
            num_held += usize::from(num_owners > 0);
        }
        let num_scratch = self.pool.num_blocks() - self.pool.num_usable_blocks();
        let accounted = self.pool.num_free() + self.pool.num_evictable() + num_held + num_scratch;
        if accounted != self.pool.num_blocks() {
            return Err(format!(
                "leak: {} free + {} idle + {num_held} held + {num_scratch} scratch != {}",
                self.pool.num_free(),
                self.pool.num_evictable(),
                self.pool.num_blocks()
            ));
        }
        Ok(())
    }

    fn check_snapshots(&self) -> Result<(), String> {
        let Some(snapshots) = &self.snapshots else {
            return Ok(());
        };
        snapshots.check_invariants(|block_id| self.pool.is_idle(block_id))?;
        for (slot, hash, block_id) in snapshots.iter_published() {
            if self.pool.lookup(hash) != Some(block_id) {
                return Err(format!("{slot:?} belongs to {block_id:?}, which is not cached"));
            }
        }
        let num_planned: usize = self
            .requests
            .values()
            .flat_map(|state| &state.pending)
            .map(|grant| grant.snapshots.len())
            .sum();
        let all_reserved = self
            .requests
            .values()
            .flat_map(|state| &state.pending)
            .flat_map(|grant| &grant.snapshots)
            .all(|planned| snapshots.is_reserved(planned.slot));
        if num_planned != snapshots.num_reserved() || !all_reserved {
            return Err("reserved snapshot slots disagree with the pending grants".to_owned());
        }
        Ok(())
    }
}

fn count(counts: &mut BlockHashMap<u32>, hashes: &[BlockHash]) {
    for &hash in hashes {
        *counts.entry(hash).or_default() += 1;
    }
}
