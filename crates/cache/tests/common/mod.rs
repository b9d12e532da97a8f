//! Helpers shared by the cache's integration tests: a seeded generator and a step driver that
//! plays the scheduler and the runner.

#![allow(dead_code)] // Each test binary uses a different subset.

use routed_cache::{
    CacheRequest, CommitEntry, KvCacheManager, SlotGrant, SlotRequest, StepAllocation,
};
use routed_test_support::SplitMix64;
use routed_types::{SeqId, TokenId};

/// The tests' seeded generator (test-support's SplitMix64) with the draws they make.
#[derive(Clone, Debug)]
pub struct Rng(SplitMix64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Self(SplitMix64(seed))
    }

    /// Uniform in `0..n` (n > 0).
    pub fn below(&mut self, n: usize) -> usize {
        self.0.below(n)
    }

    /// True with probability `percent / 100`.
    pub fn chance(&mut self, percent: u64) -> bool {
        self.0.next_u64() % 100 < percent
    }

    pub fn tokens(&mut self, n: usize) -> Vec<TokenId> {
        (0..n).map(|_| (self.0.next_u64() % 50_000) as TokenId).collect()
    }
}

/// `n` distinct tokens starting at `base` (readable, collision-free across calls with distinct
/// bases).
pub fn seq(base: u32, n: usize) -> Vec<TokenId> {
    (0..n as u32).map(|i| base + i).collect()
}

pub fn rid(id: u64) -> SeqId {
    SeqId(id)
}

pub fn add(manager: &mut KvCacheManager, id: u64, prompt: &[TokenId]) {
    manager.add_request(CacheRequest::new(rid(id), prompt.to_vec())).expect("add_request");
}

/// Commits every grant of a step as fully written, then checks invariants.
pub fn commit_all(manager: &mut KvCacheManager, step: &StepAllocation) {
    let entries: Vec<CommitEntry> = step.grants.iter().map(SlotGrant::commit_entry).collect();
    manager.commit(&entries).expect("commit");
    manager.check_invariants().expect("invariants after commit");
}

/// One step for the given candidates (no per-request cap), committed.
pub fn step(manager: &mut KvCacheManager, ids: &[u64], budget: usize) -> StepAllocation {
    let candidates: Vec<SlotRequest> = ids.iter().map(|&id| SlotRequest::new(rid(id))).collect();
    let step = manager.allocate_slots(&candidates, budget).expect("allocate_slots");
    manager.check_invariants().expect("invariants after allocate");
    commit_all(manager, &step);
    step
}

/// Adds a request and runs its whole prefill, one request per step under `budget`, committing
/// each step. Returns its grants, one per chunk.
pub fn prefill(
    manager: &mut KvCacheManager,
    id: u64,
    prompt: &[TokenId],
    budget: usize,
) -> Vec<SlotGrant> {
    add(manager, id, prompt);
    let mut grants = Vec::new();
    loop {
        let step = step(manager, &[id], budget);
        assert_eq!(step.grants.len(), 1, "prefill of {id} stalled: {step:?}");
        let grant = step.grants.into_iter().next().expect("one grant");
        let done = grant.end() == prompt.len();
        grants.push(grant);
        if done {
            return grants;
        }
    }
}

/// Prefills a request and frees it, leaving its blocks cached.
pub fn run_to_completion(
    manager: &mut KvCacheManager,
    id: u64,
    prompt: &[TokenId],
    budget: usize,
) -> Vec<SlotGrant> {
    let grants = prefill(manager, id, prompt, budget);
    manager.free(&[rid(id)]).expect("free");
    manager.check_invariants().expect("invariants after free");
    grants
}

/// Prompt tokens computed over the chunks of one request.
pub fn computed(grants: &[SlotGrant]) -> usize {
    grants.iter().map(|g| g.num_new_tokens).sum()
}
