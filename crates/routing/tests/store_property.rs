//! Seeded model-based property tests of `RoutingStore`.
//!
//! A simple reference model plays the KV cache manager (allocate, free, release, acquire,
//! reallocate with and without telling the store, prefix-cache reset, full reset) and remembers
//! the rows written per block position. After every operation the test checks that every block
//! reconstructs to exactly the rows written for its current generation, that stale writes never
//! appear, that missing or lost rows are errors naming their position, that losses are reported
//! exactly, and that the byte accounting and the cap hold.

mod model;

use model::Sim;
use routed_routing::RoutingStoreConfig;

const OPS_PER_SEED: usize = 12_000;

fn config(
    num_blocks: usize,
    block_size: usize,
    num_experts: u32,
    cap_blocks: Option<usize>,
) -> RoutingStoreConfig {
    let (num_moe_layers, top_k) = (3, 2);
    let width = if num_experts <= 256 { 1 } else { 2 };
    let block_bytes = block_size * num_moe_layers * top_k * width;
    RoutingStoreConfig {
        num_blocks,
        block_size,
        num_moe_layers,
        top_k,
        num_experts,
        max_bytes: cap_blocks.map(|c| c * block_bytes),
    }
}

/// Runs each seed and checks it reached every path the configuration allows.
fn run_seeds(seeds: &[u64], config: RoutingStoreConfig, capped: bool) {
    for &seed in seeds {
        let mut sim = Sim::new(seed, config.clone());
        sim.run(OPS_PER_SEED);
        let c = &sim.cov;
        let reached = [
            c.rows_written,
            c.rows_dropped,
            c.never_written,
            c.ghosts,
            c.acquired,
            c.acquire_lost,
            c.resets,
            c.clears,
            c.full_blocks_ok,
            c.missing_errors,
            c.stale_errors,
            c.lost_errors,
        ];
        assert!(reached.iter().all(|&n| n > 0), "seed {seed} left a path unexercised: {c:?}");
        assert_eq!(capped, c.evicted > 0 && c.refused > 0, "seed {seed} cap paths: {c:?}");
    }
}

#[test]
fn property_default_cap_u8() {
    run_seeds(&[1, 2, 3], config(12, 4, 8, None), false);
}

#[test]
fn property_tight_cap_u8_evicts_and_refuses() {
    run_seeds(&[11, 12, 13], config(16, 4, 16, Some(3)), true);
}

#[test]
fn property_half_cap_u16() {
    run_seeds(&[21, 22, 23], config(16, 5, 300, Some(8)), true);
}

#[test]
fn property_wide_blocks_multiword_bitmap() {
    run_seeds(&[31, 32], config(8, 70, 1000, Some(5)), true);
}
