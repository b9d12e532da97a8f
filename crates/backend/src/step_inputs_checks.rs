//! The checks of the indices the device trusts, made on each sequence before it is packed, as the
//! CPU model makes them before a forward.

use super::{StepInputError, StepPacker};
use routed_types::ScheduledSeq;

impl StepPacker {
    /// Capacity checks that need only the step's totals.
    pub(super) fn check_totals<'a>(
        &self,
        seqs: impl Iterator<Item = &'a ScheduledSeq> + Clone,
    ) -> Result<(), StepInputError> {
        let c = &self.layout.capacity;
        let taps: usize = seqs.clone().map(|s| s.snapshots.len()).sum();
        let longest = seqs.clone().map(|s| s.block_table.len()).max().unwrap_or(0);
        let tokens: usize = seqs.clone().map(|s| s.token_ids.len()).sum();
        for (what, need, capacity) in [
            ("tokens", tokens, c.max_tokens),
            ("sequences", seqs.count(), c.max_seqs),
            ("snapshot taps", taps, c.max_taps),
            ("block-table entries per sequence", longest, c.max_blocks_per_seq),
        ] {
            if need > capacity {
                return Err(StepInputError::Capacity { what, need, capacity });
            }
        }
        Ok(())
    }

    /// The checks the CPU model makes before a forward, for the indices the device trusts.
    pub(super) fn check_seq(&self, i: usize, s: &ScheduledSeq) -> Result<(), StepInputError> {
        let g = &self.geometry;
        let bad = |message: String| Err(StepInputError::Bad { seq: i, message });
        let end = s.num_computed_tokens + s.token_ids.len();
        if s.token_ids.is_empty() {
            return bad("no tokens".into());
        }
        if let Some(t) = s.token_ids.iter().find(|&&t| t as usize >= g.vocab_size) {
            return bad(format!("token id {t} is outside the vocabulary of {}", g.vocab_size));
        }
        if end > g.max_positions {
            return bad(format!("position {} is past the model's {}", end - 1, g.max_positions));
        }
        if s.block_table.len() * g.block_size < end {
            return bad(format!("{} blocks cannot hold {end} tokens", s.block_table.len()));
        }
        // Entries a device row holds already were checked when they were written.
        let known =
            self.tables.plan_row(i, &s.block_table).map_or(s.block_table.len(), |w| w.first);
        if let Some(b) = s.block_table[known..].iter().find(|b| b.block.index() >= g.num_blocks) {
            return bad(format!("block {b:?} outside the pool of {}", g.num_blocks));
        }
        let Some(num_live) = g.num_live_states else { return Ok(()) };
        match s.live_state {
            Some(l) if l as usize <= num_live => {}
            other => return bad(format!("live state slot {other:?} outside the pool")),
        }
        let restore = s.restore_from.map(|slot| (s.num_computed_tokens, slot));
        for &(pos, slot) in s.snapshots.iter().chain(restore.iter()) {
            if slot.index() >= g.num_snapshot_slots || pos < s.num_computed_tokens || pos > end {
                return bad(format!("bad snapshot {slot:?} at position {pos}"));
            }
        }
        Ok(())
    }
}
