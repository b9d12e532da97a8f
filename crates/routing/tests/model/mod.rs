//! The reference model behind the property tests: a simple cache manager and the rows it wrote.
//!
//! `Sim` drives a `RoutingStore` and mirrors, in plain maps, what the store must hold: per block
//! the current generation, who owns it, the rows written per offset, and whether its rows were
//! reported lost. `step` applies store steps to both; `check` compares them after every
//! operation.

mod check;
mod step;

use std::collections::HashMap;

use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};
use routed_routing::{LossReason, LostBlock, RoutingError, RoutingStore, RoutingStoreConfig};
use routed_types::{BlockGeneration, BlockId, BlockRef};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Owner {
    Free,
    Held,
    Cached,
}

/// The reference model's view of one block.
#[derive(Clone, Debug)]
struct Block {
    /// Generation of the current (or last) owner; `None` before the first allocation.
    generation: Option<u32>,
    owner: Owner,
    /// Rows written for the current generation, by offset.
    rows: HashMap<usize, Vec<u16>>,
    /// The store holds a buffer for the current generation.
    has_rows: bool,
    /// The current generation's rows were reported lost.
    lost: Option<LossReason>,
    /// The store has heard of the current generation.
    known: bool,
    /// A previous generation whose rows the store still holds because the block was reallocated
    /// without telling it.
    ghost: Option<u32>,
    /// Earlier generations of this block.
    history: Vec<u32>,
}

/// How often each interesting path ran, so a seed that never reaches one fails loudly.
#[derive(Debug, Default)]
pub(crate) struct Coverage {
    pub(crate) rows_written: usize,
    pub(crate) rows_dropped: usize,
    pub(crate) evicted: usize,
    pub(crate) refused: usize,
    pub(crate) never_written: usize,
    pub(crate) ghosts: usize,
    pub(crate) acquired: usize,
    pub(crate) acquire_lost: usize,
    pub(crate) resets: usize,
    pub(crate) clears: usize,
    pub(crate) full_blocks_ok: usize,
    pub(crate) missing_errors: usize,
    pub(crate) stale_errors: usize,
    pub(crate) lost_errors: usize,
}

pub(crate) struct Sim {
    pub(crate) cov: Coverage,
    rng: StdRng,
    store: RoutingStore,
    blocks: Vec<Block>,
    /// Cached-only block generations the store holds rows for, least recently released first.
    lru: Vec<(usize, u32)>,
    next_generation: u32,
    block_size: usize,
    num_layers: usize,
    top_k: usize,
    num_experts: u32,
    cap_blocks: usize,
}

fn bgen(g: u32) -> BlockGeneration {
    BlockGeneration(g)
}

fn bid(b: usize) -> BlockId {
    BlockId(b as u32)
}

impl Sim {
    pub(crate) fn new(seed: u64, config: RoutingStoreConfig) -> Self {
        let store = RoutingStore::new(config.clone()).expect("valid config");
        let cap_blocks = store.max_bytes() / store.block_bytes();
        let block = Block {
            generation: None,
            owner: Owner::Free,
            rows: HashMap::new(),
            has_rows: false,
            lost: None,
            known: false,
            ghost: None,
            history: Vec::new(),
        };
        Self {
            cov: Coverage::default(),
            rng: StdRng::seed_from_u64(seed),
            store,
            blocks: vec![block; config.num_blocks],
            lru: Vec::new(),
            next_generation: 1,
            block_size: config.block_size,
            num_layers: config.num_moe_layers,
            top_k: config.top_k,
            num_experts: config.num_experts,
            cap_blocks,
        }
    }

    pub(crate) fn run(&mut self, ops: usize) {
        for op in 0..ops {
            let pick = self.rng.random_range(0..1000);
            match pick {
                0..150 => self.op_allocate(),
                150..500 => self.op_step(),
                500..600 => self.op_free(),
                600..720 => self.op_release(),
                720..820 => self.op_acquire(),
                820..990 => self.op_stale_ops(),
                990..997 => self.op_clear_cached(),
                _ => self.op_reset(),
            }
            self.check_all(op);
        }
    }

    fn bytes_blocks(&self) -> usize {
        self.blocks.iter().map(|b| usize::from(b.has_rows) + usize::from(b.ghost.is_some())).sum()
    }

    fn lru_remove(&mut self, b: usize, g: u32) {
        self.lru.retain(|&e| e != (b, g));
    }

    fn drop_ghost(&mut self, b: usize) {
        if let Some(g) = self.blocks[b].ghost.take() {
            self.lru_remove(b, g);
        }
    }

    /// Gives block `b` a new owner. `tell` frees the old generation in the store first.
    fn reallocate(&mut self, b: usize, tell: bool) {
        if let Some(old) = self.blocks[b].generation {
            if tell && self.blocks[b].owner != Owner::Free {
                self.free_current(b);
            } else if self.blocks[b].owner == Owner::Cached && self.blocks[b].has_rows {
                // The store still holds (and may evict) the old generation's rows.
                self.blocks[b].ghost = Some(old);
                self.cov.ghosts += 1;
            }
            self.blocks[b].history.push(old);
        }
        let g = self.next_generation;
        self.next_generation += 1;
        let blk = &mut self.blocks[b];
        blk.generation = Some(g);
        blk.owner = Owner::Held;
        blk.rows.clear();
        blk.has_rows = false;
        blk.lost = None;
        blk.known = false;
    }

    fn free_current(&mut self, b: usize) {
        let g = self.blocks[b].generation.expect("allocated");
        self.store.free_block(bid(b), bgen(g));
        self.drop_ghost(b);
        self.lru_remove(b, g);
        let blk = &mut self.blocks[b];
        blk.owner = Owner::Free;
        blk.rows.clear();
        blk.has_rows = false;
        blk.lost = None;
        blk.known = true;
    }

    fn blocks_where(&self, f: impl Fn(&Block) -> bool) -> Vec<usize> {
        (0..self.blocks.len()).filter(|&b| f(&self.blocks[b])).collect()
    }

    fn pick(&mut self, candidates: &[usize]) -> Option<usize> {
        if candidates.is_empty() {
            None
        } else {
            Some(candidates[self.rng.random_range(0..candidates.len())])
        }
    }

    fn op_allocate(&mut self) {
        let free = self.blocks_where(|b| b.owner == Owner::Free);
        if let Some(b) = self.pick(&free) {
            self.reallocate(b, true);
            return;
        }
        // No free block: the cache manager evicts a cached one, sometimes without telling us.
        let cached = self.blocks_where(|b| b.owner == Owner::Cached);
        if let Some(b) = self.pick(&cached) {
            let tell = self.rng.random_bool(0.5);
            self.reallocate(b, tell);
        }
    }

    fn op_free(&mut self) {
        let live = self.blocks_where(|b| b.owner != Owner::Free);
        if let Some(b) = self.pick(&live) {
            self.free_current(b);
        }
    }

    fn op_release(&mut self) {
        // Mostly blocks whose rows arrived, as a finished request releases its full blocks.
        let written = self.blocks_where(|b| b.owner == Owner::Held && b.has_rows);
        let live = self.blocks_where(|b| b.owner != Owner::Free);
        let prefer_written = !written.is_empty() && self.rng.random_bool(0.8);
        let candidates = if prefer_written { written } else { live };
        let Some(b) = self.pick(&candidates) else { return };
        let g = self.blocks[b].generation.expect("allocated");
        self.store.release(bid(b), bgen(g));
        let blk = &self.blocks[b];
        if blk.lost.is_some() {
            self.blocks[b].owner = Owner::Cached;
        } else if blk.has_rows {
            self.lru_remove(b, g);
            self.lru.push((b, g));
            self.blocks[b].owner = Owner::Cached;
        } else {
            self.drop_ghost(b);
            let blk = &mut self.blocks[b];
            blk.owner = Owner::Cached;
            blk.lost = Some(LossReason::NeverWritten);
            blk.known = true;
            self.cov.never_written += 1;
            self.expect_lost(&[(b, g, LossReason::NeverWritten)]);
        }
    }

    fn op_acquire(&mut self) {
        let cached = self.blocks_where(|b| b.owner == Owner::Cached);
        let Some(b) = self.pick(&cached) else { return };
        let g = self.blocks[b].generation.expect("allocated");
        let got = self.store.acquire(bid(b), bgen(g));
        match self.blocks[b].lost {
            Some(reason) => {
                let expected =
                    RoutingError::AcquireLost { block: bid(b), generation: bgen(g), reason };
                assert_eq!(got, Err(expected));
                self.cov.acquire_lost += 1;
            }
            None => {
                assert_eq!(got, Ok(()), "acquire of cached block {b} gen {g}");
                self.cov.acquired += 1;
                self.lru_remove(b, g);
                self.blocks[b].owner = Owner::Held;
            }
        }
    }

    /// Messages naming old generations: they must change nothing visible.
    fn op_stale_ops(&mut self) {
        let with_history = self.blocks_where(|b| !b.history.is_empty());
        let Some(b) = self.pick(&with_history) else { return };
        let blk = &self.blocks[b];
        let old = blk.history[self.rng.random_range(0..blk.history.len())];
        if blk.ghost == Some(old) {
            // The store cannot tell this generation is stale: it was never told. Only touch it
            // the way a cache manager could (a late free).
            if self.rng.random_bool(0.3) {
                self.store.free_block(bid(b), bgen(old));
                self.drop_ghost(b);
            }
            return;
        }
        match self.rng.random_range(0..3) {
            0 => self.store.free_block(bid(b), bgen(old)),
            1 => self.store.release(bid(b), bgen(old)),
            _ => assert!(self.store.acquire(bid(b), bgen(old)).is_err(), "stale acquire"),
        }
    }

    fn op_clear_cached(&mut self) {
        self.cov.clears += 1;
        let got = self.store.clear_cached();
        let expected: Vec<BlockRef> =
            self.lru.iter().map(|&(b, g)| BlockRef::new(bid(b), bgen(g))).collect();
        assert_eq!(got, expected, "clear_cached returns the LRU in order");
        for (b, g) in std::mem::take(&mut self.lru) {
            let blk = &mut self.blocks[b];
            if blk.ghost == Some(g) {
                blk.ghost = None;
            } else {
                blk.owner = Owner::Free;
                blk.rows.clear();
                blk.has_rows = false;
                blk.known = true;
            }
        }
    }

    fn op_reset(&mut self) {
        self.cov.resets += 1;
        self.store.reset();
        self.lru.clear();
        for b in 0..self.blocks.len() {
            let blk = &mut self.blocks[b];
            if let Some(g) = blk.generation {
                if !blk.known {
                    // As the crate docs ask: name the generations handed out but never stored,
                    // so their late writes are dropped too.
                    self.store.free_block(bid(b), bgen(g));
                }
                blk.known = true;
            }
            blk.owner = Owner::Free;
            blk.rows.clear();
            blk.has_rows = false;
            blk.lost = None;
            blk.ghost = None;
        }
    }

    fn expect_lost(&mut self, expected: &[(usize, u32, LossReason)]) {
        let expected: Vec<LostBlock> = expected
            .iter()
            .map(|&(b, g, reason)| LostBlock { block: bid(b), generation: bgen(g), reason })
            .collect();
        assert_eq!(self.store.take_lost(), expected);
    }
}
