//! Weight updates (an RL trainer publishing its latest policy): the engine serves the new weights
//! exactly as an engine started on them does, drops the prefix cache the old weights computed
//! (AC-29 in the hybrid prefix-caching acceptance list), refuses a checkpoint of another model
//! while the old weights keep serving, waits for the requests in flight (or aborts them), and
//! holds the requests that arrive meanwhile.

mod common;

use common::{Outcome, WATCHDOG, engine, engine_if_devices, request, run, test_config};
use futures_util::FutureExt;
use routed::runtime::{EngineError, WeightUpdate};
use routed::{Engine, EngineHandle};
use routed_test_support::{Golden, golden_root, write_other_policy};
use routed_types::{FinishReason, RoutingRows};
use std::path::{Path, PathBuf};

/// Another policy of `arch`'s golden model (see [`write_other_policy`]).
fn other_policy(arch: &str) -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("a temporary directory");
    write_other_policy(&golden_root().join(arch).join("model"), dir.path());
    dir
}

/// A greedy request for the golden "long" prompt, returning its routing.
fn long_request(g: &Golden, max_tokens: u32) -> routed::GenerateRequest {
    let mut r = request(&g.prompt("long"), max_tokens);
    r.return_routing = true;
    r
}

/// What two runs must share bit for bit: tokens with their logprobs, and the routing rows.
fn bits(o: &Outcome) -> (Vec<(u32, u32)>, Option<RoutingRows>) {
    assert!(o.error.is_none(), "{:?}", o.error);
    (common::token_bits(o), o.finals[0].routing.clone())
}

fn update(dir: &Path, version: Option<&str>) -> WeightUpdate {
    WeightUpdate {
        dir: dir.to_owned(),
        abort_all_requests: false,
        weight_version: version.map(str::to_owned),
    }
}

/// The new weights' outputs from an engine started on them, with prefix caching off.
async fn reference(arch: &str, dir: &Path, ep: usize, r: routed::GenerateRequest) -> Outcome {
    let mut config = test_config(arch);
    config.model = routed::ModelSource::Dir(dir.to_owned());
    config.enable_prefix_caching = false;
    config.expert_parallel_size = ep;
    let handle = Engine::start(config).expect("the reference engine starts");
    let out = run(&handle, r).await;
    handle.shutdown().await;
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_update_serves_the_new_weights_and_drops_what_the_old_ones_cached() {
    for (arch, ep) in [("qwen3_moe", 1), ("nemotron_h", 1), ("qwen3_moe", 2)] {
        let g = Golden::open(arch);
        let new = other_policy(arch);
        let test = "an_update_serves_the_new_weights";
        let Some(handle) = engine_if_devices(arch, test, |c| c.expert_parallel_size = ep) else {
            continue;
        };
        let old = run(&handle, long_request(&g, 6)).await;
        let hit = run(&handle, long_request(&g, 6)).await;
        assert!(hit.finals[0].num_cached_tokens > 0, "{arch}: the repeat hits the cache");
        assert_eq!(bits(&hit), bits(&old), "{arch}: the hit equals the cold run");
        let want = reference(arch, new.path(), ep, long_request(&g, 6)).await;
        assert_ne!(bits(&want).1, bits(&old).1, "{arch}: the two policies route apart");

        let done = handle.update_weights(update(new.path(), Some("step-1"))).await.unwrap();
        assert_eq!((done.weights.version.as_str(), done.weights.num_updates), ("step-1", 1));
        assert_eq!(done.weights.dir, new.path());
        let after = run(&handle, long_request(&g, 6)).await;
        assert_eq!(after.finals[0].num_cached_tokens, 0, "{arch}: nothing cached survives");
        assert_eq!(bits(&after), bits(&want), "{arch}: the new weights, bit for bit");
        assert_eq!(after.finals[0].weight_version, "step-1");
        let again = run(&handle, long_request(&g, 6)).await;
        assert!(again.finals[0].num_cached_tokens > 0, "{arch}: the new weights cache again");
        assert_eq!(bits(&again), bits(&want), "{arch}: a hit on the new weights");

        // And back: the original weights, exactly, with their version kept when none is named.
        let back = golden_root().join(arch).join("model");
        handle.update_weights(update(&back, None)).await.unwrap();
        let restored = run(&handle, long_request(&g, 6)).await;
        assert_eq!(bits(&restored), bits(&old), "{arch}: the original weights again");
        assert_eq!(restored.finals[0].weight_version, "step-1");
        let stats = handle.stats().await.unwrap();
        assert_eq!(stats.num_weight_updates, 2);
        handle.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_checkpoint_of_another_model_is_refused_and_the_old_weights_keep_serving() {
    let g = Golden::open("qwen3_moe");
    let handle = engine("qwen3_moe", |_| {});
    let before = run(&handle, long_request(&g, 4)).await;
    let missing = PathBuf::from("/nonexistent/checkpoint");
    for (dir, says) in
        [(golden_root().join("mixtral").join("model"), "differs"), (missing, "/nonexistent")]
    {
        match handle.update_weights(update(&dir, Some("bad"))).await {
            Err(EngineError::InvalidRequest { param: "model_path", message }) => {
                assert!(message.contains(says), "{message}")
            }
            other => panic!("{}: {other:?}", dir.display()),
        }
    }
    let weights = handle.weights().await.unwrap();
    assert_eq!((weights.version.as_str(), weights.num_updates), ("default", 0));
    let after = run(&handle, long_request(&g, 4)).await;
    assert!(after.finals[0].num_cached_tokens > 0, "the cache was kept");
    assert_eq!(bits(&after), bits(&before));
    handle.shutdown().await;
}

/// Sends the update to the engine without waiting for it: the update is queued behind whatever
/// was submitted before and ahead of whatever is submitted after.
fn send_update<'a>(
    handle: &'a EngineHandle,
    update: WeightUpdate,
) -> impl std::future::Future<Output = Result<routed::runtime::WeightsUpdated, EngineError>> + 'a {
    let mut pending = Box::pin(handle.update_weights(update));
    // The first poll posts the message; the reply comes once the new weights serve.
    assert!((&mut pending).now_or_never().is_none(), "the update waits for the request in flight");
    pending
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_update_waits_for_the_requests_in_flight_and_holds_the_ones_after_it() {
    let g = Golden::open("nemotron_h");
    let new = other_policy("nemotron_h");
    let handle = engine("nemotron_h", |_| {});
    let want_old =
        reference("nemotron_h", &golden_root().join("nemotron_h/model"), 1, long_request(&g, 24))
            .await;
    let want_new = reference("nemotron_h", new.path(), 1, long_request(&g, 6)).await;

    let before = handle.submit(long_request(&g, 24)).await.unwrap();
    let updated = send_update(&handle, update(new.path(), Some("step-1")));
    let after = handle.submit(long_request(&g, 6)).await.unwrap();
    let dropped = handle.submit(long_request(&g, 6)).await.unwrap();
    handle.abort(dropped.id());
    // Of a held pair, one continuation aborted: the other runs on the new weights.
    let pair =
        handle.submit(routed::GenerateRequest { n: 2, ..long_request(&g, 6) }).await.unwrap();
    handle.abort_continuation(pair.id(), 0);
    let (before, after, dropped, pair) = (
        common::collect(before),
        common::collect(after),
        common::collect(dropped),
        common::collect(pair),
    );
    let (before, after, dropped, pair, updated) = tokio::time::timeout(WATCHDOG, async {
        tokio::join!(before, after, dropped, pair, updated)
    })
    .await
    .expect("within the watchdog");

    assert_eq!(bits(&before), bits(&want_old), "the request in flight ran on the old weights");
    assert_eq!(before.finals[0].weight_version, "default");
    assert_eq!(bits(&after), bits(&want_new), "the request after the update ran on the new");
    assert_eq!(after.finals[0].weight_version, "step-1");
    assert_eq!(dropped.finals[0].finish_reason, FinishReason::Abort);
    assert!(dropped.tokens.is_empty(), "aborted while held: nothing computed");
    assert_eq!(pair.finals[0].finish_reason, FinishReason::Abort);
    assert!(pair.tokens.iter().all(|t| t.index == 1), "continuation 0 computed nothing");
    assert_eq!(common::token_bits(&pair), common::token_bits(&want_new));
    assert_eq!(pair.finals[1].routing, want_new.finals[0].routing);
    let updated = updated.unwrap();
    assert_eq!((updated.num_held_requests, updated.num_aborted_requests), (2, 0));
    handle.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn abort_all_requests_ends_the_requests_in_flight_at_once() {
    let g = Golden::open("qwen3_moe");
    let new = other_policy("qwen3_moe");
    let handle = engine("qwen3_moe", |_| {});
    let want_old =
        reference("qwen3_moe", &golden_root().join("qwen3_moe/model"), 1, long_request(&g, 24))
            .await;

    let long = handle.submit(long_request(&g, 900)).await.unwrap();
    let mut update = update(new.path(), None);
    update.abort_all_requests = true;
    let (long, updated) = tokio::join!(common::collect(long), send_update(&handle, update));
    let updated = updated.unwrap();
    assert_eq!(updated.num_aborted_requests, 1);
    assert_eq!(long.finals[0].finish_reason, FinishReason::Abort);
    let n = long.tokens.len();
    assert!(n < 900, "ended early");
    // What it computed came from the old weights (the first tokens of their greedy run).
    let (got, want) = (common::token_bits(&long), common::token_bits(&want_old));
    assert_eq!(got[..n.min(want.len())], want[..n.min(want.len())]);
    let rows = long.finals[0].routing.as_ref().map_or(0, |r| r.num_rows);
    assert!(n == 0 || rows > 0, "an aborted request returns the rows it computed");
    handle.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shutdown_refuses_a_waiting_update_and_drains_the_requests_it_held() {
    let g = Golden::open("qwen3_moe");
    let new = other_policy("qwen3_moe");
    let handle = engine("qwen3_moe", |_| {});
    let old = golden_root().join("qwen3_moe/model");
    let want = reference("qwen3_moe", &old, 1, long_request(&g, 6)).await;

    let before = handle.submit(long_request(&g, 24)).await.unwrap();
    let updated = send_update(&handle, update(new.path(), Some("never")));
    let held = handle.submit(long_request(&g, 6)).await.unwrap();
    let (before, held, updated, ()) = tokio::time::timeout(WATCHDOG, async {
        tokio::join!(common::collect(before), common::collect(held), updated, handle.shutdown())
    })
    .await
    .expect("the shutdown drains within the watchdog");
    assert!(matches!(updated, Err(EngineError::ShutDown)), "{updated:?}");
    assert_eq!(before.finals[0].finish_reason, FinishReason::Length);
    assert_eq!(bits(&held), bits(&want), "the held request ran, on the old weights");
    assert_eq!(held.finals[0].weight_version, "default");
}
