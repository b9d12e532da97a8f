//! Failure handling: runners that fail or panic on a marked request, on one rank or all of them
//! (fault injection, enabled by the `fault-injection` feature that the README's test command turns
//! on).
#![cfg(feature = "fault-injection")]

mod common;

use common::{engine, greedy, request, run};
use futures_util::future::join_all;
use routed::GenerateRequest;
use routed::runtime::EngineError;
use routed::runtime::worker::faults::{FAIL_LAST_RANK_SEED, FAIL_SEED, PANIC_SEED};
use routed::types::SamplingParams;
use routed_test_support::Golden;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_runner_step_fails_its_requests_and_the_engine_serves_on() {
    for arch in ["qwen3_moe", "nemotron_h"] {
        let g = Golden::open(arch);
        let handle = engine(arch, |_| {});
        let faulty =
            GenerateRequest::new(g.prompt("main"), SamplingParams { seed: FAIL_SEED, ..greedy(8) });
        let mut reqs = vec![faulty];
        reqs.extend(["long", "short2", "short3"].iter().map(|c| request(&g.prompt(c), 8)));
        let outs = join_all(reqs.into_iter().map(|r| run(&handle, r))).await;
        assert!(
            matches!(outs[0].error, Some(EngineError::Internal(_))),
            "{arch}: {:?}",
            outs[0].error
        );
        for out in &outs[1..] {
            // Requests that shared the failed step end with an error; the others complete.
            assert!(
                out.error.is_some() || out.finals.len() == 1,
                "{arch}: a request neither completed nor failed"
            );
        }
        let next = run(&handle, request(&g.prompt("short1"), 4)).await;
        assert!(
            next.error.is_none(),
            "{arch}: the engine serves the next request: {:?}",
            next.error
        );
        assert_eq!(next.finals[0].token_ids.len(), 4);
        assert!(handle.health().await.is_ok());
        handle.shutdown().await;
    }
}

/// A request that makes every rank panic inside its forward.
fn panicking(g: &Golden) -> GenerateRequest {
    GenerateRequest::new(g.prompt("short1"), SamplingParams { seed: PANIC_SEED, ..greedy(4) })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn panics_inside_the_forward_never_lose_a_routing_buffer() {
    let g = Golden::open("nemotron_h");
    let handle = engine("nemotron_h", |_| {});
    // More panics than rank 0 has routing buffers (3): a lost buffer per panic would leave the
    // runner waiting forever for one.
    for _ in 0..5 {
        let out = run(&handle, panicking(&g)).await;
        match &out.error {
            Some(EngineError::Internal(m)) => assert!(m.contains("panicked"), "{m}"),
            other => panic!("the panicking request must fail: {other:?}"),
        }
    }
    let cold = run(&handle, request(&g.prompt("main"), 6)).await;
    assert!(cold.error.is_none(), "the engine serves on: {:?}", cold.error);
    assert_eq!(cold.finals[0].token_ids.len(), 6);
    assert!(cold.finals[0].routing.is_some());
    assert!(handle.health().await.is_ok());
    handle.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_failing_rank_fails_the_step_on_every_rank_and_the_engine_recovers() {
    for arch in ["qwen3_moe", "granitemoehybrid"] {
        let g = Golden::open(arch);
        let handle = engine(arch, |c| c.expert_parallel_size = 2);
        let reference = run(&handle, request(&g.prompt("main"), 6)).await;
        assert!(reference.error.is_none(), "{arch}: {:?}", reference.error);
        // Only the last rank fails; rank 0 is already waiting for it in the step's first
        // collective and must be released, not left hanging.
        let faulty = GenerateRequest::new(
            g.prompt("short2"),
            SamplingParams { seed: FAIL_LAST_RANK_SEED, ..greedy(4) },
        );
        let out = run(&handle, faulty).await;
        match &out.error {
            Some(EngineError::Internal(m)) => {
                assert!(m.contains("rank 1") && m.contains("injected"), "{arch}: {m}")
            }
            other => panic!("{arch}: the request must fail on rank 1's error: {other:?}"),
        }
        // The prefix cache was reset: the same prompt again is computed cold, and gives the same
        // tokens, logprobs and routing as before the failure.
        let again = run(&handle, request(&g.prompt("main"), 6)).await;
        assert!(again.error.is_none(), "{arch}: {:?}", again.error);
        assert_eq!(again.finals[0].num_cached_tokens, 0, "{arch}: the cache was reset");
        assert_eq!(again.finals, reference.finals, "{arch}");
        assert_eq!(again.tokens, reference.tokens, "{arch}");
        assert!(handle.health().await.is_ok());
        handle.shutdown().await;
    }
}
