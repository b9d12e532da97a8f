//! Actor-level acceptance tests of the engine on the golden tiny models: batching, prefix
//! caching, chunked prefill, the idle heartbeat, preemption and aborts never change a request's
//! tokens or routing.

mod common;

use common::{Outcome, collect, engine, greedy, request, run};
use futures_util::future::join_all;
use routed::types::{SamplingParams, TokenId};
use routed::{EngineHandle, GenerateRequest};
use routed_test_support::Golden;
use std::time::Duration;

/// Prompts of mixed lengths built from the golden prompts.
fn prompts(g: &Golden, count: usize) -> Vec<Vec<TokenId>> {
    let long = g.prompt("long");
    let main = g.prompt("main");
    (0..count)
        .map(|i| match i % 4 {
            0 => long[..5 + i % 30].to_vec(),
            1 => main[i % 7..].to_vec(),
            2 => [&main[..6], &long[i % 20..i % 20 + 10]].concat(),
            _ => long[i % 5..].to_vec(),
        })
        .collect()
}

fn sampling(i: usize) -> SamplingParams {
    if i.is_multiple_of(3) {
        SamplingParams {
            temperature: 0.8,
            top_p: 0.9,
            seed: 1000 + i as u64,
            max_tokens: 6 + (i % 5) as u32,
            ignore_eos: true,
            ..Default::default()
        }
    } else {
        greedy(6 + (i % 5) as u32)
    }
}

async fn solo(arch: &str, req: GenerateRequest) -> Outcome {
    let handle = engine(arch, |c| c.enable_prefix_caching = false);
    let out = run(&handle, req).await;
    handle.shutdown().await;
    out
}

fn assert_same(arch: &str, what: &str, got: &Outcome, want: &Outcome) {
    assert!(
        got.error.is_none() && want.error.is_none(),
        "{arch} {what}: {:?} / {:?}",
        got.error,
        want.error
    );
    assert_eq!(got.finals.len(), want.finals.len());
    for (a, b) in got.finals.iter().zip(&want.finals) {
        assert_eq!(a.token_ids, b.token_ids, "{arch} {what}: tokens");
        assert_eq!(a.routing, b.routing, "{arch} {what}: routing");
    }
}

/// At least 16 concurrent requests of mixed lengths, interleaving prefills and decodes: each
/// gets bitwise the tokens and routing of its solo run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_requests_match_their_solo_runs() {
    for arch in ["qwen3_moe", "nemotron_h"] {
        let g = Golden::open(arch);
        let reqs: Vec<GenerateRequest> = prompts(&g, 18)
            .into_iter()
            .enumerate()
            .map(|(i, p)| GenerateRequest::new(p, sampling(i)))
            .collect();
        // A small budget forces chunked prefills to share steps with decodes.
        let handle = engine(arch, |c| c.max_num_batched_tokens = 24);
        let together = join_all(reqs.iter().map(|r| run(&handle, r.clone()))).await;
        let stats = handle.stats().await.unwrap();
        assert!(
            stats.num_steps > 20,
            "{arch}: expected interleaved steps, got {}",
            stats.num_steps
        );
        handle.shutdown().await;
        for (i, (r, got)) in reqs.into_iter().zip(&together).enumerate() {
            let want = solo(arch, r).await;
            assert_same(arch, &format!("request {i}"), got, &want);
        }
    }
}

/// R2 shares a 3-block prefix with finished R1; it reports those tokens cached, computes only
/// the rest, its first rows equal R1's, and its output and routing equal a run with prefix
/// caching off.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prefix_hit_skips_three_blocks_and_matches_the_uncached_run() {
    for arch in ["qwen3_moe", "nemotron_h"] {
        let g = Golden::open(arch);
        let long = g.prompt("long");
        // Blocks of 4: R1 is 14 tokens long, so its last complete block is the third.
        let r1 = long[..14].to_vec();
        let r2 = [&long[..12], &g.prompt("main")[..8]].concat();
        let handle = engine(arch, |_| {});
        let first = run(&handle, request(&r1, 4)).await;
        let before = handle.stats().await.unwrap();
        let second = run(&handle, request(&r2, 4)).await;
        let after = handle.stats().await.unwrap();
        handle.shutdown().await;
        let f2 = &second.finals[0];
        assert_eq!(f2.num_cached_tokens, 12, "{arch}: cached tokens");
        assert_eq!(
            after.num_prefill_tokens_computed - before.num_prefill_tokens_computed,
            (r2.len() - 12) as u64
        );
        let (rows1, rows2) =
            (first.finals[0].routing.as_ref().unwrap(), f2.routing.as_ref().unwrap());
        let row_len = rows1.num_moe_layers * rows1.top_k;
        assert_eq!(
            rows2.ids[..12 * row_len],
            rows1.ids[..12 * row_len],
            "{arch}: hit rows are R1's"
        );
        assert_same(arch, "R2", &second, &solo(arch, request(&r2, 4)).await);
    }
}

async fn wait_for_dummy_forwards(handle: &EngineHandle, n: u64) {
    let wait = async {
        while handle.stats().await.unwrap().num_dummy_forwards < n {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    };
    tokio::time::timeout(common::WATCHDOG, wait).await.expect("heartbeat ran");
}

/// Dummy forwards while idle never wipe the cache; an explicit reset does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_heartbeat_keeps_the_prefix_cache_and_reset_clears_it() {
    let arch = "nemotron_h";
    let g = Golden::open(arch);
    let long = g.prompt("long");
    let (r1, r2) = (long[..14].to_vec(), [&long[..12], &g.prompt("main")[..8]].concat());
    let uncached = solo(arch, request(&r2, 4)).await;

    let handle = engine(arch, |c| c.heartbeat_ms = 2);
    run(&handle, request(&r1, 4)).await;
    wait_for_dummy_forwards(&handle, 20).await;
    let second = run(&handle, request(&r2, 4)).await;
    assert_eq!(second.finals[0].num_cached_tokens, 12, "the hit survives the heartbeat");
    assert_same(arch, "R2 after heartbeat", &second, &uncached);
    handle.shutdown().await;

    let handle = engine(arch, |c| c.heartbeat_ms = 2);
    run(&handle, request(&r1, 4)).await;
    let seen = handle.stats().await.unwrap().num_dummy_forwards;
    assert!(handle.reset_prefix_cache().await.unwrap());
    wait_for_dummy_forwards(&handle, seen + 20).await;
    let second = run(&handle, request(&r2, 4)).await;
    assert_eq!(second.finals[0].num_cached_tokens, 0, "reset drops the cache");
    assert_same(arch, "R2 after reset", &second, &uncached);
    handle.shutdown().await;
}

/// A hybrid prompt longer than the token budget is prefilled in several chunks; its last complete
/// block is snapshotted and a later request sharing the prefix hits it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chunked_hybrid_prompt_is_snapshotted_and_hit() {
    let arch = "nemotron_h";
    let g = Golden::open(arch);
    let long = g.prompt("long");
    let r2 = [&long[..38], &g.prompt("main")[..3]].concat();
    let handle = engine(arch, |c| c.max_num_batched_tokens = 8);
    let first = run(&handle, request(&long, 2)).await;
    assert!(
        handle.stats().await.unwrap().num_steps >= 5,
        "the 40-token prompt takes several 8-token chunks"
    );
    assert!(first.error.is_none());
    let second = run(&handle, request(&r2, 3)).await;
    handle.shutdown().await;
    assert_eq!(
        second.finals[0].num_cached_tokens, 36,
        "hit up to the last snapshot before the divergence"
    );
    assert_same(arch, "R2", &second, &solo(arch, request(&r2, 3)).await);
}

/// A request whose first 8 blocks are cached completes its prefill in one step that computes only
/// the uncached tokens.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cached_prefix_prefill_takes_one_step() {
    for arch in ["qwen3_moe", "nemotron_h"] {
        let g = Golden::open(arch);
        let long = g.prompt("long");
        let r1 = long[..34].to_vec();
        let r2 = [&long[..32], &g.prompt("main")[..6]].concat();
        let handle = engine(arch, |c| c.max_num_batched_tokens = 8);
        run(&handle, request(&r1, 1)).await;
        let before = handle.stats().await.unwrap();
        let out = run(&handle, request(&r2, 1)).await;
        let after = handle.stats().await.unwrap();
        handle.shutdown().await;
        assert_eq!(out.finals[0].num_cached_tokens, 32, "{arch}");
        assert_eq!(after.num_steps - before.num_steps, 1, "{arch}: one step for the whole prefill");
        assert_eq!(
            after.num_prefill_tokens_computed - before.num_prefill_tokens_computed,
            6,
            "{arch}"
        );
    }
}

/// A tiny KV pool and many long requests: requests are preempted and recomputed, and every one
/// completes with the tokens and routing of its solo run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn preempted_requests_complete_with_their_solo_output() {
    for arch in ["qwen3_moe", "nemotron_h"] {
        let g = Golden::open(arch);
        let reqs: Vec<GenerateRequest> = prompts(&g, 8)
            .into_iter()
            .enumerate()
            .map(|(i, p)| GenerateRequest::new(p, SamplingParams { max_tokens: 20, ..sampling(i) }))
            .collect();
        let handle = engine(arch, |c| c.num_kv_blocks = Some(24));
        let together = join_all(reqs.iter().map(|r| run(&handle, r.clone()))).await;
        let stats = handle.stats().await.unwrap();
        handle.shutdown().await;
        assert!(stats.num_preemptions > 0, "{arch}: the pool was meant to be too small");
        for (i, (r, got)) in reqs.into_iter().zip(&together).enumerate() {
            assert_same(arch, &format!("request {i}"), got, &solo(arch, r).await);
        }
    }
}

/// Aborts before and during generation free everything: all blocks free or evictable, no live
/// state held, and after a reset no snapshot or routing row left.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn aborts_free_every_resource() {
    for arch in ["qwen3_moe", "nemotron_h"] {
        let g = Golden::open(arch);
        let handle = engine(arch, |c| c.max_num_batched_tokens = 8);
        let long = g.prompt("long");
        // Aborted while still waiting or prefilling.
        let early = handle.submit(request(&long, 30)).await.unwrap();
        handle.abort(early.id());
        let early = collect(early).await;
        assert!(early.finals.iter().all(|f| f.finish_reason == routed::types::FinishReason::Abort));
        // Aborted during generation: the client drops its stream after two tokens.
        let mut during = handle.submit(request(&g.prompt("main"), 30)).await.unwrap();
        let mut seen = 0;
        while let Some(event) = futures_util::StreamExt::next(&mut during).await {
            if matches!(event, routed::RequestEvent::Token(_)) {
                seen += 1;
                if seen == 2 {
                    break;
                }
            }
        }
        drop(during);
        let done = run(&handle, request(&g.prompt("short3"), 4)).await;
        assert!(done.error.is_none());
        let stats = handle.stats().await.unwrap();
        assert_eq!(
            (stats.num_running, stats.num_waiting, stats.num_live_states_held),
            (0, 0, 0),
            "{arch}"
        );
        assert_eq!(
            stats.num_kv_blocks_free + stats.num_kv_blocks_evictable,
            stats.num_kv_blocks_total,
            "{arch}: held blocks leaked"
        );
        assert!(handle.reset_prefix_cache().await.unwrap());
        // The reset's row drop reaches the routing host-cache asynchronously.
        tokio::time::sleep(Duration::from_millis(50)).await;
        let stats = handle.stats().await.unwrap();
        assert_eq!(stats.num_kv_blocks_free, stats.num_kv_blocks_total, "{arch}");
        assert_eq!(stats.num_snapshot_slots_used, 0, "{arch}: snapshots leaked");
        assert_eq!(stats.routing_bytes_held, 0, "{arch}: routing rows leaked");
        handle.shutdown().await;
    }
}

/// One continuation of a request with `n = 3` aborted while it decodes: it ends with the tokens
/// and routing rows it computed (a prefix of its uninterrupted run's), and its siblings finish
/// bit for bit as they would have.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_continuation_aborted_leaves_its_siblings_as_they_were() {
    for arch in ["qwen3_moe", "nemotron_h"] {
        let g = Golden::open(arch);
        let params = SamplingParams {
            temperature: 0.9,
            seed: 11,
            max_tokens: 24,
            ignore_eos: true,
            ..Default::default()
        };
        let mut trio = GenerateRequest::new(g.prompt("main"), params);
        (trio.n, trio.return_routing) = (3, true);
        let want = solo(arch, trio.clone()).await;
        let handle = engine(arch, |_| {});
        let mut stream = handle.submit(trio).await.unwrap();
        let mut got = Outcome { tokens: Vec::new(), finals: Vec::new(), error: None };
        while let Some(event) = futures_util::StreamExt::next(&mut stream).await {
            match event {
                routed::RequestEvent::Token(t) => {
                    got.tokens.push(t);
                    if got.tokens.iter().filter(|t| t.index == 1).count() == 3 {
                        handle.abort_continuation(stream.id(), 1);
                    }
                }
                routed::RequestEvent::Finished(f) => got.finals.push(*f),
                routed::RequestEvent::Error(e) => panic!("{arch}: {e}"),
            }
        }
        got.finals.sort_by_key(|f| f.index);
        let aborted = &got.finals[1];
        assert_eq!(aborted.finish_reason, routed::types::FinishReason::Abort, "{arch}");
        let n = aborted.token_ids.len();
        assert!((3..24).contains(&n), "{arch}: {n} tokens");
        assert_eq!(aborted.token_ids[..], want.finals[1].token_ids[..n], "{arch}");
        // A row for the prompt and every token fed back: the first rows of the whole run's.
        let (rows, all) = (aborted.routing.as_ref().unwrap(), want.finals[1].routing.as_ref());
        let num_rows = g.prompt("main").len() + n - 1;
        assert_eq!(rows.num_rows, num_rows, "{arch}");
        let row_len = rows.num_moe_layers * rows.top_k;
        assert_eq!(rows.ids[..], all.unwrap().ids[..num_rows * row_len], "{arch}");
        for i in [0, 2] {
            assert_eq!(got.finals[i].token_ids, want.finals[i].token_ids, "{arch} #{i}");
            assert_eq!(got.finals[i].routing, want.finals[i].routing, "{arch} #{i}");
            assert_eq!(got.finals[i].finish_reason, want.finals[i].finish_reason, "{arch} #{i}");
        }
        handle.shutdown().await;
    }
}
