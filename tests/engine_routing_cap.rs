//! A routing memory cap below the KV pool: the pool shrinks to the blocks whose rows fit, idle
//! blocks (and their rows) are evicted least recently used first, and a prefix-heavy workload runs
//! with zero failures and rows identical to an uncapped engine. A request that could never fit is
//! refused before it runs, naming the cap.

mod common;

use common::{Outcome, engine, request, run};
use futures_util::future::join_all;
use routed::runtime::EngineError;
use routed::types::TokenId;
use routed_test_support::Golden;

/// qwen3_moe's golden model: 3 MoE layers, top-2, one byte per id; blocks of 4 tokens.
const BLOCK_ROW_BYTES: usize = 4 * 3 * 2;
const CAP_BLOCKS: usize = 24;

/// Prompts that share prefixes in several ways, in waves of concurrent requests.
fn waves(g: &Golden) -> Vec<Vec<Vec<TokenId>>> {
    let (long, main) = (g.prompt("long"), g.prompt("main"));
    (0..6)
        .map(|w| {
            (0..3)
                .map(|i| match (w + i) % 3 {
                    0 => long[..16 + 4 * i].to_vec(),
                    1 => [&main[..12], &long[w..w + 6]].concat(),
                    _ => main[..8 + w].to_vec(),
                })
                .collect()
        })
        .collect()
}

async fn run_waves(handle: &routed::EngineHandle, g: &Golden) -> Vec<Outcome> {
    let mut outs = Vec::new();
    for wave in waves(g) {
        outs.extend(join_all(wave.iter().map(|p| run(handle, request(p, 6)))).await);
    }
    outs
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tight_routing_cap_evicts_idle_rows_and_never_fails() {
    let g = Golden::open("qwen3_moe");
    let uncapped = engine("qwen3_moe", |_| {});
    let want = run_waves(&uncapped, &g).await;
    uncapped.shutdown().await;
    let capped = engine("qwen3_moe", |c| {
        c.routing_cache_max_bytes = Some(CAP_BLOCKS * BLOCK_ROW_BYTES);
    });
    let info = capped.model_info();
    assert_eq!(info.num_kv_blocks, CAP_BLOCKS, "the pool holds what the cap holds rows for");
    assert!(info.kv_pool_sized_by_routing_cap);
    let got = run_waves(&capped, &g).await;
    let mut hits = 0;
    for (i, (a, b)) in got.iter().zip(&want).enumerate() {
        assert!(a.error.is_none(), "request {i} failed at the cap: {:?}", a.error);
        assert_eq!(a.finals[0].token_ids, b.finals[0].token_ids, "request {i}");
        assert_eq!(a.finals[0].routing, b.finals[0].routing, "request {i}: rows");
        hits += a.finals[0].num_cached_tokens;
    }
    assert!(hits > 0, "prefixes still hit within the cap");
    let stats = capped.stats().await.unwrap();
    assert!(stats.routing_bytes_held <= CAP_BLOCKS * BLOCK_ROW_BYTES);
    // 24 blocks of 4 tokens: a request needing more is refused up front, naming the cap.
    let too_big = request(&g.prompt("long"), 60);
    match capped.submit(too_big).await {
        Err(EngineError::InvalidRequest { param: "max_tokens", message }) => {
            assert!(message.contains("--routing-cache-max-bytes"), "{message}")
        }
        Err(e) => panic!("wrong error: {e}"),
        Ok(_) => panic!("a request larger than the cap must be refused"),
    }
    capped.shutdown().await;
}

#[test]
fn a_cap_too_small_for_one_block_is_a_clear_start_error() {
    let g = Golden::open("qwen3_moe");
    let mut config = routed::EngineConfig::new(routed::ModelSource::Dir(g.model_dir()));
    config.block_size = 4;
    config.routing_cache_max_bytes = Some(BLOCK_ROW_BYTES - 1);
    match routed::Engine::start(config) {
        Err(EngineError::Load(m)) => assert!(m.contains("--routing-cache-max-bytes"), "{m}"),
        Err(e) => panic!("wrong error: {e}"),
        Ok(_) => panic!("a cap below one block must not start"),
    }
}

#[test]
fn max_model_len_is_clamped_to_what_the_pool_holds() {
    let g = Golden::open("qwen3_moe");
    let mut config = routed::EngineConfig::new(routed::ModelSource::Dir(g.model_dir()));
    config.block_size = 4;
    config.num_kv_blocks = Some(10);
    config.max_model_len = Some(4096);
    let handle = routed::Engine::start(config).unwrap();
    assert_eq!(handle.model_info().max_model_len, 40);
}
