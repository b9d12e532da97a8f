//! `store_step` is on the hot path of every engine step: it may allocate once per block that gets
//! its first rows, never per token. A counting global allocator checks that.
//!
//! This binary holds a single test so no other test allocates while it counts.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};

use routed_routing::{RoutingStore, RoutingStoreConfig};
use routed_types::{BlockGeneration, BlockId, BlockRef, RoutingMeta};

struct Counting;

static ALLOCATIONS: AtomicUsize = AtomicUsize::new(0);

// SAFETY: defers to the system allocator; only counts calls.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: same contract as the caller's.
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: same contract as the caller's.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: same contract as the caller's.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: same contract as the caller's.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

#[test]
fn store_step_allocates_per_new_block_not_per_token() {
    let (layers, top_k, block_size, tokens) = (8usize, 4usize, 16usize, 512usize);
    let meta = RoutingMeta {
        num_layers: layers as u32,
        moe_layer_ids: (0..layers as u32).collect(),
        num_experts: 64,
        top_k: 4,
    };
    let num_blocks = tokens / block_size;
    let mut store =
        RoutingStore::new(RoutingStoreConfig::new(&meta, num_blocks, block_size)).expect("valid");
    let ids: Vec<i16> = (0..layers * tokens * top_k).map(|i| (i % 64) as i16).collect();
    let slots: Vec<usize> = (0..tokens).collect();
    let blocks: Vec<BlockRef> =
        (0..num_blocks as u32).map(|b| BlockRef::new(BlockId(b), BlockGeneration(1))).collect();

    let before = ALLOCATIONS.load(Ordering::Relaxed);
    let first = store.store_step(&ids, &slots, &blocks).expect("valid");
    let first_allocs = ALLOCATIONS.load(Ordering::Relaxed) - before;
    assert_eq!(first.rows_written, tokens);
    assert_eq!(first_allocs, num_blocks, "one buffer per block's first rows");

    let before = ALLOCATIONS.load(Ordering::Relaxed);
    let again = store.store_step(&ids, &slots, &blocks).expect("valid");
    let again_allocs = ALLOCATIONS.load(Ordering::Relaxed) - before;
    assert_eq!(again.rows_written, tokens);
    assert_eq!(again_allocs, 0, "rewriting stored blocks allocates nothing");
}
