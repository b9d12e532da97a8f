//! Giving memory back between rollout steps (SGLang's `release_memory_occupation` and
//! `resume_memory_occupation`, vLLM's `sleep` and `wake_up`): the weights and the KV blocks are
//! freed and allocated again, nothing runs meanwhile (no step, no dummy forward) while requests
//! submitted wait, and what runs after computes exactly what a fresh engine does, from an empty
//! prefix cache. Requests running refuse a release (one being aborted does not); a paused, retracted one
//! survives it bit for bit; a weight update waits for the weights to be resumed.

mod common;

use common::{Outcome, WATCHDOG, engine, engine_if_devices, request, run, test_config, token_bits};
use futures_util::{FutureExt, StreamExt};
use routed::runtime::{EngineError, MemoryTags, PauseMode, WeightUpdate};
use routed::{Engine, EngineHandle, GenerateRequest, RequestEvent};
use routed_test_support::{Golden, golden_root, write_other_policy};
use routed_types::{RoutingRows, TokenId};
use std::time::Duration;

/// A greedy request returning its routing.
fn routed_request(prompt: &[TokenId], max_tokens: u32) -> GenerateRequest {
    let mut r = request(prompt, max_tokens);
    r.return_routing = true;
    r
}

/// What two runs must share bit for bit: tokens with their logprobs, and the routing rows.
fn bits(o: &Outcome) -> (Vec<(u32, u32)>, Option<RoutingRows>) {
    assert!(o.error.is_none(), "{:?}", o.error);
    (token_bits(o), o.finals[0].routing.clone())
}

/// An update to the checkpoint in `dir`.
fn update(dir: &std::path::Path) -> WeightUpdate {
    WeightUpdate { dir: dir.to_owned(), abort_all_requests: false, weight_version: None }
}

fn tags(weights: bool, kv_cache: bool) -> MemoryTags {
    MemoryTags { weights, kv_cache, cuda_graph: false }
}

/// Lets the engine run for a while (steps, heartbeats) and returns its step and dummy-forward
/// counts.
async fn counts_after_a_while(handle: &EngineHandle) -> (u64, u64) {
    tokio::time::sleep(Duration::from_millis(150)).await;
    let stats = handle.stats().await.unwrap();
    (stats.num_steps, stats.num_dummy_forwards)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn released_memory_comes_back_and_serves_as_a_fresh_engine() {
    for arch in ["qwen3_moe", "nemotron_h"] {
        let g = Golden::open(arch);
        let prompt = g.prompt("long");
        // A heartbeat, to show that no dummy forward runs while the memory is away.
        let handle = engine(arch, |c| c.heartbeat_ms = 5);
        let first = run(&handle, routed_request(&prompt, 12)).await;
        assert_eq!(handle.memory_released().await.unwrap(), MemoryTags::default());

        let released = handle.release_memory(MemoryTags::ALL).await.unwrap();
        assert_eq!(released.released, tags(true, true), "{arch}");
        assert!(released.num_bytes > 0, "{arch}: the weights and the pools were freed");
        // Nothing runs while released: a request submitted waits, and the heartbeat rests.
        let (steps, beats) = counts_after_a_while(&handle).await;
        let mut waiting = handle.submit(routed_request(&prompt, 12)).await.unwrap();
        assert!(waiting.next().now_or_never().is_none(), "{arch}: it waits for the memory");
        assert_eq!(counts_after_a_while(&handle).await, (steps, beats), "{arch}: nothing ran");
        assert_eq!(handle.stats().await.unwrap().num_waiting, 1);

        // The weights first, as SGLang's and vLLM's trainers resume them: still nothing runs.
        let weights = handle.resume_memory(tags(true, false)).await.unwrap();
        assert!(weights.num_bytes > 0, "{arch}");
        assert_eq!(weights.released, tags(false, true), "{arch}");
        assert_eq!(counts_after_a_while(&handle).await.0, steps, "{arch}: no KV cache yet");
        let pools = handle.resume_memory(MemoryTags::ALL).await.unwrap();
        assert!(pools.num_bytes > 0, "{arch}: the pools were allocated again");
        assert_eq!(pools.released, MemoryTags::default(), "{arch}");

        // The waiting request runs from an empty prefix cache and computes what the first did.
        let again = common::collect(waiting).await;
        assert_eq!(bits(&again), bits(&first), "{arch}: the same bits as before the release");
        assert_eq!(again.finals[0].num_cached_tokens, 0, "{arch}: the prefix cache was dropped");
        let third = run(&handle, routed_request(&prompt, 12)).await;
        assert!(third.finals[0].num_cached_tokens > 0, "{arch}: caching works again");
        assert_eq!(bits(&third), bits(&first), "{arch}: a prefix hit after the resume");
        let (_, beats) = counts_after_a_while(&handle).await;
        assert!(counts_after_a_while(&handle).await.1 > beats, "{arch}: the heartbeat is back");
        handle.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn running_requests_refuse_a_release_and_a_retracted_one_survives_it() {
    let arch = "qwen3_moe";
    let g = Golden::open(arch);
    let prompt = g.prompt("long");
    let want = {
        let mut config = test_config(arch);
        config.enable_prefix_caching = false;
        let reference = Engine::start(config).unwrap();
        let out = run(&reference, routed_request(&prompt, 300)).await;
        reference.shutdown().await;
        out
    };
    let handle = engine(arch, |_| {});
    let mut stream = handle.submit(routed_request(&prompt, 300)).await.unwrap();
    let mut tokens = Vec::new();
    let first = async {
        match stream.next().await {
            Some(RequestEvent::Token(t)) => tokens.push(t),
            other => panic!("{other:?}"),
        }
    };
    tokio::time::timeout(WATCHDOG, first).await.unwrap();
    // Retracted before it ends: its blocks go, its tokens stay.
    handle.pause_generation(PauseMode::Retract).await.unwrap();
    let stats = handle.stats().await.unwrap();
    assert_eq!((stats.num_running, stats.num_waiting), (0, 1), "retracted mid-flight");
    let released = handle.release_memory(MemoryTags::ALL).await;
    assert!(released.is_ok(), "a retracted request holds no blocks: {released:?}");
    handle.continue_generation().await.unwrap();
    let (steps, _) = counts_after_a_while(&handle).await;
    assert_eq!(steps, stats.num_steps, "continued, but released: no step");
    handle.resume_memory(MemoryTags::ALL).await.unwrap();
    // It finishes on weights read again, recomputing its prompt and tokens: the same bits.
    while let Some(Some(RequestEvent::Token(t))) = stream.next().now_or_never() {
        tokens.push(t);
    }
    let rest = common::collect(stream).await;
    tokens.extend(rest.tokens.iter().cloned());
    let whole = Outcome { tokens, ..rest };
    assert_eq!(bits(&whole), bits(&want), "resumed bit for bit after the release");

    // A request running refuses the release, naming what to do.
    let mut long = handle.submit(routed_request(&prompt, 400)).await.unwrap();
    let first = tokio::time::timeout(WATCHDOG, long.next()).await.unwrap();
    assert!(matches!(first, Some(RequestEvent::Token(_))), "{first:?}");
    match handle.release_memory(MemoryTags::ALL).await {
        Err(EngineError::Conflict(message)) => {
            assert!(message.contains("running") && message.contains("retract"), "{message}")
        }
        other => panic!("a running request refuses the release: {other:?}"),
    }
    assert_eq!(handle.memory_released().await.unwrap(), MemoryTags::default());
    drop(long);
    handle.shutdown().await;
}

/// A trainer aborts its rollouts and releases at once: the abort of a request in the step in
/// flight waits for that step, and the release waits with it rather than counting the request
/// as running. The aborted request still ends with its routing rows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_right_after_an_abort_waits_for_it() {
    let arch = "qwen3_moe";
    let g = Golden::open(arch);
    let prompt = g.prompt("long");
    let handle = engine(arch, |_| {});
    // Decoding back to back, a step is in flight nearly always: each round aborts one.
    for round in 0..3 {
        let mut stream = handle.submit(routed_request(&prompt, 400)).await.unwrap();
        let first = tokio::time::timeout(WATCHDOG, stream.next()).await.unwrap();
        let Some(RequestEvent::Token(first)) = first else { panic!("{first:?}") };
        handle.abort(stream.id());
        let released = handle.release_memory(MemoryTags::ALL).await;
        assert!(
            released.is_ok(),
            "round {round}: the aborted request is not running: {released:?}"
        );
        let rest = common::collect(stream).await;
        assert!(rest.error.is_none(), "{:?}", rest.error);
        let last = &rest.finals[0];
        assert_eq!(last.finish_reason, routed::types::FinishReason::Abort);
        // A row for every token computed: the prompt and each token fed back.
        let num_tokens = 1 + rest.tokens.len();
        let rows = last.routing.as_ref().expect("routing rows");
        assert_eq!(rows.num_rows, prompt.len() + num_tokens - 1, "round {round}: {first:?}");
        handle.resume_memory(MemoryTags::ALL).await.unwrap();
    }
    handle.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_weight_update_waits_for_the_weights_and_graphs_alone_stop_nothing() {
    let arch = "qwen3_moe";
    let g = Golden::open(arch);
    let prompt = g.prompt("main");
    let handle = engine(arch, |_| {});
    let before = run(&handle, routed_request(&prompt, 8)).await;

    // Graphs alone: decode steps run eagerly meanwhile, with the same bits.
    let graphs = MemoryTags { cuda_graph: true, ..MemoryTags::default() };
    let released = handle.release_memory(graphs).await.unwrap();
    assert_eq!(released.released, MemoryTags::default(), "graphs come back by themselves");
    assert_eq!(bits(&run(&handle, routed_request(&prompt, 8)).await), bits(&before));
    handle.resume_memory(graphs).await.unwrap();

    // An update needs the weights in memory.
    let other = tempfile::tempdir().unwrap();
    write_other_policy(&golden_root().join(arch).join("model"), other.path());
    handle.release_memory(tags(true, true)).await.unwrap();
    match handle.update_weights(update(other.path())).await {
        Err(EngineError::Conflict(message)) => assert!(message.contains("resume"), "{message}"),
        other => panic!("an update of released weights is refused: {other:?}"),
    }
    handle.resume_memory(tags(true, false)).await.unwrap();
    handle.update_weights(update(other.path())).await.unwrap();
    handle.resume_memory(tags(false, true)).await.unwrap();
    // The new policy serves: the update went through after the resume.
    let after = run(&handle, routed_request(&prompt, 8)).await;
    assert_ne!(bits(&after).0, bits(&before).0, "the other policy's tokens");

    // A resume of weights whose checkpoint is gone leaves them released, and says why.
    let gone = tempfile::tempdir().unwrap();
    write_other_policy(&golden_root().join(arch).join("model"), gone.path());
    handle.update_weights(update(gone.path())).await.unwrap();
    handle.release_memory(tags(true, false)).await.unwrap();
    drop(gone);
    match handle.resume_memory(tags(true, false)).await {
        Err(EngineError::InvalidRequest { param: "model_path", .. }) => {}
        other => panic!("the checkpoint is gone: {other:?}"),
    }
    assert!(handle.memory_released().await.unwrap().weights, "still released");
    // A shutdown does not wait for memory that may never come back: what waits for it ends.
    let waiting = handle.submit(routed_request(&prompt, 8)).await.unwrap();
    tokio::time::timeout(WATCHDOG, handle.shutdown()).await.expect("the shutdown drains");
    let ended = common::collect(waiting).await;
    let reason = &ended.finals[0].finish_reason;
    assert_eq!(*reason, routed_types::FinishReason::Abort, "{ended:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expert_parallel_ranks_release_and_resume_together() {
    let arch = "qwen3_moe";
    let prompt = Golden::open(arch).prompt("main");
    let test = "expert_parallel_ranks_release_together";
    // On GPUs, the expert rows between the devices, then through host memory.
    for peer_exchange in [true, false] {
        let Some(handle) = engine_if_devices(arch, test, |c| {
            c.expert_parallel_size = 2;
            c.peer_exchange = peer_exchange;
        }) else {
            return;
        };
        let before = run(&handle, routed_request(&prompt, 8)).await;
        // The KV cache alone (the expert rows' buffers made again, so each rank's exchange must
        // read its peers' new addresses), then everything.
        for tags in [tags(false, true), MemoryTags::ALL] {
            let change = handle.release_memory(tags).await.unwrap();
            assert!(change.num_bytes > 0, "{tags:?}");
            let released = handle.memory_released().await.unwrap();
            assert!(released.kv_cache && released.weights == tags.weights, "{released:?}");
            handle.resume_memory(tags).await.unwrap();
            let after = run(&handle, routed_request(&prompt, 8)).await;
            let what = format!("{tags:?}, peer exchange {peer_exchange}");
            assert_eq!(bits(&after), bits(&before), "both ranks serve as before ({what})");
        }
        handle.shutdown().await;
    }
}
