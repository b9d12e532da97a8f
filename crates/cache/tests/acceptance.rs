//! The prefix-caching acceptance cases, cache side. Each case states what the engine-level test
//! adds (real forwards, output equality, routing rows); here we assert the cache's part: hits,
//! computed and skipped tokens, snapshots, ref counts, eviction order.

mod common;

use common::{add, commit_all, computed, prefill, rid, run_to_completion, seq, step};
use routed_cache::{BlockPool, CacheConfig, CommitEntry, KvCacheManager, SlotRequest};
use routed_types::{BlockHash, BlockId};

const B: usize = 16;

fn attention(num_blocks: usize) -> KvCacheManager {
    KvCacheManager::new(CacheConfig::attention(B, num_blocks)).unwrap()
}

fn hybrid(block_size: usize, num_blocks: usize, slots: usize) -> KvCacheManager {
    KvCacheManager::new(CacheConfig::hybrid(block_size, num_blocks, slots)).unwrap()
}

/// AC-01: an unaligned prompt sent twice; the second computes only the tail.
/// Engine level adds: outputs equal to caching off, `usage.prompt_tokens_details.cached_tokens`.
#[test]
fn ac01_exact_repeat_unaligned_computes_only_the_tail() {
    for mut manager in [attention(64), hybrid(B, 64, 8)] {
        let prompt = seq(1000, 3 * B + 5);
        run_to_completion(&mut manager, 1, &prompt, 4096);
        add(&mut manager, 2, &prompt);
        let hit = manager.get_computed_blocks(rid(2)).unwrap();
        assert_eq!(hit.block_ids.len(), 3);
        assert_eq!(hit.num_computed_tokens, 3 * B);
        let grants = step(&mut manager, &[2], 4096).grants;
        assert_eq!(grants[0].num_cached_tokens, 3 * B);
        assert_eq!(grants[0].num_new_tokens, 5);
        assert_eq!(grants[0].num_computed_tokens, 3 * B);
        assert_eq!(manager.num_cached_tokens(rid(2)).unwrap(), 3 * B);
        let stats = manager.stats();
        assert_eq!(stats.num_prefill_tokens_computed, (3 * B + 10) as u64);
        assert_eq!(stats.num_prefill_tokens_skipped, (3 * B) as u64);
        assert_eq!(stats.num_prefix_cache_hits, 1);
    }
}

/// AC-03: the hash chain. A change in block 0 changes every hash after it; a change in block 2
/// keeps exactly the two blocks before it.
/// Engine level adds: outputs equal for every variant.
#[test]
fn ac03_hash_chain_changes_from_the_edited_block_on() {
    let mut manager = attention(64);
    let prompt = seq(1000, 4 * B + 7);
    run_to_completion(&mut manager, 1, &prompt, 4096);
    let base_hashes = {
        add(&mut manager, 9, &prompt);
        manager.block_hashes(rid(9)).unwrap().to_vec()
    };

    let mut edit_block0 = prompt.clone();
    edit_block0[3] += 1;
    add(&mut manager, 2, &edit_block0);
    assert_eq!(manager.get_computed_blocks(rid(2)).unwrap().block_ids.len(), 0);
    let hashes = manager.block_hashes(rid(2)).unwrap();
    assert!(hashes.iter().zip(&base_hashes).all(|(a, b)| a != b), "every block must differ");

    let mut edit_block2 = prompt.clone();
    edit_block2[2 * B + 1] += 1;
    add(&mut manager, 3, &edit_block2);
    let hit = manager.get_computed_blocks(rid(3)).unwrap();
    assert_eq!(hit.block_ids.len(), 2);
    assert_eq!(hit.num_kv_matched_blocks, 2);
    let hashes = manager.block_hashes(rid(3)).unwrap();
    assert_eq!(&hashes[..2], &base_hashes[..2]);
    assert!(hashes[2..].iter().zip(&base_hashes[2..]).all(|(a, b)| a != b));
}

/// AC-07 (a): budget 300, B = 256, an 800-token prompt: chunks end at 256, 512, 800; the
/// snapshot at the last complete block (768) is taken inside the last chunk, so R1[:768] + 100
/// hits 3 blocks and computes 100.
/// Engine level adds: the runner extracts state at 768 mid-chunk; outputs equal.
#[test]
fn ac07a_multi_chunk_prompt_snapshots_its_last_complete_block() {
    let mut manager = hybrid(256, 64, 16);
    let r1 = seq(1, 800);
    let grants = run_to_completion(&mut manager, 1, &r1, 300);
    let ends: Vec<usize> = grants.iter().map(|g| g.end()).collect();
    assert_eq!(ends, [256, 512, 800]);
    let positions: Vec<Vec<usize>> =
        grants.iter().map(|g| g.snapshots.iter().map(|s| s.position).collect()).collect();
    assert_eq!(positions, [vec![256], vec![512], vec![768]]);

    let mut r2 = r1[..768].to_vec();
    r2.extend(seq(50_000, 100));
    let grants = prefill(&mut manager, 2, &r2, 300);
    assert_eq!(grants[0].num_cached_tokens, 768);
    assert!(grants[0].restore_from.is_some());
    assert_eq!(computed(&grants), 100);
}

/// AC-07 (b): budget 512, B = 256, 1100 tokens: a chunk ends exactly at 1024, the last complete
/// block, and the live state is snapshotted there; R1[:1024] + 60 hits 4 blocks, computes 60.
/// Engine level adds: the live state copied after the chunk ending at 1024 equals the cold state.
#[test]
fn ac07b_boundary_at_a_chunk_end_is_snapshotted() {
    let mut manager = hybrid(256, 64, 16);
    let r1 = seq(1, 1100);
    let grants = run_to_completion(&mut manager, 1, &r1, 512);
    let ends: Vec<usize> = grants.iter().map(|g| g.end()).collect();
    assert_eq!(ends, [512, 1024, 1100]);
    assert_eq!(grants[1].snapshots.iter().map(|s| s.position).collect::<Vec<_>>(), [1024]);

    let mut r2 = r1[..1024].to_vec();
    r2.extend(seq(50_000, 60));
    let grants = prefill(&mut manager, 2, &r2, 512);
    assert_eq!(grants[0].num_cached_tokens, 1024);
    assert_eq!(computed(&grants), 60);
}

/// AC-07 (c): an aligned prompt (4B) sent twice skips 3B: the replay boundary (len-1)/B*B was
/// snapshotted because the hit may not cover the last token.
/// Engine level adds: the recomputed last block yields the cache-off first token.
#[test]
fn ac07c_exact_repeat_of_an_aligned_prompt_resumes_one_block_early() {
    let mut manager = hybrid(256, 64, 16);
    let r1 = seq(1, 4 * 256);
    let grants = run_to_completion(&mut manager, 1, &r1, 4096);
    let positions: Vec<usize> = grants[0].snapshots.iter().map(|s| s.position).collect();
    assert_eq!(positions, [3 * 256, 4 * 256]);
    let grants = prefill(&mut manager, 2, &r1, 4096);
    assert_eq!(grants[0].num_cached_tokens, 3 * 256);
    assert_eq!(computed(&grants), 256);
}

/// AC-12: a partial hit snapshots its divergence point. R2 shares 2B with R1 but no snapshot
/// exists at 2B, so it computes everything (and reports 0 cached tokens) while planning one;
/// R3, sharing the same 2B, then skips exactly 2B.
/// Engine level adds: outputs equal; `cached_tokens` in the usage of each response.
#[test]
fn ac12_divergence_point_is_snapshotted_for_later_siblings() {
    let mut manager = hybrid(B, 64, 16);
    let shared = seq(1, 2 * B);
    let r1 = [shared.clone(), seq(10_000, 2 * B + 10)].concat();
    run_to_completion(&mut manager, 1, &r1, 4096);

    let r2 = [shared.clone(), seq(20_000, B + 7)].concat();
    add(&mut manager, 2, &r2);
    let hit = manager.get_computed_blocks(rid(2)).unwrap();
    assert_eq!((hit.num_kv_matched_blocks, hit.num_computed_tokens), (2, 0));
    let grants = step(&mut manager, &[2], 4096).grants;
    assert_eq!(grants[0].num_cached_tokens, 0);
    assert_eq!(grants[0].num_new_tokens, r2.len());
    assert!(grants[0].snapshots.iter().any(|s| s.position == 2 * B), "{:?}", grants[0].snapshots);
    manager.free(&[rid(2)]).unwrap();

    let r3 = [shared, seq(30_000, B + 3)].concat();
    let grants = prefill(&mut manager, 3, &r3, 4096);
    assert_eq!(grants[0].num_cached_tokens, 2 * B);
    assert_eq!(computed(&grants), B + 3);
}

/// AC-13: KV matched 3 blocks but the farthest snapshot is at block 1: the request skips B only,
/// recomputes (and does not report) the other matched blocks.
/// Engine level adds: outputs equal; `cached_tokens` reported as B.
#[test]
fn ac13_kv_match_without_snapshot_is_not_reported_as_cached() {
    let mut manager = hybrid(B, 64, 16);
    let r1 = seq(1, 3 * B + 5);
    add(&mut manager, 1, &r1);
    // Chunks of one block each plan a snapshot at B, 2B and 3B; the runner writes only the one at
    // B (say the others could not be extracted), so only that one is published.
    loop {
        let step = manager.allocate_slots(&[SlotRequest::with_max(rid(1), B)], 4096).unwrap();
        let grant = &step.grants[0];
        let mut entry = grant.commit_entry();
        entry.snapshots_written.retain(|_| grant.num_computed_tokens == 0);
        manager.commit(&[entry]).unwrap();
        if grant.end() == r1.len() {
            break;
        }
    }
    manager.free(&[rid(1)]).unwrap();
    assert_eq!(manager.stats().num_snapshot_slots_used, 1);

    let r2 = [r1[..3 * B].to_vec(), seq(70_000, 9)].concat();
    add(&mut manager, 2, &r2);
    let hit = manager.get_computed_blocks(rid(2)).unwrap();
    assert_eq!(hit.num_kv_matched_blocks, 3);
    assert_eq!(hit.num_computed_tokens, B);
    let grants = prefill_rest(&mut manager, 2, r2.len());
    assert_eq!(grants[0].num_cached_tokens, B);
    assert_eq!(manager.num_cached_tokens(rid(2)).unwrap(), B);
    assert_eq!(computed(&grants), r2.len() - B);
}

fn prefill_rest(manager: &mut KvCacheManager, id: u64, len: usize) -> Vec<routed_cache::SlotGrant> {
    let mut grants = Vec::new();
    while grants.last().is_none_or(|g: &routed_cache::SlotGrant| g.end() < len) {
        grants.extend(step(manager, &[id], 4096).grants);
    }
    grants
}

/// AC-17: leaf-first eviction. In the pool, chain A -> B -> C released oldest-first (A before B
/// before C), then an unrelated D: eviction takes C, then B, then A, then D; never a parent while
/// its child is cached. Through the manager: a chunked chain and a newer block; one forced
/// eviction takes the chain's tail and a request with the chain's first two blocks hits both.
/// Engine level adds: routing rows of the evicted block are dropped, the hit's rows returned.
#[test]
fn ac17_eviction_is_leaf_first_along_the_chain() {
    let mut pool = BlockPool::new(4, 0);
    let ids: Vec<BlockId> = (0..4).map(|_| pool.allocate().unwrap().block_id).collect();
    let h = |n: u128| BlockHash(n);
    assert!(pool.register(ids[0], h(1), None));
    assert!(pool.register(ids[1], h(2), Some(h(1))));
    assert!(pool.register(ids[2], h(3), Some(h(2))));
    assert!(pool.register(ids[3], h(4), None));
    for &id in &ids {
        pool.release(id);
    }
    pool.check_invariants().unwrap();
    let order: Vec<BlockId> =
        (0..4).map(|_| pool.allocate().unwrap().evicted.unwrap().block_id).collect();
    assert_eq!(order, [ids[2], ids[1], ids[0], ids[3]]);

    let block = 4;
    let mut manager = KvCacheManager::new(CacheConfig::attention(block, 5)).unwrap();
    let chain = seq(1, 3 * block + 1);
    let grants = prefill_chunked(&mut manager, 1, &chain, 2 * block);
    assert_eq!(grants.len(), 2, "C is written by the second chunk");
    let tail = manager.block_table(rid(1)).unwrap()[2];
    manager.free(&[rid(1)]).unwrap();
    run_to_completion(&mut manager, 2, &seq(500, block + 1), 4096);
    manager.take_dropped_blocks();
    // Two blocks: one free, one evicted. The oldest leaf is C (A and B are its ancestors).
    run_to_completion(&mut manager, 3, &seq(900, 2 * block), 4096);
    let dropped: Vec<BlockId> = manager.take_dropped_blocks().iter().map(|d| d.block).collect();
    assert!(dropped.contains(&tail), "{dropped:?}");
    add(&mut manager, 4, &[chain[..2 * block].to_vec(), seq(700, 3)].concat());
    assert_eq!(manager.get_computed_blocks(rid(4)).unwrap().block_ids.len(), 2);
}

fn prefill_chunked(
    manager: &mut KvCacheManager,
    id: u64,
    prompt: &[u32],
    chunk: usize,
) -> Vec<routed_cache::SlotGrant> {
    add(manager, id, prompt);
    let mut grants = Vec::new();
    while grants.last().is_none_or(|g: &routed_cache::SlotGrant| g.end() < prompt.len()) {
        let step = manager.allocate_slots(&[SlotRequest::with_max(rid(id), chunk)], 4096).unwrap();
        commit_all(manager, &step);
        grants.extend(step.grants);
    }
    grants
}

/// AC-18: the pool is full of idle cached blocks and the hit blocks are the oldest leaves; the
/// hit is pinned before the new block is allocated, so the table has 3 distinct ids, hits first.
/// Engine level adds: the hit's KV and routing rows are read from the pinned blocks.
#[test]
fn ac18_hits_are_pinned_before_allocation() {
    let block = 4;
    let mut manager = KvCacheManager::new(CacheConfig::attention(block, 4)).unwrap();
    let ab = seq(1, 2 * block);
    run_to_completion(&mut manager, 1, &ab, 4096);
    let hit_blocks = {
        add(&mut manager, 9, &[ab.clone(), vec![7]].concat());
        manager.get_computed_blocks(rid(9)).unwrap().block_ids
    };
    run_to_completion(&mut manager, 2, &seq(100, 2 * block), 4096);
    assert_eq!(manager.stats().num_blocks_free, 0);
    assert_eq!(manager.stats().num_blocks_evictable, 4);

    let r3 = [ab, seq(300, 3)].concat();
    let grants = prefill(&mut manager, 3, &r3, 4096);
    let table = manager.block_table(rid(3)).unwrap().to_vec();
    assert_eq!(grants[0].num_cached_tokens, 2 * block);
    assert_eq!(&table[..2], &hit_blocks[..]);
    assert_eq!(table.len(), 3);
    assert!(!hit_blocks.contains(&table[2]));
}

/// AC-19: ten identical requests admitted in one step share the cached blocks and finish in one
/// call: every ref count returns to 0 and nothing leaks.
/// Engine level adds: ten outputs equal; the routing store holds rows only for cached blocks.
#[test]
fn ac19_shared_blocks_released_together_return_to_zero() {
    let mut manager = attention(32);
    let prompt = seq(1, 3 * B + 2);
    run_to_completion(&mut manager, 0, &prompt, 4096);
    let ids: Vec<u64> = (1..=10).collect();
    for &id in &ids {
        add(&mut manager, id, &prompt);
    }
    let grants = step(&mut manager, &ids, 4096).grants;
    assert_eq!(grants.len(), 10);
    let shared = manager.block_table(rid(1)).unwrap()[..3].to_vec();
    for &block in &shared {
        assert_eq!(manager.block_pool().ref_count(block), 10);
    }
    let all: Vec<_> = ids.iter().map(|&id| rid(id)).collect();
    manager.free(&all).unwrap();
    manager.check_invariants().unwrap();
    for &block in &shared {
        assert_eq!(manager.block_pool().ref_count(block), 0);
    }
    let stats = manager.stats();
    assert_eq!(stats.num_blocks_evictable, stats.num_blocks_cached);
    assert_eq!(stats.num_blocks_free + stats.num_blocks_evictable, stats.num_blocks_total);
    assert_eq!(manager.block_pool().num_allocatable(), 32);
}

/// AC-20: evicting the KV block that ends at a snapshot's boundary drops the snapshot; the prefix
/// then gets no hybrid hit and is recomputed in full.
/// Engine level adds: the recomputed outputs equal the first run's.
#[test]
fn ac20_kv_eviction_drops_the_snapshot() {
    let block = 4;
    let mut manager = hybrid(block, 4, 4);
    let r1 = seq(1, 2 * block + 1);
    run_to_completion(&mut manager, 1, &r1, 4096);
    assert_eq!(manager.stats().num_snapshot_slots_used, 1);
    // Three blocks: two free, one evicted, the tail of R1's chain, which carries the snapshot.
    run_to_completion(&mut manager, 2, &seq(500, 2 * block + 1), 4096);
    assert_eq!(manager.stats().num_snapshot_slots_used, 1, "R2's own snapshot replaced R1's");
    let r1_snapshot = manager.snapshot_pool().unwrap().iter_published().next().unwrap();
    add(&mut manager, 3, &r1);
    assert_ne!(Some(r1_snapshot.1), manager.block_hashes(rid(3)).unwrap().get(1).copied());
    let hit = manager.get_computed_blocks(rid(3)).unwrap();
    assert_eq!(hit.num_computed_tokens, 0);
    let grants = prefill_rest(&mut manager, 3, r1.len());
    assert_eq!(computed(&grants), r1.len());
}

/// AC-20, the count itself: the allocation that evicts the block carrying the snapshot lowers
/// the used slot count by one at once, before anything new is committed.
/// Engine level adds: the slot count in `/metrics` (`routed_mamba_snapshot_slots_used`).
#[test]
fn ac20_snapshot_count_drops_by_one_on_kv_eviction() {
    let block = 4;
    let mut manager = hybrid(block, 4, 4);
    run_to_completion(&mut manager, 1, &seq(1, 2 * block + 1), 4096);
    let before = manager.stats().num_snapshot_slots_used;
    assert_eq!(before, 1);
    // Three blocks: the two free ones and R1's tail, the only idle leaf.
    add(&mut manager, 2, &seq(500, 3 * block));
    let step = manager.allocate_slots(&[SlotRequest::new(rid(2))], 4096).unwrap();
    manager.check_invariants().unwrap();
    assert_eq!(manager.stats().num_snapshot_slots_used, before - 1);
    commit_all(&mut manager, &step);
}

/// AC-21: one snapshot slot, three distinct prefixes: no error, at most one prefix skips.
/// Engine level adds: every output equals caching off.
#[test]
fn ac21_snapshot_pool_exhaustion_degrades_gracefully() {
    let mut manager = hybrid(B, 64, 1);
    let prompts: Vec<Vec<u32>> = (0..3).map(|i| seq(10_000 * (i + 1), 2 * B + 3)).collect();
    for (i, prompt) in prompts.iter().enumerate() {
        run_to_completion(&mut manager, i as u64, prompt, 4096);
        assert!(manager.stats().num_snapshot_slots_used <= 1);
    }
    let mut num_skipping = 0;
    for (i, prompt) in prompts.iter().enumerate() {
        let grants = run_to_completion(&mut manager, 10 + i as u64, prompt, 4096);
        num_skipping += usize::from(grants[0].num_cached_tokens > 0);
        assert_eq!(computed(&grants) + grants[0].num_cached_tokens, prompt.len());
    }
    assert!(num_skipping <= 1);
    assert!(manager.stats().num_snapshot_slots_used <= 1);
}

/// AC-26: stats identities. Computed + skipped = prompt lengths; an admission deferred for lack
/// of blocks counts no hit, and the retried admission counts exactly one.
/// Engine level adds: the same identities over the `/metrics` counters and usage fields.
#[test]
fn ac26_stats_identities_hold_across_deferred_admissions() {
    let block = 4;
    let mut manager = KvCacheManager::new(CacheConfig::attention(block, 8)).unwrap();
    let shared = seq(1, 2 * block);
    let r1 = [shared.clone(), seq(100, 3)].concat();
    run_to_completion(&mut manager, 1, &r1, 4096);
    // A big request holds most of the pool.
    let big = seq(5000, 6 * block);
    prefill(&mut manager, 2, &big, 4096);
    let r3 = [shared, seq(200, 2 * block + 1)].concat();
    add(&mut manager, 3, &r3);
    let before = manager.stats();
    let step = manager.allocate_slots(&[SlotRequest::new(rid(3))], 4096).unwrap();
    assert!(step.grants.is_empty());
    assert_eq!(step.deferred[0].reason, routed_cache::DeferReason::NoFreeBlocks);
    let after = manager.stats();
    assert_eq!(after.num_prefix_cache_hits, before.num_prefix_cache_hits);
    assert_eq!(after.num_prefill_tokens_skipped, before.num_prefill_tokens_skipped);
    assert_eq!(after.num_prefill_tokens_computed, before.num_prefill_tokens_computed);
    assert_eq!(after.num_deferrals, before.num_deferrals + 1);

    manager.free(&[rid(2)]).unwrap();
    let grants = prefill_rest(&mut manager, 3, r3.len());
    assert_eq!(grants[0].num_cached_tokens, 2 * block);
    let stats = manager.stats();
    assert_eq!(stats.num_prefix_cache_hits, 1);
    let prompt_total = (r1.len() + big.len() + r3.len()) as u64;
    assert_eq!(stats.num_prefill_tokens_computed + stats.num_prefill_tokens_skipped, prompt_total);
}

/// AC-14 (cache side): identical prompts arriving in one step: the second waits for the first's
/// blocks to be committed, then hits them.
/// Engine level adds: outputs equal; no read of unwritten KV or state.
#[test]
fn ac14_same_step_sibling_waits_then_hits() {
    let mut manager = attention(32);
    let prompt = seq(1, 2 * B + 10);
    add(&mut manager, 1, &prompt);
    add(&mut manager, 2, &prompt);
    let first = step(&mut manager, &[1, 2], 4096);
    assert_eq!(first.grants.len(), 1);
    assert_eq!(first.deferred[0].reason, routed_cache::DeferReason::PendingSibling);
    let second = step(&mut manager, &[2], 4096);
    assert_eq!(second.grants[0].num_cached_tokens, 2 * B);
}

/// AC-15 (cache side): a writer aborted before its commit publishes nothing; a late commit for
/// it is stale.
/// Engine level adds: the abort happens mid-flight through the runtime; outputs equal.
#[test]
fn ac15_aborted_writer_publishes_nothing() {
    let mut manager = hybrid(B, 32, 8);
    let prompt = seq(1, 6 * B);
    add(&mut manager, 1, &prompt);
    let step = manager.allocate_slots(&[SlotRequest::with_max(rid(1), 2 * B)], 4096).unwrap();
    let entry: CommitEntry = step.grants[0].commit_entry();
    manager.free(&[rid(1)]).unwrap();
    let summary = manager.commit(&[entry]).unwrap();
    assert_eq!(summary.num_stale_entries, 1);
    manager.check_invariants().unwrap();
    let stats = manager.stats();
    assert_eq!((stats.num_blocks_cached, stats.num_snapshot_slots_used), (0, 0));
    add(&mut manager, 2, &prompt);
    assert_eq!(manager.get_computed_blocks(rid(2)).unwrap().num_computed_tokens, 0);
}
