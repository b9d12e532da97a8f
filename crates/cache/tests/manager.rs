//! The manager's protocol beyond the acceptance cases: errors, preemption, reset, forget, decode
//! blocks, salts, slot mapping, chunk alignment.

mod common;

use common::{add, commit_all, computed, prefill, rid, run_to_completion, seq, step};
use routed_cache::{
    CacheConfig, CacheError, CacheRequest, DeferReason, KvCacheManager, SlotRequest,
    snapshot_positions,
};
use routed_types::{BlockId, BlockRef};

const B: usize = 4;

fn attention(num_blocks: usize) -> KvCacheManager {
    KvCacheManager::new(CacheConfig::attention(B, num_blocks)).unwrap()
}

#[test]
fn misuse_is_an_error_and_changes_nothing() {
    let mut manager = attention(8);
    add(&mut manager, 1, &seq(1, 5));
    let dup = manager.add_request(CacheRequest::new(rid(1), vec![1]));
    assert_eq!(dup, Err(CacheError::DuplicateRequest(rid(1))));
    let empty = manager.add_request(CacheRequest::new(rid(2), vec![]));
    assert_eq!(empty, Err(CacheError::EmptyPrompt(rid(2))));
    let unknown = manager.allocate_slots(&[SlotRequest::new(rid(1)), SlotRequest::new(rid(3))], 64);
    assert_eq!(unknown, Err(CacheError::UnknownRequest(rid(3))));
    assert_eq!(manager.block_table(rid(1)).unwrap(), &[] as &[BlockId]);
    let repeated = manager.free(&[rid(1), rid(1)]);
    assert_eq!(repeated, Err(CacheError::RepeatedRequest(rid(1))));
    step(&mut manager, &[1], 64);
    assert_eq!(manager.get_computed_blocks(rid(1)), Err(CacheError::AlreadyAdmitted(rid(1))));
    let out_of_range = manager.slot_mapping(rid(1), 0..9);
    assert!(matches!(out_of_range, Err(CacheError::PositionOutOfRange { .. })));
    let bad =
        KvCacheManager::new(CacheConfig { num_scratch_blocks: 8, ..CacheConfig::attention(B, 8) });
    assert!(matches!(bad, Err(CacheError::InvalidConfig(_))));
    manager.check_invariants().unwrap();
}

#[test]
fn grants_must_be_committed_in_order() {
    let mut manager = attention(8);
    add(&mut manager, 1, &seq(1, 12));
    let first = manager.allocate_slots(&[SlotRequest::with_max(rid(1), 4)], 64).unwrap();
    let second = manager.allocate_slots(&[SlotRequest::with_max(rid(1), 4)], 64).unwrap();
    let out_of_order = manager.commit(&[second.grants[0].commit_entry()]);
    assert_eq!(out_of_order, Err(CacheError::OutOfOrderCommit(rid(1))));
    let entries = [first.grants[0].commit_entry(), second.grants[0].commit_entry()];
    assert_eq!(manager.commit(&entries).unwrap().num_blocks_published, 2);
    manager.check_invariants().unwrap();
}

#[test]
fn slot_mapping_follows_the_block_table() {
    let mut manager =
        KvCacheManager::new(CacheConfig { num_scratch_blocks: 2, ..CacheConfig::attention(B, 10) })
            .unwrap();
    run_to_completion(&mut manager, 1, &seq(1, 6), 64);
    prefill(&mut manager, 2, &seq(100, 10), 64);
    let table = manager.block_table(rid(2)).unwrap().to_vec();
    let slots = manager.slot_mapping(rid(2), 3..10).unwrap();
    let expected: Vec<u64> =
        (3..10).map(|p| (table[p / B].0 as usize * B + p % B) as u64).collect();
    assert_eq!(slots, expected);
    let generations = manager.block_generations(rid(2)).unwrap();
    let pool = manager.block_pool();
    assert_eq!(generations, table.iter().map(|&b| pool.generation(b)).collect::<Vec<_>>());
    assert_eq!(manager.scratch_blocks(), [BlockId(8), BlockId(9)]);
    let scratch = manager.scratch_slot_mapping(10);
    assert_eq!(scratch, [32, 33, 34, 35, 36, 37, 38, 39, 32, 33]);
}

#[test]
fn token_budget_is_never_exceeded_and_skipped_tokens_are_free() {
    let mut manager = attention(64);
    let shared = seq(1, 8 * B);
    run_to_completion(&mut manager, 1, &[shared.clone(), vec![9]].concat(), 1024);
    add(&mut manager, 2, &[shared, seq(500, 5)].concat());
    add(&mut manager, 3, &seq(900, 20));
    let step =
        manager.allocate_slots(&[SlotRequest::new(rid(2)), SlotRequest::new(rid(3))], 7).unwrap();
    assert_eq!(step.grants[0].num_cached_tokens, 8 * B);
    assert_eq!(step.grants[0].num_new_tokens, 5, "the whole cached prefix is skipped in one step");
    assert_eq!(step.grants[1].num_new_tokens, 2);
    assert_eq!(step.num_scheduled_tokens, 7);
    commit_all(&mut manager, &step);
    add(&mut manager, 4, &seq(2000, 3));
    let step =
        manager.allocate_slots(&[SlotRequest::new(rid(3)), SlotRequest::new(rid(4))], 18).unwrap();
    assert_eq!(step.num_scheduled_tokens, 18);
    assert_eq!(step.deferred[0].reason, DeferReason::TokenBudget);
}

#[test]
fn a_running_request_short_of_blocks_preempts_the_lowest_priority_one() {
    // Three requests of two blocks each and one spare block.
    let mut manager = attention(7);
    prefill(&mut manager, 1, &seq(1, 8), 64);
    prefill(&mut manager, 2, &seq(100, 8), 64);
    prefill(&mut manager, 3, &seq(200, 8), 64);
    manager.append_token_ids(rid(1), &[5]).unwrap();
    manager.append_token_ids(rid(2), &[5]).unwrap();
    let candidates: Vec<SlotRequest> =
        [1, 2, 3].iter().map(|&id| SlotRequest::with_max(rid(id), 1)).collect();
    let step = manager.allocate_slots(&candidates, 64).unwrap();
    manager.check_invariants().unwrap();
    assert_eq!(step.preempted, [rid(3)]);
    assert_eq!(step.grants.len(), 2);
    assert!(manager.block_table(rid(3)).unwrap().is_empty());
    commit_all(&mut manager, &step);
    // Re-admitted later, the preempted request hits its own cached prompt.
    manager.free(&[rid(1), rid(2)]).unwrap();
    let step = step_one(&mut manager, 3);
    assert_eq!(step.grants[0].num_cached_tokens, 4);
    assert_eq!(manager.stats().num_preemptions, 1);
}

fn step_one(manager: &mut KvCacheManager, id: u64) -> routed_cache::StepAllocation {
    step(manager, &[id], 64)
}

#[test]
fn a_running_request_with_no_victim_preempts_itself() {
    let mut manager = attention(2);
    prefill(&mut manager, 1, &seq(1, 8), 64);
    manager.append_token_ids(rid(1), &[5]).unwrap();
    let step = manager.allocate_slots(&[SlotRequest::new(rid(1))], 64).unwrap();
    assert_eq!(step.preempted, [rid(1)]);
    assert!(step.grants.is_empty() && step.deferred.is_empty());
    manager.check_invariants().unwrap();
}

#[test]
fn reset_drops_idle_blocks_and_stops_running_requests_from_publishing() {
    let mut manager = KvCacheManager::new(CacheConfig::hybrid(B, 16, 4)).unwrap();
    run_to_completion(&mut manager, 1, &seq(1, 9), 64);
    add(&mut manager, 2, &seq(500, 12));
    let in_flight = manager.allocate_slots(&[SlotRequest::with_max(rid(2), 8)], 64).unwrap();
    let dropped = manager.reset_prefix_cache();
    assert_eq!(dropped.len(), 2);
    assert_eq!(manager.take_dropped_blocks().len(), 3, "R1's partial block, freed earlier, too");
    commit_all(&mut manager, &in_flight);
    step(&mut manager, &[2], 64);
    let stats = manager.stats();
    assert_eq!((stats.num_blocks_cached, stats.num_snapshot_slots_used), (0, 0));
    manager.free(&[rid(2)]).unwrap();
    add(&mut manager, 3, &seq(1, 9));
    assert_eq!(manager.get_computed_blocks(rid(3)).unwrap().num_computed_tokens, 0);
    // Work admitted after the reset publishes again.
    let grants = run_to_completion(&mut manager, 4, &seq(1, 9), 64);
    assert_eq!(grants[0].num_cached_tokens, 0);
    assert_eq!(manager.stats().num_blocks_cached, 2);
}

#[test]
fn forgotten_blocks_stop_matching_and_stale_generations_are_ignored() {
    let mut manager = attention(8);
    let prompt = seq(1, 13);
    run_to_completion(&mut manager, 1, &prompt, 64);
    add(&mut manager, 2, &prompt);
    let hit = manager.get_computed_blocks(rid(2)).unwrap();
    assert_eq!(hit.block_ids.len(), 3);
    let pool = manager.block_pool();
    let second = BlockRef::new(hit.block_ids[1], pool.generation(hit.block_ids[1]));
    let stale = BlockRef::new(
        hit.block_ids[0],
        routed_types::BlockGeneration(pool.generation(hit.block_ids[0]).0 + 7),
    );
    assert_eq!(manager.forget(&[second, stale]), 1);
    manager.check_invariants().unwrap();
    assert_eq!(manager.get_computed_blocks(rid(2)).unwrap().block_ids.len(), 1);
    assert!(manager.take_dropped_blocks().contains(&second));
}

#[test]
fn blocks_completed_during_decode_are_published_after_their_compute() {
    let mut manager = attention(8);
    let prompt = seq(1, 6);
    prefill(&mut manager, 1, &prompt, 64);
    assert_eq!(manager.stats().num_blocks_cached, 1);
    let mut generated = Vec::new();
    for token in [70, 71, 72] {
        manager.append_token_ids(rid(1), &[token]).unwrap();
        generated.push(token);
        let before = manager.stats().num_blocks_cached;
        let step = manager.allocate_slots(&[SlotRequest::with_max(rid(1), 1)], 64).unwrap();
        assert_eq!(manager.stats().num_blocks_cached, before, "nothing published at schedule time");
        commit_all(&mut manager, &step);
    }
    assert_eq!(manager.stats().num_blocks_cached, 2, "positions 4..8 are computed");
    manager.free(&[rid(1)]).unwrap();
    // AC-25: the next turn's prompt is the previous prompt + reply + new text.
    let turn2 = [prompt, generated, seq(900, 5)].concat();
    let grants = run_to_completion(&mut manager, 2, &turn2, 64);
    assert_eq!(grants[0].num_cached_tokens, 8);
}

#[test]
fn salted_requests_share_only_with_the_same_salt() {
    let mut manager = attention(16);
    let prompt = seq(1, 9);
    let salted = |id: u64, salt: &str| CacheRequest {
        cache_salt: Some(salt.to_owned()),
        ..CacheRequest::new(rid(id), prompt.clone())
    };
    manager.add_request(salted(1, "a")).unwrap();
    step(&mut manager, &[1], 64);
    manager.free(&[rid(1)]).unwrap();
    manager.add_request(salted(2, "b")).unwrap();
    manager.add_request(salted(3, "a")).unwrap();
    add(&mut manager, 4, &prompt);
    assert_eq!(manager.get_computed_blocks(rid(2)).unwrap().block_ids.len(), 0);
    assert_eq!(manager.get_computed_blocks(rid(3)).unwrap().block_ids.len(), 2);
    assert_eq!(manager.get_computed_blocks(rid(4)).unwrap().block_ids.len(), 0);
}

#[test]
fn skip_reading_prefix_cache_computes_every_prompt_token() {
    let mut manager = attention(16);
    let prompt = seq(1, 9);
    run_to_completion(&mut manager, 1, &prompt, 64);
    let request = CacheRequest {
        skip_reading_prefix_cache: true,
        ..CacheRequest::new(rid(2), prompt.clone())
    };
    manager.add_request(request).unwrap();
    let step = step(&mut manager, &[2], 64);
    assert_eq!(step.grants[0].num_cached_tokens, 0);
    assert_eq!(step.grants[0].num_new_tokens, 9);
}

#[test]
fn hybrid_chunks_end_on_block_boundaries_but_always_progress() {
    let mut manager = KvCacheManager::new(CacheConfig::hybrid(16, 16, 8)).unwrap();
    // AC-30: a budget smaller than a block still makes progress.
    let grants = prefill(&mut manager, 1, &seq(1, 3 * 16 + 10), 10);
    assert_eq!(computed(&grants), 58);
    let ends: Vec<usize> = grants.iter().map(|g| g.end()).collect();
    assert_eq!(&ends[..2], [10, 16], "the second chunk re-aligns to the boundary");
    assert!(grants.iter().all(|g| g.num_new_tokens <= 10));
    let grants = prefill(&mut manager, 2, &seq(1000, 50), 20);
    let ends: Vec<usize> = grants.iter().map(|g| g.end()).collect();
    assert_eq!(ends, [16, 32, 50]);
}

#[test]
fn snapshot_positions_cover_the_documented_boundaries() {
    // Last complete block and replay boundary of an unaligned prompt coincide.
    assert_eq!(snapshot_positions(4, 10, None, 0..10), [8]);
    // Aligned prompt: the replay boundary is one block early.
    assert_eq!(snapshot_positions(4, 12, None, 0..12), [8, 12]);
    // Divergence point and a chunk end on a boundary.
    assert_eq!(snapshot_positions(4, 30, Some(8), 4..16), [8, 16]);
    // Outside the chunk or past the prefill: nothing.
    assert_eq!(snapshot_positions(4, 10, None, 10..11), [] as [usize; 0]);
    // A chunk starting off a boundary yields only its end.
    assert_eq!(snapshot_positions(4, 30, Some(8), 6..12), [12]);
    assert_eq!(snapshot_positions(4, 30, Some(8), 6..11), [] as [usize; 0]);
}

#[test]
fn the_generated_positions_key_keeps_recomputed_decode_blocks_apart() {
    let config = CacheConfig { hash_generated_positions: true, ..CacheConfig::attention(B, 16) };
    let mut manager = KvCacheManager::new(config).unwrap();
    prefill(&mut manager, 1, &seq(1, 6), 64);
    manager.append_token_ids(rid(1), &[7, 8]).unwrap();
    let step = manager.allocate_slots(&[SlotRequest::new(rid(1))], 64).unwrap();
    commit_all(&mut manager, &step);
    manager.free(&[rid(1)]).unwrap();
    // Same 8 tokens, all prompt this time: block 1 was half generated before, so it must miss.
    add(&mut manager, 2, &[seq(1, 6), vec![7, 8], vec![9]].concat());
    assert_eq!(manager.get_computed_blocks(rid(2)).unwrap().block_ids.len(), 1);
}

#[test]
fn with_prefix_caching_off_commits_publish_nothing_and_nothing_hits() {
    let config = CacheConfig { enable_prefix_caching: false, ..CacheConfig::attention(4, 16) };
    let mut manager = KvCacheManager::new(config).unwrap();
    let prompt = seq(1, 10);
    prefill(&mut manager, 1, &prompt, 64);
    manager.append_token_ids(rid(1), &[70, 71]).unwrap();
    let step = manager.allocate_slots(&[SlotRequest::with_max(rid(1), 1)], 64).unwrap();
    commit_all(&mut manager, &step);
    assert_eq!(manager.stats().num_blocks_cached, 0);
    manager.free(&[rid(1)]).unwrap();
    let grants = run_to_completion(&mut manager, 2, &prompt, 64);
    assert_eq!(grants[0].num_cached_tokens, 0);
    assert_eq!(manager.stats().num_blocks_free, manager.stats().num_blocks_total);
}
