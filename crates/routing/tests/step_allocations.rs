//! `store_step` is on the hot path of every engine step: it may allocate once per block that gets
//! its first rows, never per token. A counting global allocator checks that.
//!
//! This binary holds a single test so no other test allocates while it counts.

use routed_routing::{RoutingStore, RoutingStoreConfig};
use routed_test_support::{Counting, num_allocations};
use routed_types::{BlockGeneration, BlockId, BlockRef, RoutingMeta};

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

    let before = num_allocations() as usize;
    let first = store.store_step(&ids, &slots, &blocks).expect("valid");
    let first_allocs = num_allocations() as usize - before;
    assert_eq!(first.rows_written, tokens);
    assert_eq!(first_allocs, num_blocks, "one buffer per block's first rows");

    let before = num_allocations() as usize;
    let again = store.store_step(&ids, &slots, &blocks).expect("valid");
    let again_allocs = num_allocations() as usize - before;
    assert_eq!(again.rows_written, tokens);
    assert_eq!(again_allocs, 0, "rewriting stored blocks allocates nothing");
}
