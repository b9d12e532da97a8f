//! Prefix matching and step allocation: `get_computed_blocks` and `allocate_slots`.

use routed_types::{BlockId, BlockRef, SeqId};

use super::{Admission, KvCacheManager, PendingGrant, RequestState};
use crate::CacheError;
use crate::outcome::{
    ComputedBlocks, DeferReason, Deferral, GrantId, PlannedSnapshot, SlotGrant, SlotRequest,
    StepAllocation,
};

/// What planning one candidate came to.
enum Planned {
    Granted(SlotGrant),
    Deferred(DeferReason),
    /// A running candidate found no room even after preempting every lower-priority one, and was
    /// preempted itself.
    PreemptedSelf,
}

impl KvCacheManager {
    /// The usable cached prefix of a waiting request (new or preempted): for an attention-only
    /// model the longest run of cached blocks from block 0; for a hybrid model the longest such
    /// run that ends at a block with a stored Mamba snapshot. Either is capped so at least one
    /// token is left to compute. Changes nothing: `allocate_slots` pins what it finds then.
    pub fn get_computed_blocks(&self, seq_id: SeqId) -> Result<ComputedBlocks, CacheError> {
        let state = self.state(seq_id)?;
        if state.admission.is_some() {
            return Err(CacheError::AlreadyAdmitted(seq_id));
        }
        Ok(self.find_hit(state))
    }

    fn find_hit(&self, state: &RequestState) -> ComputedBlocks {
        let (num_kv_matched_blocks, num_usable) = self.usable_prefix(state, false);
        let hashes = &state.block_hashes[..num_usable];
        let block_ids: Vec<BlockId> = hashes
            .iter()
            .map(|&h| self.pool.lookup(h).expect("matched hashes are cached"))
            .collect();
        let restore_from = match (&self.snapshots, hashes.last()) {
            (Some(snapshots), Some(&last)) => snapshots.lookup(last),
            _ => None,
        };
        ComputedBlocks {
            num_computed_tokens: num_usable * self.config.block_size,
            block_ids,
            restore_from,
            num_kv_matched_blocks,
        }
    }

    /// `(KV-matched blocks, usable blocks)` of a waiting request. With `include_pending`, blocks
    /// and snapshots that uncommitted grants are computing count as present: the hit the request
    /// would get by waiting for them.
    fn usable_prefix(&self, state: &RequestState, include_pending: bool) -> (usize, usize) {
        if !self.config.enable_prefix_caching || state.skip_reading_prefix_cache {
            return (0, 0);
        }
        let kv_present = |hash| {
            self.pool.lookup(hash).is_some()
                || (include_pending && self.pending_blocks.contains_key(&hash))
        };
        let num_matched = state.block_hashes.iter().take_while(|&&h| kv_present(h)).count();
        let cap = num_matched.min((state.token_ids.len() - 1) / self.config.block_size);
        let Some(snapshots) = &self.snapshots else {
            return (num_matched, cap);
        };
        let snapshot_present = |hash| {
            snapshots.lookup(hash).is_some()
                || (include_pending && self.pending_snapshots.contains_key(&hash))
        };
        let usable = (1..=cap).rev().find(|&n| snapshot_present(state.block_hashes[n - 1]));
        (num_matched, usable.unwrap_or(0))
    }

    /// Plans one step: for each candidate, in priority order, pins its prefix hit (waiting
    /// requests), then allocates the blocks its next tokens need, and returns exactly how many
    /// tokens it computes. Skipped tokens are free; computed ones are charged to `token_budget`,
    /// which is never exceeded.
    ///
    /// ```text
    ///  block table:  | hit (pinned) | held from earlier steps | new blocks (this grant) |
    ///  positions:    0 ........ num_computed_tokens ..... + num_new_tokens
    ///                 skipped or done        computed this step       (slots allocated)
    /// ```
    ///
    /// A candidate that cannot be served gets a [`Deferral`] rather than an error. A running
    /// candidate short of blocks first preempts running candidates listed after it, lowest
    /// priority first, and itself when none is left (`preempted`). A waiting candidate is deferred
    /// when its prefix is being computed by an uncommitted grant and
    /// [`crate::CacheConfig::defer_pending_siblings`] is set.
    ///
    /// For hybrid models a non-final prefill chunk ends on a block boundary whenever that still
    /// computes a token, so every chunk starts where the recurrent state can be snapshotted.
    ///
    /// Errors (nothing changed): an unknown or repeated request id.
    pub fn allocate_slots(
        &mut self,
        candidates: &[SlotRequest],
        token_budget: usize,
    ) -> Result<StepAllocation, CacheError> {
        let ids: Vec<SeqId> = candidates.iter().map(|c| c.seq_id).collect();
        self.validate_ids(&ids)?;
        let mut step =
            StepAllocation { grants: Vec::with_capacity(candidates.len()), ..Default::default() };
        for (index, candidate) in candidates.iter().enumerate() {
            if step.preempted.contains(&candidate.seq_id) {
                continue;
            }
            let budget = token_budget - step.num_scheduled_tokens;
            let lower = &candidates[index + 1..];
            match self.plan_candidate(candidate, budget, lower, &mut step.preempted) {
                Planned::Granted(grant) => {
                    step.num_scheduled_tokens += grant.num_new_tokens;
                    step.grants.push(grant);
                }
                Planned::Deferred(reason) => {
                    self.counters.deferrals += 1;
                    step.deferred.push(Deferral { seq_id: candidate.seq_id, reason });
                }
                Planned::PreemptedSelf => {}
            }
        }
        Ok(step)
    }

    fn plan_candidate(
        &mut self,
        candidate: &SlotRequest,
        budget: usize,
        lower: &[SlotRequest],
        preempted: &mut Vec<SeqId>,
    ) -> Planned {
        let seq_id = candidate.seq_id;
        let state = &self.requests[&seq_id];
        let admitting = state.admission.is_none();
        let hit = if admitting { self.find_hit(state) } else { ComputedBlocks::default() };
        if admitting
            && self.config.defer_pending_siblings
            && self.usable_prefix(state, true).1 > hit.block_ids.len()
        {
            return Planned::Deferred(DeferReason::PendingSibling);
        }
        let start = if admitting { hit.num_computed_tokens } else { state.num_computed_tokens };
        let prefill_len = state.admission.map_or(state.token_ids.len(), |a| a.prefill_len);
        let remaining = state.token_ids.len() - start;
        if remaining == 0 {
            return Planned::Deferred(DeferReason::NoNewTokens);
        }
        let max_new = remaining.min(candidate.max_num_new_tokens).min(budget);
        if max_new == 0 {
            return Planned::Deferred(DeferReason::TokenBudget);
        }
        let num_new = self.align_chunk(start, max_new, prefill_len);
        let num_held = if admitting { hit.block_ids.len() } else { state.block_table.len() };
        let num_needed = (start + num_new).div_ceil(self.config.block_size) - num_held;
        // Idle hit blocks are about to be pinned, so they cannot also be evicted for this request.
        let num_idle_hits = hit.block_ids.iter().filter(|&&b| self.pool.is_idle(b)).count();
        while self.pool.num_allocatable() - num_idle_hits < num_needed {
            if admitting {
                return Planned::Deferred(DeferReason::NoFreeBlocks);
            }
            let victim = lower.iter().rev().map(|c| c.seq_id).find(|victim| {
                !preempted.contains(victim) && self.requests[victim].admission.is_some()
            });
            let victim = victim.unwrap_or(seq_id);
            self.release_request(victim);
            self.counters.preemptions += 1;
            preempted.push(victim);
            if victim == seq_id {
                return Planned::PreemptedSelf;
            }
        }
        Planned::Granted(self.grant(seq_id, hit, start, num_new, prefill_len))
    }

    /// Hybrid models: ends a non-final prefill chunk on a block boundary, unless that would leave
    /// nothing to compute (progress beats the snapshot then).
    fn align_chunk(&self, start: usize, num_new: usize, prefill_len: usize) -> usize {
        let end = start + num_new;
        if !self.config.is_hybrid() || end >= prefill_len {
            return num_new;
        }
        let aligned_end = end - end % self.config.block_size;
        if aligned_end > start { aligned_end - start } else { num_new }
    }

    /// Pins the hit, allocates the new blocks and records the pending publication. Capacity was
    /// checked by the caller.
    fn grant(
        &mut self,
        seq_id: SeqId,
        hit: ComputedBlocks,
        start: usize,
        num_new: usize,
        prefill_len: usize,
    ) -> SlotGrant {
        let block_size = self.config.block_size;
        let end = start + num_new;
        let is_admission = self.requests[&seq_id].admission.is_none();
        if is_admission {
            self.admit(seq_id, &hit, prefill_len);
        }
        let num_held = self.requests[&seq_id].block_table.len();
        let new_blocks: Vec<_> =
            (num_held..end.div_ceil(block_size)).map(|_| self.allocate_block()).collect();
        let state = self.requests.get_mut(&seq_id).expect("validated");
        state.block_table.extend(new_blocks.iter().map(|b| b.block));
        state.num_computed_tokens = end;
        self.counters.prefill_computed += (end.min(prefill_len).saturating_sub(start)) as u64;
        let publishing = self.config.enable_prefix_caching && !state.publish_disabled;
        let pending_block_range =
            if publishing { start / block_size..end / block_size } else { 0..0 };
        for &hash in &state.block_hashes[pending_block_range.clone()] {
            *self.pending_blocks.entry(hash).or_default() += 1;
        }
        let snapshots =
            if publishing { self.plan_snapshots(seq_id, start, end) } else { Vec::new() };
        let grant_id = GrantId(self.next_grant_id);
        self.next_grant_id += 1;
        let state = self.requests.get_mut(&seq_id).expect("validated");
        state.pending.push_back(PendingGrant {
            grant_id,
            end,
            pending_block_range,
            snapshots: snapshots.clone(),
        });
        SlotGrant {
            seq_id,
            grant_id,
            is_admission,
            num_computed_tokens: start,
            num_new_tokens: num_new,
            num_cached_tokens: if is_admission { start } else { 0 },
            new_blocks,
            restore_from: if is_admission { hit.restore_from } else { None },
            snapshots,
        }
    }

    /// Pins a waiting request's hit (before anything is allocated, so the allocation cannot evict
    /// it) and makes the request running. Counts the hit only now that admission is certain.
    fn admit(&mut self, seq_id: SeqId, hit: &ComputedBlocks, prefill_len: usize) {
        for &block_id in &hit.block_ids {
            if self.pool.pin(block_id)
                && let Some(snapshots) = &mut self.snapshots
            {
                snapshots.set_block_idle(block_id, false);
            }
        }
        if let (Some(snapshots), Some(slot)) = (&mut self.snapshots, hit.restore_from) {
            snapshots.touch(slot);
        }
        let block_size = self.config.block_size;
        let num_hit = hit.block_ids.len();
        let divergence =
            (hit.num_kv_matched_blocks > num_hit).then_some(hit.num_kv_matched_blocks * block_size);
        let state = self.requests.get_mut(&seq_id).expect("validated");
        state.block_table.clone_from(&hit.block_ids);
        state.num_published_blocks = num_hit;
        state.num_computed_tokens = hit.num_computed_tokens;
        state.num_committed_tokens = hit.num_computed_tokens;
        state.num_cached_tokens = hit.num_computed_tokens;
        state.admission = Some(Admission { prefill_len, divergence });
        self.counters.hits += u64::from(hit.num_computed_tokens > 0);
        self.counters.prefill_skipped += hit.num_computed_tokens as u64;
    }

    fn allocate_block(&mut self) -> BlockRef {
        let allocated = self.pool.allocate().expect("capacity was checked before granting");
        if let Some(evicted) = allocated.evicted {
            if let Some(snapshots) = &mut self.snapshots {
                snapshots.drop_block(evicted.block_id);
            }
            self.dropped.push(BlockRef::new(evicted.block_id, evicted.generation));
        }
        BlockRef::new(allocated.block_id, allocated.generation)
    }

    /// Reserves slots for the snapshots a hybrid grant must take (see
    /// [`super::snapshot_positions`]).
    /// A position whose snapshot already exists or is already planned is skipped, and so is every
    /// position once the pool has no slot to give: snapshots only improve later hits.
    fn plan_snapshots(&mut self, seq_id: SeqId, start: usize, end: usize) -> Vec<PlannedSnapshot> {
        let block_size = self.config.block_size;
        let Some(snapshots) = &mut self.snapshots else {
            return Vec::new();
        };
        let state = &self.requests[&seq_id];
        let admission = state.admission.expect("granted requests are admitted");
        let positions = super::snapshot_positions(
            block_size,
            admission.prefill_len,
            admission.divergence,
            start..end,
        );
        let mut planned = Vec::with_capacity(positions.len());
        for position in positions {
            let block_hash = state.block_hashes[position / block_size - 1];
            if snapshots.lookup(block_hash).is_some()
                || self.pending_snapshots.contains_key(&block_hash)
            {
                continue;
            }
            let Some(reserved) = snapshots.reserve() else { break };
            *self.pending_snapshots.entry(block_hash).or_default() += 1;
            planned.push(PlannedSnapshot { position, slot: reserved.slot, block_hash });
        }
        planned
    }
}
