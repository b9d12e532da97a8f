//! The block pool on its own: generations, scratch blocks, per-occurrence release, publication.

use routed_cache::{BlockPool, Released};
use routed_types::{BlockGeneration, BlockHash, BlockId};

fn h(n: u128) -> BlockHash {
    BlockHash(n)
}

#[test]
fn reallocation_changes_the_generation() {
    let mut pool = BlockPool::new(1, 0);
    let first = pool.allocate().unwrap();
    assert_eq!(pool.release(first.block_id), Released::Freed { generation: first.generation });
    let second = pool.allocate().unwrap();
    assert_eq!(second.block_id, first.block_id);
    assert_ne!(second.generation, first.generation);
    assert!(pool.register(second.block_id, h(1), None));
    pool.release(second.block_id);
    let third = pool.allocate().unwrap();
    assert_eq!(third.evicted.unwrap().generation, second.generation);
    assert_ne!(third.generation, second.generation);
    pool.check_invariants().unwrap();
}

#[test]
fn scratch_blocks_are_never_handed_out() {
    let mut pool = BlockPool::new(6, 2);
    assert_eq!(pool.scratch_blocks(), 4..6);
    let mut handed = Vec::new();
    while let Some(block) = pool.allocate() {
        handed.push(block.block_id);
    }
    assert_eq!(handed, (0..4).map(BlockId).collect::<Vec<_>>());
    for &block_id in &handed {
        pool.release(block_id);
    }
    pool.check_invariants().unwrap();
}

#[test]
fn a_block_with_several_owners_is_released_once_per_owner() {
    let mut pool = BlockPool::new(2, 0);
    let block = pool.allocate().unwrap().block_id;
    assert!(pool.register(block, h(7), None));
    pool.pin(block);
    pool.pin(block);
    assert_eq!(pool.ref_count(block), 3);
    assert_eq!(pool.release(block), Released::StillHeld);
    assert_eq!(pool.release(block), Released::StillHeld);
    assert_eq!(pool.release(block), Released::Idle);
    assert_eq!(pool.num_evictable(), 1);
    assert_eq!(pool.num_allocatable(), 2);
    pool.check_invariants().unwrap();
}

#[test]
fn a_hash_is_published_once_and_a_duplicate_block_stays_unpublished() {
    let mut pool = BlockPool::new(2, 0);
    let a = pool.allocate().unwrap().block_id;
    let b = pool.allocate().unwrap().block_id;
    assert!(pool.register(a, h(1), None));
    assert!(!pool.register(b, h(1), None));
    assert_eq!(pool.lookup(h(1)), Some(a));
    assert_eq!(pool.release(b), Released::Freed { generation: BlockGeneration(1) });
    pool.check_invariants().unwrap();
}

#[test]
fn a_forgotten_held_block_is_not_published_again_in_its_generation() {
    let mut pool = BlockPool::new(1, 0);
    let block = pool.allocate().unwrap().block_id;
    pool.forbid_publish(block);
    assert!(!pool.register(block, h(3), None));
    assert_eq!(pool.lookup(h(3)), None);
    pool.release(block);
    let again = pool.allocate().unwrap().block_id;
    assert!(pool.register(again, h(3), None), "a new generation may be published");
}

#[test]
fn an_idle_parent_whose_child_is_held_can_be_evicted() {
    let mut pool = BlockPool::new(3, 0);
    let parent = pool.allocate().unwrap().block_id;
    let child = pool.allocate().unwrap().block_id;
    assert!(pool.register(parent, h(1), None));
    assert!(pool.register(child, h(2), Some(h(1))));
    pool.release(parent);
    // The child stays held; only the parent is idle, and it is reclaimable.
    assert_eq!(pool.num_allocatable(), 2);
    pool.allocate().unwrap();
    let evicting = pool.allocate().unwrap();
    assert_eq!(evicting.evicted.unwrap().block_id, parent);
    pool.check_invariants().unwrap();
    // The orphaned child still releases cleanly and is then itself evictable.
    assert_eq!(pool.release(child), Released::Idle);
    pool.check_invariants().unwrap();
}

#[test]
fn pinning_a_child_makes_its_idle_parent_a_leaf_again() {
    let mut pool = BlockPool::new(3, 0);
    let parent = pool.allocate().unwrap().block_id;
    let child = pool.allocate().unwrap().block_id;
    let other = pool.allocate().unwrap().block_id;
    assert!(pool.register(parent, h(1), None));
    assert!(pool.register(child, h(2), Some(h(1))));
    assert!(pool.register(other, h(9), None));
    pool.release(parent);
    pool.release(child);
    pool.release(other);
    pool.pin(child);
    pool.check_invariants().unwrap();
    // Leaves now: parent (released first) and other; the parent goes first.
    assert_eq!(pool.allocate().unwrap().evicted.unwrap().block_id, parent);
    pool.check_invariants().unwrap();
}

#[test]
fn drop_idle_frees_every_idle_block_and_keeps_held_ones() {
    let mut pool = BlockPool::new(3, 1);
    let a = pool.allocate().unwrap().block_id;
    let b = pool.allocate().unwrap().block_id;
    assert!(pool.register(a, h(1), None));
    assert!(pool.register(b, h(2), Some(h(1))));
    pool.release(a);
    let dropped = pool.drop_idle();
    assert_eq!(dropped.iter().map(|d| d.block_id).collect::<Vec<_>>(), [a]);
    assert_eq!(pool.lookup(h(2)), Some(b));
    assert_eq!(pool.num_free(), 1);
    pool.check_invariants().unwrap();
}
