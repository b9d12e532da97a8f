//! Seeded random workloads against the manager, with every invariant checked after every
//! operation, and a shadow of what each block and snapshot slot physically holds so every hit
//! can be checked against the content it claims.

mod common;

use std::collections::HashMap;

use common::{Rng, rid};
use routed_cache::{
    CacheConfig, CacheRequest, CommitEntry, KvCacheManager, SlotGrant, SlotRequest,
};
use routed_types::{BlockGeneration, BlockHash, BlockId, BlockRef, SnapshotSlotId, TokenId};

const NUM_OPS: usize = 10_000;
const SEEDS: [u64; 4] = [1, 2, 3, 0xdead_beef];
const MAX_LIVE: usize = 12;

/// What the runner wrote where: `(generation written under, chain hash, epoch of the writer)`.
type Content = (BlockGeneration, BlockHash, u64);

struct Harness {
    manager: KvCacheManager,
    rng: Rng,
    block_size: usize,
    next_id: u64,
    /// Known requests, in arrival order.
    live: Vec<u64>,
    /// Granted, uncommitted steps, in grant order.
    uncommitted: Vec<SlotGrant>,
    /// Entries whose request went away; committing them must publish nothing.
    stale: Vec<CommitEntry>,
    families: Vec<Vec<TokenId>>,
    kv_content: HashMap<BlockId, Content>,
    /// `None`: a forward may have overwritten the slot without publishing it.
    snapshot_content: HashMap<SnapshotSlotId, Option<(BlockHash, u64)>>,
    epoch: u64,
    /// Per request: `(epoch at admission, tokens at admission)`.
    admissions: HashMap<u64, (u64, usize)>,
    expected: Expected,
}

#[derive(Default)]
struct Expected {
    hits: u64,
    skipped: u64,
    computed: u64,
    deferrals: u64,
}

impl Harness {
    fn new(config: CacheConfig, seed: u64) -> Self {
        let block_size = config.block_size;
        let mut rng = Rng::new(seed);
        let families = (0..4).map(|_| small_vocab(&mut rng, 10 * block_size)).collect();
        Self {
            manager: KvCacheManager::new(config).unwrap(),
            rng,
            block_size,
            next_id: 0,
            live: Vec::new(),
            uncommitted: Vec::new(),
            stale: Vec::new(),
            families,
            kv_content: HashMap::new(),
            snapshot_content: HashMap::new(),
            epoch: 0,
            admissions: HashMap::new(),
            expected: Expected::default(),
        }
    }

    fn run(&mut self, num_ops: usize) {
        for op in 0..num_ops {
            let roll = self.rng.below(100);
            match roll {
                0..15 => self.add(),
                15..50 => self.step(),
                50..58 => self.commit_uncommitted(),
                58..70 => self.append(),
                70..80 => self.finish(),
                80..85 => self.preempt(),
                85..87 => self.reset(),
                87..90 => self.forget(),
                _ => self.drain(),
            }
            if let Err(message) = self.manager.check_invariants() {
                panic!("op {op} (roll {roll}): {message}");
            }
            self.check_counters();
            self.check_published();
        }
    }

    /// Everything matchable holds what it claims: each published block was written for its hash
    /// in the current epoch, and so was each published snapshot.
    fn check_published(&self) {
        let pool = self.manager.block_pool();
        for index in 0..pool.num_usable_blocks() {
            let block_id = BlockId(index as u32);
            if let Some(hash) = pool.block_hash(block_id) {
                let expected = (pool.generation(block_id), hash, self.epoch);
                assert_eq!(self.kv_content.get(&block_id), Some(&expected), "{block_id:?}");
            }
        }
        let Some(snapshots) = self.manager.snapshot_pool() else { return };
        for (slot, hash, _) in snapshots.iter_published() {
            assert_eq!(
                self.snapshot_content.get(&slot),
                Some(&Some((hash, self.epoch))),
                "{slot:?}"
            );
        }
    }

    fn add(&mut self) {
        if self.live.len() >= MAX_LIVE {
            return self.finish();
        }
        let family = &self.families[self.rng.below(self.families.len())];
        let prefix_len = self.rng.below(family.len() + 1);
        let mut prompt = family[..prefix_len].to_vec();
        let suffix_len = self.rng.below(3 * self.block_size) + usize::from(prompt.is_empty());
        prompt.extend(small_vocab(&mut self.rng, suffix_len));
        let cache_salt = self.rng.chance(10).then(|| format!("salt{}", self.rng.below(2)));
        let skip_reading_prefix_cache = self.rng.chance(3);
        let id = self.next_id;
        self.next_id += 1;
        let request = CacheRequest {
            seq_id: rid(id),
            prompt_token_ids: prompt,
            cache_salt,
            skip_reading_prefix_cache,
        };
        self.manager.add_request(request).unwrap();
        self.live.push(id);
    }

    fn is_running(&self, id: u64) -> bool {
        !self.manager.block_table(rid(id)).unwrap().is_empty()
    }

    fn step(&mut self) {
        let (running, waiting): (Vec<u64>, Vec<u64>) =
            self.live.iter().partition(|&&id| self.is_running(id));
        let mut candidates = Vec::new();
        for id in running.into_iter().chain(waiting) {
            if self.rng.chance(80) {
                let cap = [1, 3, self.block_size, 2 * self.block_size + 1, usize::MAX];
                let max = cap[self.rng.below(cap.len())];
                candidates.push(SlotRequest::with_max(rid(id), max));
            }
        }
        let budget = self.rng.below(8 * self.block_size) + 1;
        let step = self.manager.allocate_slots(&candidates, budget).unwrap();
        assert!(step.num_scheduled_tokens <= budget);
        self.expected.deferrals += step.deferred.len() as u64;
        for grant in &step.grants {
            self.check_grant(grant);
        }
        for victim in &step.preempted {
            self.abandon(victim.0);
        }
        self.uncommitted.extend(step.grants);
        if self.rng.chance(70) {
            self.commit_uncommitted();
        }
    }

    fn check_grant(&mut self, grant: &SlotGrant) {
        let id = grant.seq_id.0;
        let num_tokens = self.manager.num_tokens(grant.seq_id).unwrap();
        assert!(grant.num_new_tokens >= 1 && grant.end() <= num_tokens);
        let pool = self.manager.block_pool();
        for &BlockRef { block: block_id, generation } in &grant.new_blocks {
            assert!(!pool.is_scratch(block_id));
            assert_eq!(pool.generation(block_id), generation);
        }
        if grant.is_admission {
            self.admissions.insert(id, (self.epoch, num_tokens));
            self.expected.hits += u64::from(grant.num_cached_tokens > 0);
            self.expected.skipped += grant.num_cached_tokens as u64;
            self.check_hit(grant);
        }
        let prefill_len = self.admissions[&id].1;
        let computed = grant.end().min(prefill_len).saturating_sub(grant.num_computed_tokens);
        self.expected.computed += computed as u64;
        for planned in &grant.snapshots {
            self.snapshot_content.insert(planned.slot, None);
        }
    }

    /// A hit covers only blocks the runner wrote for this very chain in this epoch, and a hybrid
    /// hit restores a snapshot taken at exactly its end.
    fn check_hit(&self, grant: &SlotGrant) {
        let cached = grant.num_cached_tokens;
        assert_eq!(cached % self.block_size, 0);
        assert!(cached < self.manager.num_tokens(grant.seq_id).unwrap());
        let table = self.manager.block_table(grant.seq_id).unwrap();
        let hashes = self.manager.block_hashes(grant.seq_id).unwrap();
        let pool = self.manager.block_pool();
        let num_hit = cached / self.block_size;
        for (&block_id, &hash) in table[..num_hit].iter().zip(hashes) {
            let expected = (pool.generation(block_id), hash, self.epoch);
            assert_eq!(self.kv_content.get(&block_id), Some(&expected), "hit on unwritten content");
        }
        if self.manager.config().is_hybrid() {
            assert_eq!(grant.restore_from.is_some(), cached > 0);
            if let Some(slot) = grant.restore_from {
                let expected = Some((hashes[num_hit - 1], self.epoch));
                assert_eq!(self.snapshot_content.get(&slot), Some(&expected), "bad restore");
            }
        } else {
            assert_eq!(grant.restore_from, None);
        }
    }

    fn commit_uncommitted(&mut self) {
        let grants = std::mem::take(&mut self.uncommitted);
        let mut entries = Vec::with_capacity(grants.len());
        for grant in &grants {
            let mut entry = grant.commit_entry();
            entry.snapshots_written.retain(|_| self.rng.chance(75));
            self.record_writes(grant, &entry);
            entries.push(entry);
        }
        let stale = std::mem::take(&mut self.stale);
        let num_stale = stale.len();
        entries.extend(stale);
        let summary = self.manager.commit(&entries).unwrap();
        assert_eq!(summary.num_stale_entries, num_stale);
    }

    /// The runner completed `grant`: its blocks and written snapshots now hold its chain.
    fn record_writes(&mut self, grant: &SlotGrant, entry: &CommitEntry) {
        let epoch = self.admissions[&grant.seq_id.0].0;
        let table = self.manager.block_table(grant.seq_id).unwrap();
        let hashes = self.manager.block_hashes(grant.seq_id).unwrap();
        let pool = self.manager.block_pool();
        let first = grant.num_computed_tokens / self.block_size;
        for index in first..grant.end() / self.block_size {
            let block_id = table[index];
            if hashes.len() > index {
                self.kv_content.insert(block_id, (pool.generation(block_id), hashes[index], epoch));
            }
        }
        for planned in &grant.snapshots {
            if entry.snapshots_written.contains(&planned.slot) {
                self.snapshot_content.insert(planned.slot, Some((planned.block_hash, epoch)));
            }
        }
    }

    fn append(&mut self) {
        let ready: Vec<u64> = self
            .live
            .iter()
            .copied()
            .filter(|&id| {
                self.is_running(id)
                    && self.manager.num_computed_tokens(rid(id)).unwrap()
                        == self.manager.num_tokens(rid(id)).unwrap()
            })
            .collect();
        if ready.is_empty() {
            return;
        }
        let id = ready[self.rng.below(ready.len())];
        let token = small_vocab(&mut self.rng, 1);
        self.manager.append_token_ids(rid(id), &token).unwrap();
    }

    /// The scheduler drops a gone request's uncommitted grants, or (sometimes) still sends their
    /// commit late, which must then be stale.
    fn abandon(&mut self, id: u64) {
        let (gone, kept): (Vec<SlotGrant>, Vec<SlotGrant>) =
            std::mem::take(&mut self.uncommitted).into_iter().partition(|g| g.seq_id.0 == id);
        self.uncommitted = kept;
        for grant in gone {
            if self.rng.chance(50) {
                self.stale.push(grant.commit_entry());
            }
            // The forward may have run and scribbled on the reserved slots.
            for planned in &grant.snapshots {
                self.snapshot_content.insert(planned.slot, None);
            }
        }
    }

    fn finish(&mut self) {
        if self.live.is_empty() {
            return;
        }
        let index = self.rng.below(self.live.len());
        let id = self.live.remove(index);
        self.abandon(id);
        self.manager.free(&[rid(id)]).unwrap();
    }

    fn preempt(&mut self) {
        let running: Vec<u64> =
            self.live.iter().copied().filter(|&id| self.is_running(id)).collect();
        if running.is_empty() {
            return;
        }
        let id = running[self.rng.below(running.len())];
        self.abandon(id);
        self.manager.preempt(&[rid(id)]).unwrap();
    }

    fn reset(&mut self) {
        self.epoch += 1;
        let dropped = self.manager.reset_prefix_cache();
        let stats = self.manager.stats();
        assert_eq!(stats.num_blocks_cached, 0);
        assert_eq!(stats.num_snapshot_slots_used, 0);
        for BlockRef { block: block_id, .. } in dropped {
            assert_eq!(self.manager.block_pool().ref_count(block_id), 0);
        }
    }

    fn forget(&mut self) {
        let num_usable = self.manager.block_pool().num_usable_blocks();
        let block_id = BlockId(self.rng.below(num_usable) as u32);
        let mut generation = self.manager.block_pool().generation(block_id);
        if self.rng.chance(20) {
            generation = BlockGeneration(generation.0.wrapping_sub(1));
        }
        let was_cached = self.manager.block_pool().block_hash(block_id).is_some();
        self.manager.forget(&[BlockRef::new(block_id, generation)]);
        if self.manager.block_pool().generation(block_id) == generation {
            assert_eq!(self.manager.block_pool().block_hash(block_id), None);
        } else {
            assert_eq!(self.manager.block_pool().block_hash(block_id).is_some(), was_cached);
        }
    }

    fn drain(&mut self) {
        for BlockRef { block: block_id, generation } in self.manager.take_dropped_blocks() {
            let pool = self.manager.block_pool();
            assert!(generation <= pool.generation(block_id));
            assert!(pool.generation(block_id) != generation || pool.block_hash(block_id).is_none());
        }
    }

    fn check_counters(&self) {
        let stats = self.manager.stats();
        assert_eq!(stats.num_prefix_cache_hits, self.expected.hits);
        assert_eq!(stats.num_prefill_tokens_skipped, self.expected.skipped);
        assert_eq!(stats.num_prefill_tokens_computed, self.expected.computed);
        assert_eq!(stats.num_deferrals, self.expected.deferrals);
        assert!(stats.num_snapshot_slots_used <= stats.num_snapshot_slots_total);
    }
}

/// Tokens from a tiny vocabulary, so independent requests sometimes produce equal blocks.
fn small_vocab(rng: &mut Rng, n: usize) -> Vec<TokenId> {
    (0..n).map(|_| rng.below(3) as TokenId).collect()
}

fn run_seeds(config: CacheConfig) {
    for seed in SEEDS {
        let mut harness = Harness::new(config.clone(), seed);
        harness.run(NUM_OPS);
        let stats = harness.manager.stats();
        assert!(stats.num_prefix_cache_hits > 0, "seed {seed}: the workload never hit");
    }
}

#[test]
fn attention_only_invariants_hold_under_random_operations() {
    run_seeds(CacheConfig { num_scratch_blocks: 2, ..CacheConfig::attention(4, 26) });
}

#[test]
fn hybrid_invariants_hold_under_random_operations() {
    run_seeds(CacheConfig { num_scratch_blocks: 1, ..CacheConfig::hybrid(4, 25, 6) });
}

#[test]
fn hybrid_with_a_roomy_pool_holds_its_invariants() {
    run_seeds(CacheConfig::hybrid(4, 96, 24));
}

#[test]
fn hybrid_with_generated_positions_and_no_sibling_deferral_holds_its_invariants() {
    run_seeds(CacheConfig {
        hash_generated_positions: true,
        defer_pending_siblings: false,
        ..CacheConfig::hybrid(3, 24, 3)
    });
}
