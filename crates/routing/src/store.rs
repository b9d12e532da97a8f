//! [`RoutingStore`]: expert-id rows per KV block generation, with a memory cap that never yields
//! wrong or silently missing rows. The crate docs describe the lifecycle and the cap.

use std::fmt;

use routed_types::{BlockGeneration, BlockId, BlockRef, ExpertId, RoutingRows};

use crate::buffers::{
    Buffers, Geometry, MARK_ACCEPT, MARK_DROP, MARK_LISTED, MARK_NONE, ScatterCount, StepRows,
};
use crate::config::{LostBlock, RoutingStoreConfig, StepOutcome};
use crate::error::{LossReason, RoutingError};
use crate::lru::Lru;
use crate::width::{IdWidth, MAX_STORE_EXPERTS};

/// Where one block stands, as far as the store knows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Status {
    /// Nothing ever heard of this block.
    Vacant,
    /// Rows stored; a live request holds the block.
    Held,
    /// Rows stored; the block is cached-only and evictable (linked in the LRU).
    Cached,
    /// The generation was freed; its late writes are dropped.
    Freed,
    /// The generation's rows are gone; its late writes are dropped.
    Lost(LossReason),
}

/// The store's view of one block: the newest generation it heard of and that generation's status.
#[derive(Clone, Copy, Debug)]
struct Entry {
    generation: BlockGeneration,
    status: Status,
}

impl Entry {
    const VACANT: Self = Self { generation: BlockGeneration(0), status: Status::Vacant };

    /// Whether `generation` is newer than anything this entry knows (a new owner).
    fn is_newer(&self, generation: BlockGeneration) -> bool {
        self.status == Status::Vacant || generation > self.generation
    }
}

/// Host store of routing rows, one `[block_size, L, K]` array per KV block generation.
///
/// See the crate docs for the protocol and the memory cap.
pub struct RoutingStore {
    geom: Geometry,
    num_blocks: usize,
    num_experts: u32,
    width: IdWidth,
    block_bytes: usize,
    max_bytes: usize,
    bytes_held: usize,
    entries: Vec<Entry>,
    buffers: Buffers,
    /// One bit per slot: whether that slot's row was written for the block's current generation.
    filled: Vec<u64>,
    lru: Lru,
    /// Per-block scratch for the step being stored; all [`MARK_NONE`] between calls.
    marks: Vec<u8>,
    lost: Vec<LostBlock>,
}

impl fmt::Debug for RoutingStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RoutingStore")
            .field("num_blocks", &self.num_blocks)
            .field("block_size", &self.geom.block_size)
            .field("num_moe_layers", &self.geom.num_moe_layers)
            .field("top_k", &self.geom.top_k)
            .field("width", &self.width)
            .field("bytes_held", &self.bytes_held)
            .field("max_bytes", &self.max_bytes)
            .field("num_cached_blocks", &self.lru.len())
            .field("pending_lost", &self.lost.len())
            .finish()
    }
}

fn invalid(reason: impl Into<String>) -> RoutingError {
    RoutingError::InvalidConfig(reason.into())
}

impl RoutingStore {
    /// An empty store. Fails when a size is zero, `num_experts` is not in `1..=32768` (ids arrive
    /// as non-negative int16) or below `top_k`, or the cap cannot hold one block.
    pub fn new(config: RoutingStoreConfig) -> Result<Self, RoutingError> {
        let c = &config;
        if c.num_blocks == 0 || c.block_size == 0 || c.num_moe_layers == 0 || c.top_k == 0 {
            return Err(invalid("num_blocks, block_size, num_moe_layers and top_k must be > 0"));
        }
        if c.num_blocks > u32::MAX as usize || c.num_blocks.checked_mul(c.block_size).is_none() {
            return Err(invalid("num_blocks exceeds the block id or slot range"));
        }
        if c.num_experts == 0 || c.num_experts > MAX_STORE_EXPERTS {
            return Err(invalid(format!("num_experts must be in 1..={MAX_STORE_EXPERTS}")));
        }
        if c.top_k > c.num_experts as usize {
            return Err(invalid("top_k exceeds num_experts"));
        }
        let width = IdWidth::for_num_experts(c.num_experts);
        let block_bytes = c
            .block_size
            .checked_mul(c.num_moe_layers * c.top_k * width.bytes())
            .ok_or_else(|| invalid("block size in bytes overflows"))?;
        let max_bytes = c.max_bytes.unwrap_or(c.num_blocks.saturating_mul(block_bytes));
        if max_bytes < block_bytes {
            return Err(invalid(format!(
                "max_bytes {max_bytes} cannot hold one block of routing rows ({block_bytes} bytes)"
            )));
        }
        let words_per_block = c.block_size.div_ceil(64);
        Ok(Self {
            geom: Geometry {
                block_size: c.block_size,
                num_moe_layers: c.num_moe_layers,
                top_k: c.top_k,
                words_per_block,
            },
            num_blocks: c.num_blocks,
            num_experts: c.num_experts,
            width,
            block_bytes,
            max_bytes,
            bytes_held: 0,
            entries: vec![Entry::VACANT; c.num_blocks],
            buffers: Buffers::new(width, c.num_blocks),
            filled: vec![0; c.num_blocks * words_per_block],
            lru: Lru::new(c.num_blocks),
            marks: vec![MARK_NONE; c.num_blocks],
            lost: Vec::new(),
        })
    }

    /// Token slots per block.
    pub fn block_size(&self) -> usize {
        self.geom.block_size
    }

    /// Blocks in the pool.
    pub fn num_blocks(&self) -> usize {
        self.num_blocks
    }

    /// MoE layers per row (`L`).
    pub fn num_moe_layers(&self) -> usize {
        self.geom.num_moe_layers
    }

    /// Experts per layer (`K`).
    pub fn top_k(&self) -> usize {
        self.geom.top_k
    }

    /// Routed experts per layer.
    pub fn num_experts(&self) -> u32 {
        self.num_experts
    }

    /// The store-wide id width.
    pub fn width(&self) -> IdWidth {
        self.width
    }

    /// Bytes of rows one stored block takes.
    pub fn block_bytes(&self) -> usize {
        self.block_bytes
    }

    /// The cap on [`Self::bytes_held`].
    pub fn max_bytes(&self) -> usize {
        self.max_bytes
    }

    /// Bytes of stored rows now (the `routed_routing_bytes_held` gauge). Always a multiple of
    /// [`Self::block_bytes`] and at most [`Self::max_bytes`].
    pub fn bytes_held(&self) -> usize {
        self.bytes_held
    }

    /// Blocks whose rows are stored and that no live request holds (evictable at the cap).
    pub fn num_cached_blocks(&self) -> usize {
        self.lru.len()
    }

    /// Stores one step's routing.
    ///
    /// `ids` is the device buffer `(L, N, K)` int16 for the step's `N = slot_mapping.len()`
    /// tokens; token `n` goes to slot `slot_mapping[n] = block_id * block_size + offset`.
    /// `blocks` names the generation of every block the slots touch, as the step was planned.
    /// Rows of a block whose generation is older than one the store has seen, or that was freed
    /// or lost, are dropped; a newer generation replaces the block's rows (the block changed
    /// owner). Malformed input is refused before anything is written.
    pub fn store_step(
        &mut self,
        ids: &[i16],
        slot_mapping: &[usize],
        blocks: &[BlockRef],
    ) -> Result<StepOutcome, RoutingError> {
        let expected = self.geom.row_len() * slot_mapping.len();
        if ids.len() != expected {
            return Err(RoutingError::StepShape { expected, got: ids.len() });
        }
        self.check_ids(ids)?;
        self.mark_listed(blocks)?;
        if let Err(err) = self.check_slots(slot_mapping) {
            self.unmark(blocks);
            return Err(err);
        }
        let mut blocks_refused = 0;
        for &BlockRef { block, generation } in blocks {
            if self.marks[block.index()] == MARK_LISTED && !self.judge(block, generation) {
                blocks_refused += 1;
            }
        }
        let step = StepRows { ids, slot_mapping };
        let ScatterCount { written, dropped } =
            self.buffers.scatter(self.geom, &step, &self.marks, &mut self.filled);
        self.unmark(blocks);
        Ok(StepOutcome { rows_written: written, rows_dropped: dropped, blocks_refused })
    }

    /// Every id must be a valid expert: non-negative and below `num_experts`.
    fn check_ids(&self, ids: &[i16]) -> Result<(), RoutingError> {
        // Reinterpreting as u16 maps negatives above 32767, which is >= num_experts.
        // A max-reduction without early exit vectorises; the slow search runs only on failure.
        let limit = self.num_experts;
        let max = ids.iter().fold(0u16, |m, &v| m.max(v as u16));
        if u32::from(max) < limit {
            return Ok(());
        }
        let index = ids.iter().position(|&v| u32::from(v as u16) >= limit).unwrap_or(0);
        Err(RoutingError::ExpertOutOfRange { index, value: ids[index], num_experts: limit })
    }

    /// Marks the step's blocks [`MARK_LISTED`]; undoes its marks on error.
    fn mark_listed(&mut self, blocks: &[BlockRef]) -> Result<(), RoutingError> {
        for (i, &BlockRef { block, generation }) in blocks.iter().enumerate() {
            let err = if block.index() >= self.num_blocks {
                Some(RoutingError::BlockOutOfRange { block, num_blocks: self.num_blocks })
            } else if self.marks[block.index()] == MARK_LISTED {
                blocks[..i].iter().find(|r| r.block == block && r.generation != generation).map(
                    |r| RoutingError::ConflictingGeneration {
                        block,
                        first: r.generation,
                        second: generation,
                    },
                )
            } else {
                None
            };
            if let Some(err) = err {
                self.unmark(&blocks[..i]);
                return Err(err);
            }
            self.marks[block.index()] = MARK_LISTED;
        }
        Ok(())
    }

    fn unmark(&mut self, blocks: &[BlockRef]) {
        for &BlockRef { block, .. } in blocks {
            if let Some(mark) = self.marks.get_mut(block.index()) {
                *mark = MARK_NONE;
            }
        }
    }

    /// Every slot must lie in the pool, in a block the step lists.
    fn check_slots(&self, slot_mapping: &[usize]) -> Result<(), RoutingError> {
        let num_slots = self.num_blocks * self.geom.block_size;
        for (token, &slot) in slot_mapping.iter().enumerate() {
            if slot >= num_slots {
                return Err(RoutingError::SlotOutOfRange { token, slot, num_slots });
            }
            let b = slot / self.geom.block_size;
            if self.marks[b] == MARK_NONE {
                return Err(RoutingError::BlockNotListed { token, block: BlockId(b as u32) });
            }
        }
        Ok(())
    }

    /// Decides whether this step's rows for `block` are written, adopting a newer generation.
    /// Returns `false` only when the write was refused at the cap.
    fn judge(&mut self, block: BlockId, generation: BlockGeneration) -> bool {
        let b = block.index();
        let entry = self.entries[b];
        let mark = if entry.is_newer(generation) {
            match self.adopt(b, generation) {
                true => MARK_ACCEPT,
                false => {
                    self.marks[b] = MARK_DROP;
                    return false;
                }
            }
        } else if generation < entry.generation {
            MARK_DROP
        } else {
            match entry.status {
                Status::Held | Status::Cached => MARK_ACCEPT,
                Status::Vacant | Status::Freed | Status::Lost(_) => MARK_DROP,
            }
        };
        self.marks[b] = mark;
        true
    }

    /// Hands block `b` to `generation` (held by the request being written) and gives it a
    /// buffer, evicting cached-only blocks if the cap requires. Returns `false`, with the
    /// generation recorded as refused, when only held blocks remain.
    fn adopt(&mut self, b: usize, generation: BlockGeneration) -> bool {
        self.drop_rows(b);
        if !self.make_room() {
            self.entries[b] = Entry { generation, status: Status::Lost(LossReason::Refused) };
            self.report_lost(b, generation, LossReason::Refused);
            return false;
        }
        self.buffers.allocate(b, self.geom.block_size * self.geom.row_len());
        self.bytes_held += self.block_bytes;
        self.entries[b] = Entry { generation, status: Status::Held };
        true
    }

    /// Evicts cached-only blocks, least recently released first, until one more block fits.
    fn make_room(&mut self) -> bool {
        while self.bytes_held + self.block_bytes > self.max_bytes {
            let Some(victim) = self.lru.pop_front() else {
                return false;
            };
            self.drop_rows(victim);
            let generation = self.entries[victim].generation;
            self.entries[victim].status = Status::Lost(LossReason::Evicted);
            self.report_lost(victim, generation, LossReason::Evicted);
        }
        true
    }

    fn report_lost(&mut self, b: usize, generation: BlockGeneration, reason: LossReason) {
        self.lost.push(LostBlock { block: BlockId(b as u32), generation, reason });
    }

    /// Drops block `b`'s buffer, filled bits and LRU link; the entry is the caller's to update.
    fn drop_rows(&mut self, b: usize) {
        if self.buffers.release(b) {
            self.bytes_held -= self.block_bytes;
        }
        let words = self.geom.words_per_block;
        self.filled[b * words..(b + 1) * words].fill(0);
        self.lru.remove(b);
    }

    /// Marks a block cached-only: no live request holds it any more, its rows stay for prefix
    /// hits and become evictable, least recently released first. Call it when the KV cache
    /// manager moves the block into its evictable set. A block generation with no stored rows is
    /// reported lost ([`LossReason::NeverWritten`]) so it stops matching. Stale generations and
    /// out-of-range ids are ignored.
    pub fn release(&mut self, block: BlockId, generation: BlockGeneration) {
        let b = block.index();
        let Some(entry) = self.entries.get(b).copied() else {
            return;
        };
        if entry.is_newer(generation) {
            self.drop_rows(b);
            let status = Status::Lost(LossReason::NeverWritten);
            self.entries[b] = Entry { generation, status };
            self.report_lost(b, generation, LossReason::NeverWritten);
        } else if generation == entry.generation
            && matches!(entry.status, Status::Held | Status::Cached)
        {
            self.entries[b].status = Status::Cached;
            self.lru.push_back(b);
        }
    }

    /// [`Self::release`] for each block.
    pub fn release_blocks(&mut self, blocks: &[BlockRef]) {
        for &BlockRef { block, generation } in blocks {
            self.release(block, generation);
        }
    }

    /// Marks a cached-only block held again (a prefix hit), so the cap no longer evicts it.
    /// Fails when the store has no rows for that generation: the hit must not be used.
    pub fn acquire(
        &mut self,
        block: BlockId,
        generation: BlockGeneration,
    ) -> Result<(), RoutingError> {
        let b = block.index();
        let Some(entry) = self.entries.get(b).copied() else {
            return Err(RoutingError::BlockOutOfRange { block, num_blocks: self.num_blocks });
        };
        if entry.status == Status::Vacant || entry.generation != generation {
            return Err(RoutingError::NotStored { block, generation });
        }
        match entry.status {
            Status::Held => Ok(()),
            Status::Cached => {
                self.lru.remove(b);
                self.entries[b].status = Status::Held;
                Ok(())
            }
            Status::Lost(reason) => Err(RoutingError::AcquireLost { block, generation, reason }),
            Status::Vacant | Status::Freed => Err(RoutingError::NotStored { block, generation }),
        }
    }

    /// Drops a block generation's rows with its KV block (freed, or evicted from the prefix
    /// cache). Later writes for that generation are dropped. A stale generation, or an id out of
    /// range, is ignored.
    pub fn free_block(&mut self, block: BlockId, generation: BlockGeneration) {
        let b = block.index();
        let Some(entry) = self.entries.get(b).copied() else {
            return;
        };
        if entry.is_newer(generation) || entry.generation == generation {
            self.drop_rows(b);
            self.entries[b] = Entry { generation, status: Status::Freed };
        }
    }

    /// [`Self::free_block`] for each block.
    pub fn free_blocks(&mut self, blocks: &[BlockRef]) {
        for &BlockRef { block, generation } in blocks {
            self.free_block(block, generation);
        }
    }

    /// Drops every cached-only block's rows (a prefix-cache reset) and returns those blocks,
    /// oldest release first. Held blocks keep theirs.
    pub fn clear_cached(&mut self) -> Vec<BlockRef> {
        let mut dropped = Vec::with_capacity(self.lru.len());
        while let Some(b) = self.lru.pop_front() {
            self.drop_rows(b);
            self.entries[b].status = Status::Freed;
            dropped.push(BlockRef::new(BlockId(b as u32), self.entries[b].generation));
        }
        dropped
    }

    /// Drops every row and every pending loss report (engine reset after a runner failure).
    /// Generations seen so far are remembered as freed, so late writes for them are dropped;
    /// block generations must keep increasing across the reset. A generation the store never
    /// heard of cannot be recognised as stale: to have its late writes dropped as well, free it
    /// ([`Self::free_blocks`]) right after the reset.
    pub fn reset(&mut self) {
        for entry in &mut self.entries {
            if entry.status != Status::Vacant {
                entry.status = Status::Freed;
            }
        }
        self.buffers.clear();
        self.filled.fill(0);
        self.lru.clear();
        self.bytes_held = 0;
        self.lost.clear();
    }

    /// Takes the block generations whose rows were lost since the last call, in the order they
    /// were lost. The KV cache manager must stop matching them; requests holding a
    /// [`LossReason::Refused`] block must be recomputed or failed.
    pub fn take_lost(&mut self) -> Vec<LostBlock> {
        std::mem::take(&mut self.lost)
    }

    /// Rebuilds rows `start..num_rows` of a request from its block table (position `p` lies in
    /// `block_table[p / block_size]` at offset `p % block_size`), as `[num_rows - start, L, K]`.
    /// Any row that is missing, stale or lost is an error naming its position; nothing is ever
    /// filled in.
    pub fn reconstruct(
        &self,
        block_table: &[BlockRef],
        num_rows: usize,
        start: usize,
    ) -> Result<RoutingRows, RoutingError> {
        if start > num_rows {
            return Err(RoutingError::StartOutOfRange { start, num_rows });
        }
        let bs = self.geom.block_size;
        let capacity = block_table.len().saturating_mul(bs);
        if capacity < num_rows {
            let num_blocks = block_table.len();
            return Err(RoutingError::BlockTableTooShort { num_blocks, capacity, num_rows });
        }
        let mut ids: Vec<ExpertId> = Vec::with_capacity((num_rows - start) * self.geom.row_len());
        let mut position = start;
        while position < num_rows {
            let index = position / bs;
            let (from, to) = (position % bs, bs.min(num_rows - index * bs));
            let BlockRef { block, generation } = block_table[index];
            self.check_rows(block, generation, position, from..to)?;
            self.buffers.gather(self.geom, block.index(), from, to, &mut ids);
            position = index * bs + to;
        }
        Ok(RoutingRows {
            start,
            num_rows: num_rows - start,
            num_moe_layers: self.geom.num_moe_layers,
            top_k: self.geom.top_k,
            ids,
        })
    }

    /// Checks that rows `offsets` of `block` at `generation` are stored; `position` is the
    /// request position of the first of them.
    fn check_rows(
        &self,
        block: BlockId,
        generation: BlockGeneration,
        position: usize,
        offsets: std::ops::Range<usize>,
    ) -> Result<(), RoutingError> {
        let b = block.index();
        let Some(entry) = self.entries.get(b) else {
            return Err(RoutingError::BlockOutOfRange { block, num_blocks: self.num_blocks });
        };
        let missing = |offset: usize| RoutingError::MissingRow {
            position: position + offset - offsets.start,
            block,
            generation,
            offset,
        };
        if entry.is_newer(generation) {
            return Err(missing(offsets.start));
        }
        if generation < entry.generation {
            return Err(RoutingError::StaleBlock { position, block, generation });
        }
        match entry.status {
            Status::Held | Status::Cached => {}
            Status::Lost(reason) => {
                return Err(RoutingError::RowsLost { position, block, generation, reason });
            }
            Status::Vacant | Status::Freed => {
                return Err(RoutingError::StaleBlock { position, block, generation });
            }
        }
        let words = &self.filled[b * self.geom.words_per_block..];
        match offsets.clone().find(|&o| words[o / 64] & (1 << (o % 64)) == 0) {
            Some(offset) => Err(missing(offset)),
            None => Ok(()),
        }
    }
}
