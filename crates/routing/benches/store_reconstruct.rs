//! Micro-benchmark: store the routing of a 32k-token request in 2048-token steps, then rebuild it
//! from its block table.
//!
//! Run with `cargo bench -p routed-routing --bench store_reconstruct`.

use std::hint::black_box;
use std::time::{Duration, Instant};

use routed_routing::{RoutingStore, RoutingStoreConfig};
use routed_types::{BlockGeneration, BlockId, BlockRef, RoutingMeta};

const TOKENS: usize = 32_768;
const STEP_TOKENS: usize = 2048;
const LAYERS: usize = 48;
const TOP_K: usize = 8;
const BLOCK_SIZE: usize = 16;
const POOL_BLOCKS: usize = 4 * TOKENS / BLOCK_SIZE;
const ITERATIONS: usize = 20;

/// A deterministic pseudo-random sequence (64-bit LCG), so runs are comparable.
struct Lcg(u64);

impl Lcg {
    fn next(&mut self) -> u64 {
        self.0 =
            self.0.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
        self.0 >> 33
    }
}

/// One prepared step: `(L, N, K)` ids, slot mapping and the blocks it touches.
struct Step {
    ids: Vec<i16>,
    slots: Vec<usize>,
    blocks: Vec<BlockRef>,
}

fn block_table(rng: &mut Lcg) -> Vec<BlockRef> {
    let mut pool: Vec<u32> = (0..POOL_BLOCKS as u32).collect();
    for i in (1..pool.len()).rev() {
        pool.swap(i, rng.next() as usize % (i + 1));
    }
    pool[..TOKENS / BLOCK_SIZE]
        .iter()
        .map(|&b| BlockRef::new(BlockId(b), BlockGeneration(1)))
        .collect()
}

fn steps(table: &[BlockRef], num_experts: u32, rng: &mut Lcg) -> Vec<Step> {
    (0..TOKENS / STEP_TOKENS)
        .map(|s| {
            let positions = s * STEP_TOKENS..(s + 1) * STEP_TOKENS;
            let ids = (0..LAYERS * STEP_TOKENS * TOP_K)
                .map(|_| (rng.next() % u64::from(num_experts)) as i16)
                .collect();
            let slots = positions
                .clone()
                .map(|p| table[p / BLOCK_SIZE].block.index() * BLOCK_SIZE + p % BLOCK_SIZE)
                .collect();
            let blocks = table[positions.start / BLOCK_SIZE..positions.end / BLOCK_SIZE].to_vec();
            Step { ids, slots, blocks }
        })
        .collect()
}

fn store_all(store: &mut RoutingStore, steps: &[Step]) -> Duration {
    let start = Instant::now();
    for step in steps {
        let outcome = store.store_step(&step.ids, &step.slots, &step.blocks).expect("valid step");
        black_box(outcome);
    }
    start.elapsed()
}

fn summary(label: &str, mut times: Vec<Duration>, bytes: usize) {
    times.sort();
    let median = times[times.len() / 2];
    let min = times[0];
    let gbps = bytes as f64 / median.as_secs_f64() / 1e9;
    println!(
        "  {label:<34} median {:>8.3} ms   min {:>8.3} ms   {gbps:>6.2} GB/s of ids",
        median.as_secs_f64() * 1e3,
        min.as_secs_f64() * 1e3,
    );
}

fn bench(num_experts: u32) {
    let meta = RoutingMeta {
        num_layers: LAYERS as u32,
        moe_layer_ids: (0..LAYERS as u32).collect(),
        num_experts,
        top_k: TOP_K as u32,
    };
    let mut rng = Lcg(0x5eed);
    let table = block_table(&mut rng);
    let steps = steps(&table, num_experts, &mut rng);
    let config = RoutingStoreConfig::new(&meta, POOL_BLOCKS, BLOCK_SIZE);
    let probe = RoutingStore::new(config.clone()).expect("valid config");
    println!(
        "{TOKENS} tokens, L={LAYERS}, K={TOP_K}, block {BLOCK_SIZE}, steps of {STEP_TOKENS}, {num_experts} experts -> {:?} rows",
        probe.width()
    );
    let ids = TOKENS * LAYERS * TOP_K;
    let (mut first, mut overwrite, mut rebuild) = (Vec::new(), Vec::new(), Vec::new());
    let mut held = 0;
    for _ in 0..ITERATIONS {
        let mut store = RoutingStore::new(config.clone()).expect("valid config");
        first.push(store_all(&mut store, &steps));
        overwrite.push(store_all(&mut store, &steps));
        let start = Instant::now();
        let rows = store.reconstruct(&table, TOKENS, 0).expect("complete");
        rebuild.push(start.elapsed());
        assert_eq!(rows.ids.len(), ids);
        black_box(rows);
        held = store.bytes_held();
    }
    summary("store_step x16 (fresh blocks)", first, ids * 2);
    summary("store_step x16 (blocks already held)", overwrite, ids * 2);
    summary("reconstruct 32768 rows", rebuild, ids * 2);
    println!("  bytes held for the request: {held}");
}

fn main() {
    bench(128);
    bench(512);
}
