//! Publication after compute: `commit`, and what an abandoned grant gives back.

use std::collections::HashMap;

use routed_types::{BlockHash, SeqId};

use super::{KvCacheManager, PendingGrant};
use crate::CacheError;
use crate::hash::BlockHashMap;
use crate::outcome::{CommitEntry, CommitSummary};

impl KvCacheManager {
    /// Publishes what completed forwards wrote: every block the grant completed becomes
    /// matchable under its hash (unless another block already is), and every planned snapshot the
    /// entry lists becomes matchable under its block's hash (if that block is still cached).
    /// Snapshots planned but not listed are released. Nothing is ever published before this call,
    /// so a writer that fails or is aborted publishes nothing.
    ///
    /// An entry whose request was freed or preempted since the grant publishes nothing and counts
    /// as stale; one whose request was running across a [`KvCacheManager::reset_prefix_cache`]
    /// publishes nothing either.
    ///
    /// Errors (nothing changed): a request's grants committed out of order.
    pub fn commit(&mut self, entries: &[CommitEntry]) -> Result<CommitSummary, CacheError> {
        self.validate_commit(entries)?;
        let mut summary = CommitSummary::default();
        for entry in entries {
            let grant = self.requests.get_mut(&entry.seq_id).and_then(|state| {
                let is_front = state.pending.front().is_some_and(|g| g.grant_id == entry.grant_id);
                if is_front { state.pending.pop_front() } else { None }
            });
            match grant {
                Some(grant) => self.commit_grant(entry, grant, &mut summary),
                None => summary.num_stale_entries += 1,
            }
        }
        Ok(summary)
    }

    /// Each request's entries must name its oldest pending grants, in order.
    fn validate_commit(&self, entries: &[CommitEntry]) -> Result<(), CacheError> {
        let mut num_seen: HashMap<SeqId, usize> = HashMap::with_capacity(entries.len());
        for entry in entries {
            let Some(state) = self.requests.get(&entry.seq_id) else { continue };
            let Some(index) = state.pending.iter().position(|g| g.grant_id == entry.grant_id)
            else {
                continue;
            };
            let seen = num_seen.entry(entry.seq_id).or_default();
            if index != *seen {
                return Err(CacheError::OutOfOrderCommit(entry.seq_id));
            }
            *seen += 1;
        }
        Ok(())
    }

    fn commit_grant(
        &mut self,
        entry: &CommitEntry,
        grant: PendingGrant,
        summary: &mut CommitSummary,
    ) {
        let block_size = self.config.block_size;
        let state = self.requests.get_mut(&entry.seq_id).expect("grant was pending");
        state.num_committed_tokens = grant.end;
        let first = state.num_published_blocks;
        let last = grant.end / block_size;
        state.num_published_blocks = last.max(first);
        // With prefix caching off nothing is hashed, so there is nothing to publish.
        let publishing = self.config.enable_prefix_caching && !state.publish_disabled;
        for index in first..last {
            if !publishing {
                break;
            }
            let parent = index.checked_sub(1).map(|p| state.block_hashes[p]);
            let hash = state.block_hashes[index];
            if self.pool.register(state.block_table[index], hash, parent) {
                summary.num_blocks_published += 1;
            }
        }
        remove_pending(&mut self.pending_blocks, &state.block_hashes[grant.pending_block_range]);
        let Some(snapshots) = &mut self.snapshots else { return };
        for planned in grant.snapshots {
            remove_pending(&mut self.pending_snapshots, &[planned.block_hash]);
            let written = entry.snapshots_written.contains(&planned.slot);
            let block = self.pool.lookup(planned.block_hash).filter(|_| written && publishing);
            let published = block.is_some_and(|block_id| {
                snapshots.publish(
                    planned.slot,
                    planned.block_hash,
                    block_id,
                    self.pool.is_idle(block_id),
                )
            });
            if block.is_none() {
                snapshots.cancel(planned.slot);
            }
            summary.num_snapshots_published += usize::from(published);
        }
    }

    /// Gives back what an uncommitted grant holds outside the block table: its pending hashes and
    /// its reserved snapshot slots.
    pub(super) fn abandon_grant(&mut self, seq_id: SeqId, grant: PendingGrant) {
        let state = &self.requests[&seq_id];
        remove_pending(&mut self.pending_blocks, &state.block_hashes[grant.pending_block_range]);
        let Some(snapshots) = &mut self.snapshots else { return };
        for planned in grant.snapshots {
            remove_pending(&mut self.pending_snapshots, &[planned.block_hash]);
            snapshots.cancel(planned.slot);
        }
    }
}

fn remove_pending(pending: &mut BlockHashMap<u32>, hashes: &[BlockHash]) {
    for hash in hashes {
        let count = pending.get_mut(hash).expect("pending hashes are counted");
        *count -= 1;
        if *count == 0 {
            pending.remove(hash);
        }
    }
}
