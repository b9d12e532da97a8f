//! The KV block pool: a fixed set of physical blocks, their reference counts and generations, the
//! index of published block hashes, and leaf-first LRU eviction.
//!
//! Every usable block is in exactly one state:
//!
//! | state  | `ref_count` | hash | where                                  |
//! | ------ | ----------- | ---- | -------------------------------------- |
//! | free   | 0           | none | the free stack                         |
//! | idle   | 0           | some | the hash index; evictable              |
//! | held   | > 0         | any  | the block tables of `ref_count` owners |
//!
//! plus the scratch blocks (the last ids), which are in none of them and never change.
//!
//! **Leaf-first eviction.** Each published block remembers the block that was published under its
//! parent hash at the time (with that block's generation, so the link dies when the parent is
//! dropped), and each block counts its *idle* children. Only idle blocks with no idle children are
//! eviction candidates, oldest release first, so a chain loses its tail before its head and a block
//! is kept only for its own recency, never propped up by a hot descendant. Held children do not
//! count: an idle block whose only children are held can be evicted (the held child then becomes
//! unreachable until its parent hash is published again, which lookup, scanning from block 0,
//! tolerates). Hence every idle block can be reclaimed by peeling leaves, and
//! `free + idle` is exactly the number of blocks an allocation can obtain.
//!
//! Costs: lookup O(1); allocate, pin, release, publish O(log n) (the ordered candidate set).

use std::collections::BTreeSet;
use std::ops::Range;

use routed_types::{BlockGeneration, BlockHash, BlockId, BlockRef};

use crate::hash::BlockHashMap;

/// A block handed out by [`BlockPool::allocate`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AllocatedBlock {
    /// The block, now held once by the caller.
    pub block_id: BlockId,
    /// Its new generation: data written for an earlier owner carries an older one.
    pub generation: BlockGeneration,
    /// The cached content evicted to make room, if the block came from the idle set.
    pub evicted: Option<EvictedBlock>,
}

/// A published block that stopped being cached (evicted, reset or forgotten).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EvictedBlock {
    /// The block.
    pub block_id: BlockId,
    /// The generation its dropped content was written under.
    pub generation: BlockGeneration,
    /// The hash it was published under.
    pub hash: BlockHash,
}

/// What a [`BlockPool::release`] did to the block.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Released {
    /// Other owners still hold it.
    StillHeld,
    /// Its last owner let go and it is published: it stays matchable, now evictable.
    Idle,
    /// Its last owner let go and it is unpublished: it is free; its content (written under
    /// `generation`) is dead.
    Freed {
        /// The generation of the dead content.
        generation: BlockGeneration,
    },
}

#[derive(Clone, Debug, Default)]
struct BlockMeta {
    ref_count: u32,
    generation: BlockGeneration,
    hash: Option<BlockHash>,
    /// The block published under this block's parent hash when this one was published.
    parent: Option<BlockRef>,
    /// Idle published blocks whose live parent link points here.
    num_idle_children: u32,
    /// Clock value of the last release to zero owners; the LRU key.
    last_released: u64,
    /// False after the block was forgotten while held: it must not be published again until it is
    /// reallocated (its routing rows, say, are incomplete).
    publishable: bool,
}

/// Fixed pool of KV blocks with reference counts, generations, a hash index and leaf-first LRU.
#[derive(Clone, Debug)]
pub struct BlockPool {
    blocks: Vec<BlockMeta>,
    num_usable: usize,
    /// Free blocks, popped from the end.
    free: Vec<BlockId>,
    hash_to_block: BlockHashMap<BlockId>,
    /// Idle blocks with no idle children, keyed by `(last_released, id)`.
    leaves: BTreeSet<(u64, BlockId)>,
    num_idle: usize,
    clock: u64,
}

impl BlockPool {
    /// A pool of `num_blocks` blocks whose last `num_scratch_blocks` ids are reserved scratch.
    ///
    /// # Panics
    /// If `num_scratch_blocks > num_blocks` or `num_blocks` does not fit a `u32` id.
    pub fn new(num_blocks: usize, num_scratch_blocks: usize) -> Self {
        assert!(num_scratch_blocks <= num_blocks, "more scratch blocks than blocks");
        let num_usable = num_blocks - num_scratch_blocks;
        let total = u32::try_from(num_blocks).expect("block ids are u32");
        let blocks = vec![BlockMeta { publishable: true, ..BlockMeta::default() }; num_blocks];
        // Reversed so that allocation hands out low ids first.
        let free = (0..total).take(num_usable).rev().map(BlockId).collect();
        Self {
            blocks,
            num_usable,
            free,
            hash_to_block: BlockHashMap::default(),
            leaves: BTreeSet::new(),
            num_idle: 0,
            clock: 0,
        }
    }

    /// Every block, scratch included.
    pub fn num_blocks(&self) -> usize {
        self.blocks.len()
    }

    /// Blocks that can be handed to requests.
    pub fn num_usable_blocks(&self) -> usize {
        self.num_usable
    }

    /// The reserved scratch blocks, as a range of ids.
    pub fn scratch_blocks(&self) -> Range<u32> {
        self.num_usable as u32..self.blocks.len() as u32
    }

    /// Whether `block_id` is a scratch block.
    pub fn is_scratch(&self, block_id: BlockId) -> bool {
        block_id.index() >= self.num_usable
    }

    /// Free (unpublished, unowned) blocks.
    pub fn num_free(&self) -> usize {
        self.free.len()
    }

    /// Published blocks, held or idle.
    pub fn num_cached(&self) -> usize {
        self.hash_to_block.len()
    }

    /// Idle blocks: published, unowned, reclaimable by eviction.
    pub fn num_evictable(&self) -> usize {
        self.num_idle
    }

    /// Blocks with at least one owner.
    pub fn num_held(&self) -> usize {
        self.num_usable - self.free.len() - self.num_idle
    }

    /// Blocks an allocation can obtain right now: free plus evictable.
    pub fn num_allocatable(&self) -> usize {
        self.free.len() + self.num_idle
    }

    /// The block published under `hash`, if any.
    pub fn lookup(&self, hash: BlockHash) -> Option<BlockId> {
        self.hash_to_block.get(&hash).copied()
    }

    /// Number of owners of `block_id`.
    pub fn ref_count(&self, block_id: BlockId) -> u32 {
        self.blocks[block_id.index()].ref_count
    }

    /// Current generation of `block_id`.
    pub fn generation(&self, block_id: BlockId) -> BlockGeneration {
        self.blocks[block_id.index()].generation
    }

    /// The hash `block_id` is published under, if any.
    pub fn block_hash(&self, block_id: BlockId) -> Option<BlockHash> {
        self.blocks[block_id.index()].hash
    }

    /// Whether `block_id` is idle (published, no owner).
    pub fn is_idle(&self, block_id: BlockId) -> bool {
        let meta = &self.blocks[block_id.index()];
        meta.ref_count == 0 && meta.hash.is_some()
    }

    /// Takes one block with one owner: a free one if any, else the least recently released idle
    /// leaf, whose content is evicted. `None` when neither exists.
    pub fn allocate(&mut self) -> Option<AllocatedBlock> {
        let (block_id, evicted) = match self.free.pop() {
            Some(block_id) => (block_id, None),
            None => {
                let evicted = self.evict_leaf()?;
                (evicted.block_id, Some(evicted))
            }
        };
        let meta = &mut self.blocks[block_id.index()];
        meta.generation = BlockGeneration(meta.generation.0.wrapping_add(1));
        meta.ref_count = 1;
        meta.num_idle_children = 0;
        meta.publishable = true;
        Some(AllocatedBlock { block_id, generation: meta.generation, evicted })
    }

    /// Adds an owner to a held or idle block (a prefix hit). Returns whether it was idle.
    ///
    /// # Panics
    /// If the block is free or scratch.
    pub fn pin(&mut self, block_id: BlockId) -> bool {
        assert!(!self.is_scratch(block_id), "scratch block {block_id:?} pinned");
        let meta = &mut self.blocks[block_id.index()];
        assert!(meta.ref_count > 0 || meta.hash.is_some(), "free block {block_id:?} pinned");
        meta.ref_count += 1;
        if meta.ref_count > 1 {
            return false;
        }
        let (last_released, parent) = (meta.last_released, meta.parent);
        self.num_idle -= 1;
        self.leaves.remove(&(last_released, block_id));
        if let Some(parent) = self.live_parent(parent) {
            self.remove_idle_child(parent);
        }
        true
    }

    /// Removes one owner. Call once per owner that lets go (per occurrence, never per distinct id).
    ///
    /// # Panics
    /// If the block has no owner.
    pub fn release(&mut self, block_id: BlockId) -> Released {
        let tick = self.tick();
        let meta = &mut self.blocks[block_id.index()];
        assert!(meta.ref_count > 0, "block {block_id:?} released with no owner");
        meta.ref_count -= 1;
        if meta.ref_count > 0 {
            return Released::StillHeld;
        }
        if meta.hash.is_none() {
            let generation = meta.generation;
            self.free.push(block_id);
            return Released::Freed { generation };
        }
        meta.last_released = tick;
        let (parent, is_leaf) = (meta.parent, meta.num_idle_children == 0);
        self.num_idle += 1;
        if is_leaf {
            self.leaves.insert((tick, block_id));
        }
        if let Some(parent) = self.live_parent(parent) {
            let parent_meta = &mut self.blocks[parent.index()];
            parent_meta.num_idle_children += 1;
            let key = (parent_meta.last_released, parent);
            self.leaves.remove(&key);
        }
        Released::Idle
    }

    /// Publishes a held block under `hash`, linked to the block published under `parent` (if
    /// any). Returns false, changing nothing, when `hash` is already published (another block has
    /// the same content) or the block was forgotten in this generation.
    ///
    /// # Panics
    /// If the block has no owner or is already published.
    pub fn register(
        &mut self,
        block_id: BlockId,
        hash: BlockHash,
        parent: Option<BlockHash>,
    ) -> bool {
        let meta = &self.blocks[block_id.index()];
        assert!(meta.ref_count > 0, "only a held block can be published");
        assert!(meta.hash.is_none(), "block {block_id:?} published twice");
        if !meta.publishable || self.hash_to_block.contains_key(&hash) {
            return false;
        }
        let parent = parent
            .and_then(|hash| self.lookup(hash))
            .map(|parent| BlockRef::new(parent, self.blocks[parent.index()].generation));
        let meta = &mut self.blocks[block_id.index()];
        meta.hash = Some(hash);
        meta.parent = parent;
        self.hash_to_block.insert(hash, block_id);
        true
    }

    /// Makes `block_id` stop matching: its hash leaves the index; an idle block becomes free, a
    /// held one stays held and cannot be published again in this generation. Returns the dropped
    /// content, or `None` when the block was not published.
    pub fn unregister(&mut self, block_id: BlockId) -> Option<EvictedBlock> {
        let meta = &mut self.blocks[block_id.index()];
        let hash = meta.hash.take()?;
        let parent = meta.parent.take();
        let evicted = EvictedBlock { block_id, generation: meta.generation, hash };
        self.hash_to_block.remove(&hash);
        if meta.ref_count > 0 {
            meta.publishable = false;
            return Some(evicted);
        }
        let key = (meta.last_released, block_id);
        self.num_idle -= 1;
        self.leaves.remove(&key);
        if let Some(parent) = self.live_parent(parent) {
            self.remove_idle_child(parent);
        }
        self.free.push(block_id);
        Some(evicted)
    }

    /// Keeps a held block from being published until it is reallocated (its routing rows are
    /// incomplete, say).
    pub fn forbid_publish(&mut self, block_id: BlockId) {
        self.blocks[block_id.index()].publishable = false;
    }

    /// Unregisters every idle block (they become free) and returns what was dropped, by block id.
    pub fn drop_idle(&mut self) -> Vec<EvictedBlock> {
        let idle: Vec<BlockId> = (0..self.num_usable as u32)
            .map(BlockId)
            .filter(|&block_id| self.is_idle(block_id))
            .collect();
        idle.into_iter().filter_map(|block_id| self.unregister(block_id)).collect()
    }

    /// Unregisters every published block, held or idle; returns the idle ones (now free).
    pub fn drop_all_published(&mut self) -> Vec<EvictedBlock> {
        let dropped = self.drop_idle();
        let held: Vec<BlockId> = self.hash_to_block.values().copied().collect();
        for block_id in held {
            self.unregister(block_id);
        }
        dropped
    }

    fn tick(&mut self) -> u64 {
        self.clock += 1;
        self.clock
    }

    /// The parent link if it still names the block (and generation) it was made with.
    fn live_parent(&self, link: Option<BlockRef>) -> Option<BlockId> {
        let BlockRef { block, generation } = link?;
        let meta = &self.blocks[block.index()];
        (meta.hash.is_some() && meta.generation == generation).then_some(block)
    }

    /// One idle child of `parent` was pinned or dropped; `parent` may have become a leaf.
    fn remove_idle_child(&mut self, parent: BlockId) {
        let meta = &mut self.blocks[parent.index()];
        meta.num_idle_children -= 1;
        if meta.num_idle_children == 0 && meta.ref_count == 0 && meta.hash.is_some() {
            self.leaves.insert((meta.last_released, parent));
        }
    }

    fn evict_leaf(&mut self) -> Option<EvictedBlock> {
        let &(_, block_id) = self.leaves.first()?;
        let evicted = self.unregister(block_id).expect("leaves are published");
        // `unregister` pushed the now free block; the caller takes it from there.
        let popped = self.free.pop();
        debug_assert_eq!(popped, Some(block_id));
        Some(evicted)
    }

    /// Checks the pool's internal consistency (state partition, hash index, leaf set, child
    /// counts). O(blocks); for tests.
    pub fn check_invariants(&self) -> Result<(), String> {
        let mut num_free_seen = vec![0u32; self.blocks.len()];
        for block_id in &self.free {
            num_free_seen[block_id.index()] += 1;
        }
        let mut num_idle = 0;
        let mut idle_children = vec![0u32; self.blocks.len()];
        for (index, meta) in self.blocks.iter().enumerate() {
            let block_id = BlockId(index as u32);
            if self.is_scratch(block_id) {
                if meta.ref_count != 0 || meta.hash.is_some() || num_free_seen[index] != 0 {
                    return Err(format!("scratch block {block_id:?} was used"));
                }
                continue;
            }
            let is_free = meta.ref_count == 0 && meta.hash.is_none();
            if num_free_seen[index] != u32::from(is_free) {
                return Err(format!(
                    "{block_id:?} on the free stack {} times",
                    num_free_seen[index]
                ));
            }
            if let Some(hash) = meta.hash
                && self.lookup(hash) != Some(block_id)
            {
                return Err(format!("{block_id:?} is not indexed under its hash"));
            }
            if self.is_idle(block_id) {
                num_idle += 1;
                if let Some(parent) = self.live_parent(meta.parent) {
                    idle_children[parent.index()] += 1;
                }
            }
        }
        if num_idle != self.num_idle {
            return Err(format!("idle count {} but {num_idle} idle blocks", self.num_idle));
        }
        for (&hash, &block_id) in &self.hash_to_block {
            if self.blocks[block_id.index()].hash != Some(hash) {
                return Err(format!("index maps {hash:?} to {block_id:?}, which differs"));
            }
        }
        self.check_leaves(&idle_children)
    }

    fn check_leaves(&self, idle_children: &[u32]) -> Result<(), String> {
        let mut num_leaves = 0;
        for (index, meta) in self.blocks.iter().enumerate().take(self.num_usable) {
            let block_id = BlockId(index as u32);
            if meta.hash.is_some() && meta.num_idle_children != idle_children[index] {
                return Err(format!(
                    "{block_id:?} counts {} idle children, has {}",
                    meta.num_idle_children, idle_children[index]
                ));
            }
            let is_leaf = self.is_idle(block_id) && idle_children[index] == 0;
            if is_leaf != self.leaves.contains(&(meta.last_released, block_id)) {
                return Err(format!("{block_id:?} leaf status {is_leaf} not reflected"));
            }
            num_leaves += usize::from(is_leaf);
        }
        if num_leaves != self.leaves.len() {
            return Err(format!("{} leaf entries for {num_leaves} leaves", self.leaves.len()));
        }
        Ok(())
    }
}
