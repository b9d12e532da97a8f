//! The Mamba snapshot pool of a hybrid model: a fixed number of slots, each holding every Mamba
//! layer's conv and SSM state at one block boundary of one token chain.
//!
//! A snapshot is published under the hash of the KV block that *ends* at its boundary (the state
//! after position `p` goes with block `p / B - 1`), so the snapshot index is a subset of the KV
//! index: a snapshot exists only while that block is published, and dropping the block drops the
//! snapshot. Dropping a snapshot leaves the block alone.
//!
//! Slot lifecycle: `free -> reserved` when a step plans to write it, `reserved -> published` when
//! the forward that wrote it is committed, `reserved -> free` when that forward is abandoned,
//! `published -> free` when evicted (LRU among snapshots whose KV block is idle; a snapshot of a
//! held block may be the restore source of a running request) or when its block is dropped.

use std::collections::{BTreeSet, HashMap};

use routed_types::{BlockHash, BlockId, SnapshotSlotId};

use crate::hash::BlockHashMap;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum SlotState {
    Free,
    Reserved,
    Published(PublishedSlot),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct PublishedSlot {
    hash: BlockHash,
    block_id: BlockId,
    last_used: u64,
    /// Whether the KV block is idle, which makes the snapshot evictable.
    block_idle: bool,
}

/// A slot handed out by [`SnapshotPool::reserve`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReservedSlot {
    /// The slot, reserved for the caller.
    pub slot: SnapshotSlotId,
    /// The snapshot evicted to make room: its hash and KV block.
    pub evicted: Option<(BlockHash, BlockId)>,
}

/// Fixed pool of Mamba snapshot slots with a hash index and LRU eviction.
#[derive(Clone, Debug)]
pub struct SnapshotPool {
    slots: Vec<SlotState>,
    /// Free slots, popped from the end.
    free: Vec<SnapshotSlotId>,
    by_hash: BlockHashMap<SnapshotSlotId>,
    by_block: HashMap<BlockId, SnapshotSlotId>,
    /// Published snapshots whose KV block is idle, keyed by `(last_used, slot)`.
    evictable: BTreeSet<(u64, SnapshotSlotId)>,
    num_reserved: usize,
    clock: u64,
}

impl SnapshotPool {
    /// A pool of `num_slots` free slots.
    ///
    /// # Panics
    /// If `num_slots` does not fit a `u32` slot id.
    pub fn new(num_slots: usize) -> Self {
        let total = u32::try_from(num_slots).expect("snapshot slot ids are u32");
        Self {
            slots: vec![SlotState::Free; num_slots],
            free: (0..total).rev().map(SnapshotSlotId).collect(),
            by_hash: BlockHashMap::default(),
            by_block: HashMap::new(),
            evictable: BTreeSet::new(),
            num_reserved: 0,
            clock: 0,
        }
    }

    /// Slots in the pool.
    pub fn num_slots(&self) -> usize {
        self.slots.len()
    }

    /// Slots holding a published snapshot.
    pub fn num_published(&self) -> usize {
        self.by_hash.len()
    }

    /// Slots reserved by a step that has not been committed yet.
    pub fn num_reserved(&self) -> usize {
        self.num_reserved
    }

    /// Free slots.
    pub fn num_free(&self) -> usize {
        self.free.len()
    }

    /// The slot holding the snapshot published under `hash`.
    pub fn lookup(&self, hash: BlockHash) -> Option<SnapshotSlotId> {
        self.by_hash.get(&hash).copied()
    }

    /// The slot holding the snapshot of KV block `block_id`.
    pub fn slot_of_block(&self, block_id: BlockId) -> Option<SnapshotSlotId> {
        self.by_block.get(&block_id).copied()
    }

    /// The hash and KV block of the snapshot published in `slot`.
    pub fn published(&self, slot: SnapshotSlotId) -> Option<(BlockHash, BlockId)> {
        match self.slots[slot.index()] {
            SlotState::Published(p) => Some((p.hash, p.block_id)),
            _ => None,
        }
    }

    /// Reserves a slot for a snapshot a step will write: a free one, else the least recently used
    /// evictable snapshot's. `None` when every slot is reserved or guards a held block.
    pub fn reserve(&mut self) -> Option<ReservedSlot> {
        let (slot, evicted) = match self.free.pop() {
            Some(slot) => (slot, None),
            None => {
                let &(_, slot) = self.evictable.first()?;
                let (hash, block_id) = self.published(slot).expect("evictable slots are published");
                self.drop_block(block_id);
                let popped = self.free.pop();
                debug_assert_eq!(popped, Some(slot));
                (slot, Some((hash, block_id)))
            }
        };
        self.slots[slot.index()] = SlotState::Reserved;
        self.num_reserved += 1;
        Some(ReservedSlot { slot, evicted })
    }

    /// Gives a reserved slot back unwritten (its writer was aborted or skipped it).
    ///
    /// # Panics
    /// If the slot is not reserved.
    pub fn cancel(&mut self, slot: SnapshotSlotId) {
        assert_eq!(self.slots[slot.index()], SlotState::Reserved, "{slot:?} is not reserved");
        self.slots[slot.index()] = SlotState::Free;
        self.num_reserved -= 1;
        self.free.push(slot);
    }

    /// Publishes a reserved slot as the snapshot of KV block `block_id`, published under `hash`.
    /// Returns false, freeing the slot, when a snapshot for `hash` already exists.
    ///
    /// # Panics
    /// If the slot is not reserved, or `block_id` already has a snapshot under another hash.
    pub fn publish(
        &mut self,
        slot: SnapshotSlotId,
        hash: BlockHash,
        block_id: BlockId,
        block_idle: bool,
    ) -> bool {
        if self.by_hash.contains_key(&hash) {
            self.cancel(slot);
            return false;
        }
        assert_eq!(self.slots[slot.index()], SlotState::Reserved, "{slot:?} is not reserved");
        assert!(!self.by_block.contains_key(&block_id), "{block_id:?} already has a snapshot");
        let last_used = self.tick();
        self.slots[slot.index()] =
            SlotState::Published(PublishedSlot { hash, block_id, last_used, block_idle });
        self.num_reserved -= 1;
        self.by_hash.insert(hash, slot);
        self.by_block.insert(block_id, slot);
        if block_idle {
            self.evictable.insert((last_used, slot));
        }
        true
    }

    /// Marks a published snapshot as just used (a restore), for LRU.
    pub fn touch(&mut self, slot: SnapshotSlotId) {
        let tick = self.tick();
        if let SlotState::Published(p) = &mut self.slots[slot.index()] {
            if p.block_idle {
                self.evictable.remove(&(p.last_used, slot));
                self.evictable.insert((tick, slot));
            }
            p.last_used = tick;
        }
    }

    /// Records that KV block `block_id` became idle (`true`) or held (`false`); only snapshots of
    /// idle blocks can be evicted.
    pub fn set_block_idle(&mut self, block_id: BlockId, idle: bool) {
        let Some(slot) = self.slot_of_block(block_id) else { return };
        let SlotState::Published(p) = &mut self.slots[slot.index()] else { return };
        if p.block_idle == idle {
            return;
        }
        p.block_idle = idle;
        if idle {
            self.evictable.insert((p.last_used, slot));
        } else {
            self.evictable.remove(&(p.last_used, slot));
        }
    }

    /// Drops the snapshot of KV block `block_id` (the block stopped being cached). Returns its
    /// slot, now free.
    pub fn drop_block(&mut self, block_id: BlockId) -> Option<SnapshotSlotId> {
        let slot = self.by_block.remove(&block_id)?;
        let SlotState::Published(p) = self.slots[slot.index()] else {
            unreachable!("indexed snapshot slots are published")
        };
        self.by_hash.remove(&p.hash);
        self.evictable.remove(&(p.last_used, slot));
        self.slots[slot.index()] = SlotState::Free;
        self.free.push(slot);
        Some(slot)
    }

    /// Every published snapshot as `(slot, hash, block)`, by slot id.
    pub fn iter_published(&self) -> impl Iterator<Item = (SnapshotSlotId, BlockHash, BlockId)> {
        self.slots.iter().enumerate().filter_map(|(index, state)| match state {
            SlotState::Published(p) => Some((SnapshotSlotId(index as u32), p.hash, p.block_id)),
            _ => None,
        })
    }

    /// Whether `slot` is reserved.
    pub fn is_reserved(&self, slot: SnapshotSlotId) -> bool {
        self.slots[slot.index()] == SlotState::Reserved
    }

    fn tick(&mut self) -> u64 {
        self.clock += 1;
        self.clock
    }

    /// Checks the pool's internal consistency; `is_idle` says whether a KV block is idle. For
    /// tests.
    pub fn check_invariants(&self, is_idle: impl Fn(BlockId) -> bool) -> Result<(), String> {
        let (mut free, mut reserved, mut published) = (0, 0, 0);
        for (index, state) in self.slots.iter().enumerate() {
            let slot = SnapshotSlotId(index as u32);
            match state {
                SlotState::Free => free += 1,
                SlotState::Reserved => reserved += 1,
                SlotState::Published(p) => {
                    published += 1;
                    if self.lookup(p.hash) != Some(slot)
                        || self.slot_of_block(p.block_id) != Some(slot)
                    {
                        return Err(format!("{slot:?} is not indexed"));
                    }
                    if p.block_idle != is_idle(p.block_id) {
                        return Err(format!("{slot:?} has a stale idle flag"));
                    }
                    if p.block_idle != self.evictable.contains(&(p.last_used, slot)) {
                        return Err(format!("{slot:?} evictability not reflected"));
                    }
                }
            }
        }
        let num_evictable = self
            .slots
            .iter()
            .filter(|state| matches!(state, SlotState::Published(p) if p.block_idle))
            .count();
        if num_evictable != self.evictable.len() {
            return Err(format!(
                "{} evictable entries for {num_evictable} snapshots",
                self.evictable.len()
            ));
        }
        let counts_match = free == self.free.len()
            && reserved == self.num_reserved
            && published == self.by_hash.len()
            && published == self.by_block.len();
        if !counts_match {
            return Err(format!(
                "slot counts disagree: {free} free, {reserved} reserved, {published} published"
            ));
        }
        if self.free.iter().any(|slot| self.slots[slot.index()] != SlotState::Free) {
            return Err("a slot on the free stack is not free".to_owned());
        }
        Ok(())
    }
}
