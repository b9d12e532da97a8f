//! The block-table rows of the step inputs, kept on the device from one step to the next.
//!
//! A decode step changes few tables: a sequence's table grows by one block every `block_size`
//! tokens, and the scheduler hands each step the same shared table (`Arc<[BlockRef]>`) until it
//! does. So the packer remembers which table each row of the device's section holds (a clone of
//! the `Arc`, so its address cannot be reused by another table while remembered) and writes and
//! uploads only rows whose table changed, and of those only the entries past the part both tables
//! share. At 64 sequences of 32k tokens in 16-token blocks, a decode step uploaded 512 KB of
//! tables; now it uploads the few rows that gained a block.
//!
//! The rows are laid out at the step's stride; a step at another stride rewrites every row it
//! uses. The staging buffer and the device section agree on every row remembered here: a row is
//! written into the staging buffer only together with a range to upload, and [`DeviceTables::
//! forget`] drops every row when a step fails between the two.

use super::{Section, StepPacker, put};
use routed_types::{BlockRef, ScheduledSeq};
use std::sync::Arc;

/// Gaps between changed ranges up to this many words (16 KB) are uploaded with them: a copy's
/// launch costs the host more than the device spends on that many bytes.
const MERGE_GAP_WORDS: usize = 4096;

/// Most copies a step's upload is split into; ranges beyond are merged across their smallest
/// gaps.
pub(super) const MAX_UPLOADS: usize = 8;

/// Which table each row of the device's block-table section holds.
#[derive(Debug, Default)]
pub(super) struct DeviceTables {
    /// The stride the rows were written at.
    stride: usize,
    /// Row `i`'s table, `None` where the device row holds nothing known.
    rows: Vec<Option<Arc<[BlockRef]>>>,
}

/// What a row needs written: entries from `first` on, filled with -1 up to `end`.
pub(super) struct RowWrite {
    /// The first entry the device row does not hold.
    pub first: usize,
    /// One past the last word of the row to write (the stride for a row written whole).
    pub end: usize,
}

impl DeviceTables {
    /// Rows at `max_seqs` sequences.
    pub fn new(max_seqs: usize) -> Self {
        Self { stride: 0, rows: vec![None; max_seqs] }
    }

    /// Sets the step's stride; another stride than the last one leaves no row known.
    pub fn set_stride(&mut self, stride: usize) {
        if stride != self.stride {
            self.forget();
            self.stride = stride;
        }
    }

    /// No row is known any more: the next steps write every row they use.
    pub fn forget(&mut self) {
        self.rows.iter_mut().for_each(|r| *r = None);
    }

    /// What row `i` needs written for `table`, `None` when the device row holds it already.
    pub fn plan_row(&self, i: usize, table: &Arc<[BlockRef]>) -> Option<RowWrite> {
        match &self.rows[i] {
            Some(old) if Arc::ptr_eq(old, table) => None,
            Some(old) => {
                let first = old.iter().zip(table.iter()).take_while(|(a, b)| a.block == b.block);
                let first = first.count();
                // Past the new table, the old entries become -1.
                Some(RowWrite { first, end: old.len().max(table.len()) })
            }
            None => Some(RowWrite { first: 0, end: self.stride }),
        }
    }

    /// Row `i` now holds `table` (once it is written and queued for upload).
    pub fn remember(&mut self, i: usize, table: &Arc<[BlockRef]>) {
        self.rows[i] = Some(table.clone());
    }
}

impl StepPacker {
    /// The word ranges of the buffer the last packed step changed, ascending, eight at most (the
    /// first holds every fixed section): copied to the same ranges of the device's buffer, in any
    /// order, before the step's kernels read it.
    pub fn uploads(&self) -> &[Section] {
        &self.uploads
    }

    /// The device's block-table rows are no longer what the last uploads left (its buffer was
    /// lost, or an upload failed): the next step writes and uploads every row it uses.
    pub fn forget_tables(&mut self) {
        self.tables.forget();
    }

    /// Sequence `i`'s block table into its row, as far as the device's row does not hold it, and
    /// the words written into the uploads.
    pub(super) fn pack_table(
        &mut self,
        i: usize,
        s: &ScheduledSeq,
        stride: usize,
        words: &mut [u32],
    ) {
        let Some(w) = self.tables.plan_row(i, &s.block_table) else { return };
        let row = self.layout.block_tables.offset + i * stride;
        let table = &s.block_table;
        for (k, b) in table.iter().enumerate().skip(w.first) {
            put(words, row + k, b.block.index());
        }
        // Entries past the table are never read (positions stop inside it); -1 makes a stray
        // read fault instead of reading another sequence's block.
        words[row + table.len().max(w.first)..row + w.end].fill(u32::MAX);
        if w.first < w.end {
            self.uploads.push(Section { offset: row + w.first, len: w.end - w.first });
        }
        self.tables.remember(i, table);
    }
}

/// `ranges` (ascending, disjoint) merged across gaps of at most [`MERGE_GAP_WORDS`], then across
/// their smallest gaps until at most [`MAX_UPLOADS`] remain; `gaps` is scratch.
pub(super) fn coalesce(ranges: &mut Vec<Section>, gaps: &mut Vec<usize>) {
    let gap = |a: &Section, b: &Section| b.offset - a.end();
    merge_gaps_up_to(ranges, MERGE_GAP_WORDS);
    if ranges.len() > MAX_UPLOADS {
        gaps.clear();
        gaps.extend(ranges.windows(2).map(|w| gap(&w[0], &w[1])));
        gaps.sort_unstable();
        // Merging every gap up to the one that leaves `MAX_UPLOADS` ranges (ties merge more).
        merge_gaps_up_to(ranges, gaps[gaps.len() - MAX_UPLOADS]);
    }
}

fn merge_gaps_up_to(ranges: &mut Vec<Section>, max_gap: usize) {
    let mut kept = 0;
    for i in 0..ranges.len() {
        let r = ranges[i];
        if kept > 0 && r.offset - ranges[kept - 1].end() <= max_gap {
            let last = &mut ranges[kept - 1];
            last.len = r.end() - last.offset;
        } else {
            ranges[kept] = r;
            kept += 1;
        }
    }
    ranges.truncate(kept);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ranges(pairs: &[(usize, usize)]) -> Vec<Section> {
        pairs.iter().map(|&(offset, end)| Section { offset, len: end - offset }).collect()
    }

    #[test]
    fn near_ranges_merge_and_at_most_a_few_copies_remain() {
        let mut gaps = Vec::new();
        let mut r = ranges(&[(0, 10), (12, 20), (20_000, 20_001), (40_000, 40_004)]);
        coalesce(&mut r, &mut gaps);
        assert_eq!(r, ranges(&[(0, 20), (20_000, 20_001), (40_000, 40_004)]));
        // Twelve far ranges: the smallest gaps merge until eight copies remain.
        let far: Vec<_> = (0..12).map(|i| i * 10_000 + i * i * 100).map(|o| (o, o + 1)).collect();
        let mut r = ranges(&far);
        let (first, last) = (r[0].offset, r[11].end());
        coalesce(&mut r, &mut gaps);
        assert_eq!(r.len(), MAX_UPLOADS);
        assert_eq!((r[0].offset, r[MAX_UPLOADS - 1].end()), (first, last));
        assert!(r.windows(2).all(|w| w[0].end() < w[1].offset));
    }
}
