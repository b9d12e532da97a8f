//! Failure handling: a runner that fails on one request (fault injection, enabled by the
//! `fault-injection` feature that the README's test command turns on).
#![cfg(feature = "fault-injection")]

mod common;

use common::{engine, greedy, request, run};
use futures_util::future::join_all;
use routed::GenerateRequest;
use routed::runtime::{EngineError, runner::FAULT_SEED};
use routed::types::SamplingParams;
use routed_test_support::Golden;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_runner_step_fails_its_requests_and_the_engine_serves_on() {
    for arch in ["qwen3_moe", "nemotron_h"] {
        let g = Golden::open(arch);
        let handle = engine(arch, |_| {});
        let faulty = GenerateRequest::new(
            g.prompt("main"),
            SamplingParams { seed: FAULT_SEED, ..greedy(8) },
        );
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
