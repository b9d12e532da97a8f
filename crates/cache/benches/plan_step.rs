//! Times one step plan of the cache manager for 256 requests with shared prefixes:
//! `get_computed_blocks` for each, one `allocate_slots`, one `commit`.
//!
//! Run: `cargo bench -p routed-cache --bench plan_step`

use std::time::{Duration, Instant};

use routed_cache::{
    CacheConfig, CacheRequest, CommitEntry, KvCacheManager, SlotGrant, SlotRequest,
};
use routed_types::{SeqId, TokenId};

const NUM_REQUESTS: usize = 256;
const NUM_GROUPS: usize = 16;
const BLOCK_SIZE: usize = 16;
const PREFIX_LEN: usize = 1024;
const SUFFIX_LEN: usize = 100;
const NUM_ITERATIONS: usize = 40;

fn prompt(group: usize, request: u64) -> Vec<TokenId> {
    let prefix = (0..PREFIX_LEN).map(|i| (group * 100_000 + i) as TokenId);
    let suffix = (0..SUFFIX_LEN).map(|i| (request as usize * 1_000 + i) as TokenId + 5_000_000);
    prefix.chain(suffix).collect()
}

/// Adds one wave of requests; returns their ids.
fn add_wave(manager: &mut KvCacheManager, first_id: u64) -> Vec<SeqId> {
    (0..NUM_REQUESTS as u64)
        .map(|i| {
            let id = SeqId(first_id + i);
            let group = i as usize % NUM_GROUPS;
            manager.add_request(CacheRequest::new(id, prompt(group, first_id + i))).unwrap();
            id
        })
        .collect()
}

/// The timed part: prefix lookup for every request, one allocation, one commit.
fn plan_step(manager: &mut KvCacheManager, ids: &[SeqId], max_new: usize) -> Vec<SlotGrant> {
    let mut num_hit_tokens = 0;
    for &id in ids {
        if let Ok(hit) = manager.get_computed_blocks(id) {
            num_hit_tokens += hit.num_computed_tokens;
        }
    }
    std::hint::black_box(num_hit_tokens);
    let candidates: Vec<SlotRequest> =
        ids.iter().map(|&id| SlotRequest::with_max(id, max_new)).collect();
    let step = manager.allocate_slots(&candidates, usize::MAX).unwrap();
    let entries: Vec<CommitEntry> = step.grants.iter().map(SlotGrant::commit_entry).collect();
    manager.commit(&entries).unwrap();
    step.grants
}

fn summarize(name: &str, mut samples: Vec<Duration>) {
    samples.sort();
    let median = samples[samples.len() / 2];
    let mean = samples.iter().sum::<Duration>() / samples.len() as u32;
    println!(
        "plan_step/{name}: median {:.1} us, mean {:.1} us, min {:.1} us per step \
         of {NUM_REQUESTS} requests",
        median.as_secs_f64() * 1e6,
        mean.as_secs_f64() * 1e6,
        samples[0].as_secs_f64() * 1e6,
    );
}

/// Brings the cache to its steady state: each group's prefix computed once by a group leader;
/// then a full wave, in which (on a hybrid model) one request per group snapshots the end of the
/// shared prefix, its divergence point, while its siblings wait a step for it and then hit.
fn warm_up(manager: &mut KvCacheManager) {
    let leaders: Vec<SeqId> = add_wave(manager, 0).into_iter().take(NUM_GROUPS).collect();
    let rest: Vec<SeqId> = (NUM_GROUPS as u64..NUM_REQUESTS as u64).map(SeqId).collect();
    manager.free(&rest).unwrap();
    plan_step(manager, &leaders, usize::MAX);
    manager.free(&leaders).unwrap();
    let wave = add_wave(manager, 1_000);
    let mut waiting = wave.clone();
    while !waiting.is_empty() {
        plan_step(manager, &waiting, usize::MAX);
        waiting.retain(|&id| manager.block_table(id).unwrap().is_empty());
    }
    manager.free(&wave).unwrap();
}

fn bench(name: &str, config: CacheConfig) {
    let mut manager = KvCacheManager::new(config).unwrap();
    warm_up(&mut manager);
    let (mut prefill, mut decode) = (Vec::new(), Vec::new());
    for iteration in 1..=NUM_ITERATIONS as u64 {
        let ids = add_wave(&mut manager, iteration * 1_000_000);
        let start = Instant::now();
        let grants = plan_step(&mut manager, &ids, usize::MAX);
        prefill.push(start.elapsed());
        assert_eq!(grants.len(), NUM_REQUESTS);
        assert!(grants.iter().all(|g| g.num_cached_tokens == PREFIX_LEN));
        for &id in &ids {
            manager.append_token_ids(id, &[7]).unwrap();
        }
        let start = Instant::now();
        plan_step(&mut manager, &ids, 1);
        decode.push(start.elapsed());
        manager.free(&ids).unwrap();
        manager.take_dropped_blocks();
    }
    summarize(&format!("{name}/prefill_with_shared_prefix_hits"), prefill);
    summarize(&format!("{name}/decode"), decode);
}

fn main() {
    bench("attention", CacheConfig::attention(BLOCK_SIZE, 8192));
    bench("hybrid", CacheConfig::hybrid(BLOCK_SIZE, 8192, 2048));
}
