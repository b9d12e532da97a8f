//! Pausing generation between rollout steps (SGLang's `/pause_generation` modes, vLLM's `wait`):
//! requests paused in place or retracted resume bit for bit as if never paused; an abort-mode
//! pause ends them with what they computed, a wait-mode one lets them finish; requests submitted while paused are held until generation continues; a
//! weight update while paused does not wait for the paused requests, which then recompute on the
//! new weights (their outputs say which tokens each version sampled); a shutdown drains a paused engine; `flush_cache` only runs when nothing is open.

mod common;

use common::{Outcome, WATCHDOG, engine, request, run, test_config};
use futures_util::{FutureExt, StreamExt};
use routed::runtime::{PauseMode, RequestStream, TokenEvent, WeightUpdate, WeightVersionSpan};
use routed::{Engine, EngineHandle, GenerateRequest, RequestEvent};
use routed_test_support::{Golden, golden_root, write_other_policy};
use routed_types::{FinishReason, RoutingRows, TokenId};
use std::path::Path;

/// A greedy request for the golden "long" prompt (or `prompt`), returning its routing.
fn routed_request(prompt: &[TokenId], max_tokens: u32) -> GenerateRequest {
    let mut r = request(prompt, max_tokens);
    r.return_routing = true;
    r
}

/// What two runs must share bit for bit: tokens with their logprobs, and the routing rows.
fn bits(o: &Outcome) -> (Vec<(u32, u32)>, Option<RoutingRows>) {
    assert!(o.error.is_none(), "{:?}", o.error);
    (common::token_bits(o), o.finals[0].routing.clone())
}

/// Output tokens `[start, end)` sampled on `version`.
fn span(version: &str, start: usize, end: usize) -> WeightVersionSpan {
    WeightVersionSpan { version: version.into(), start, end }
}

/// `r` on a fresh engine over `dir` with prefix caching off: the uninterrupted run.
async fn reference(arch: &str, dir: &Path, r: GenerateRequest) -> Outcome {
    let mut config = test_config(arch);
    config.model = routed::ModelSource::Dir(dir.to_owned());
    config.enable_prefix_caching = false;
    let handle = Engine::start(config).expect("the reference engine starts");
    let out = run(&handle, r).await;
    handle.shutdown().await;
    out
}

/// A request started and read until it streamed `k` tokens.
struct Started {
    stream: RequestStream,
    tokens: Vec<TokenEvent>,
}

async fn start(handle: &EngineHandle, r: GenerateRequest, k: usize) -> Started {
    let mut stream = handle.submit(r).await.expect("submitted");
    let mut tokens = Vec::new();
    let read = async {
        while tokens.len() < k {
            match stream.next().await {
                Some(RequestEvent::Token(t)) => tokens.push(t),
                other => panic!("ended before {k} tokens: {other:?}"),
            }
        }
    };
    tokio::time::timeout(WATCHDOG, read).await.expect("tokens within the watchdog");
    Started { stream, tokens }
}

/// Submits `r` and pauses in `mode` at once, then continues and pauses again until the request
/// streamed at least `k` tokens. However fast the engine runs, the request is paused early: its
/// submission plans its first step and each continue its next one, and a pause holds once that
/// step is done.
async fn start_paused(
    handle: &EngineHandle,
    r: GenerateRequest,
    mode: PauseMode,
    k: usize,
) -> Started {
    let mut started = start(handle, r, 0).await;
    loop {
        let done = handle.pause_generation(mode).await.unwrap();
        assert_eq!((done.mode, done.num_requests), (mode, 1));
        started.drain_ready();
        if started.tokens.len() >= k {
            return started;
        }
        assert_eq!(handle.continue_generation().await.unwrap(), 0);
    }
}

impl Started {
    /// Takes the tokens already streamed (the pause holds, so no more are coming).
    fn drain_ready(&mut self) {
        while let Some(Some(event)) = self.stream.next().now_or_never() {
            match event {
                RequestEvent::Token(t) => self.tokens.push(t),
                other => panic!("a paused request ended: {other:?}"),
            }
        }
    }

    /// The whole outcome, from the first token on.
    async fn finish(self) -> Outcome {
        let mut rest = common::collect(self.stream).await;
        let mut tokens = self.tokens;
        tokens.append(&mut rest.tokens);
        Outcome { tokens, ..rest }
    }
}

fn tokens(events: &[TokenEvent]) -> Vec<TokenId> {
    events.iter().map(|t| t.token).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn paused_requests_resume_bit_for_bit_and_new_ones_wait_for_continue() {
    for arch in ["qwen3_moe", "nemotron_h"] {
        for mode in [PauseMode::InPlace, PauseMode::Retract] {
            let g = Golden::open(arch);
            let dir = golden_root().join(arch).join("model");
            let want = reference(arch, &dir, routed_request(&g.prompt("long"), 160)).await;
            let want_held = reference(arch, &dir, routed_request(&g.prompt("main"), 8)).await;
            let handle = engine(arch, |_| {});

            let r = routed_request(&g.prompt("long"), 160);
            let paused = start_paused(&handle, r, mode, 3).await;
            assert!(paused.tokens.len() < 160, "{arch} {mode:?}: paused before the end");
            let held = handle.submit(routed_request(&g.prompt("main"), 8)).await.unwrap();
            let admission = handle.admission().await.unwrap();
            assert_eq!((admission.paused, admission.num_held_requests), (Some(mode), 1));
            assert!(!handle.flush_cache().await.unwrap(), "requests are open: no flush");
            let stats = handle.stats().await.unwrap();
            match mode {
                PauseMode::InPlace => assert_eq!(stats.num_running, 1, "{arch}: kept in place"),
                _ => {
                    assert_eq!((stats.num_running, stats.num_waiting), (0, 1), "{arch}");
                    assert_eq!(stats.num_live_states_held, 0, "{arch}: the state slot went");
                    assert!(stats.num_preemptions >= 1, "{arch}: counted as a preemption");
                }
            }
            // Asking again changes nothing and holds at once.
            assert_eq!(handle.pause_generation(mode).await.unwrap().num_requests, 1);
            let steps = handle.stats().await.unwrap().num_steps;
            assert_eq!(steps, stats.num_steps, "{arch} {mode:?}: no step while paused");

            assert_eq!(handle.continue_generation().await.unwrap(), 1, "the held one goes");
            assert!(handle.admission().await.unwrap().is_open());
            let (resumed, held) = tokio::join!(paused.finish(), common::collect(held));
            assert_eq!(bits(&resumed), bits(&want), "{arch} {mode:?}: as if never paused");
            assert_eq!(bits(&held), bits(&want_held), "{arch} {mode:?}: the held request");
            if mode == PauseMode::Retract {
                let stats = handle.stats().await.unwrap();
                assert!(stats.num_prefix_cache_hits >= 1, "{arch}: resumed from its own blocks");
            }
            assert_eq!(handle.continue_generation().await.unwrap(), 0, "not paused: a no-op");
            handle.shutdown().await;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_abort_pause_ends_the_requests_in_flight_and_a_flush_waits_for_an_idle_engine() {
    let g = Golden::open("qwen3_moe");
    let dir = golden_root().join("qwen3_moe/model");
    let handle = engine("qwen3_moe", |_| {});

    // Started and paused in place first, so it is mid-decode whatever the engine's speed.
    let aborted =
        start_paused(&handle, routed_request(&g.prompt("long"), 900), PauseMode::InPlace, 2).await;
    let done = handle.pause_generation(PauseMode::Abort).await.unwrap();
    assert_eq!((done.mode, done.num_requests), (PauseMode::Abort, 1));
    let aborted = aborted.finish().await;
    assert_eq!(aborted.finals[0].finish_reason, FinishReason::Abort);
    let n = aborted.tokens.len();
    assert!((2..900).contains(&n), "{n} tokens");
    let want = reference("qwen3_moe", &dir, routed_request(&g.prompt("long"), n as u32)).await;
    assert_eq!(common::token_bits(&aborted), common::token_bits(&want));
    let rows = aborted.finals[0].routing.as_ref().expect("the rows it computed").num_rows;
    assert_eq!(rows, g.prompt("long").len() + n - 1, "every position it computed");

    // Renamed while paused: the held request reports the new name.
    let held = handle.submit(routed_request(&g.prompt("long"), 4)).await.unwrap();
    let weights = handle.set_weight_version("step-7".into(), false).await.unwrap();
    assert_eq!((weights.version.as_str(), weights.num_updates), ("step-7", 0));
    assert_eq!(handle.continue_generation().await.unwrap(), 1);
    let held = common::collect(held).await;
    let m = n.min(4);
    assert_eq!(common::token_bits(&held)[..m], common::token_bits(&want)[..m]);
    assert_eq!(held.finals[0].weight_version, "step-7");
    assert_eq!(
        held.finals[0].weight_versions,
        [span("step-7", 0, held.tokens.len())],
        "no token before the rename"
    );

    let hit = run(&handle, routed_request(&g.prompt("long"), 4)).await;
    assert!(hit.finals[0].num_cached_tokens > 0, "cached before the flush");
    assert!(handle.flush_cache().await.unwrap(), "nothing open: flushed");
    let cold = run(&handle, routed_request(&g.prompt("long"), 4)).await;
    assert_eq!(cold.finals[0].num_cached_tokens, 0, "the flush dropped the cache");
    assert_eq!(bits(&cold), bits(&hit));
    handle.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_update_while_paused_resumes_the_paused_requests_on_the_new_weights() {
    for (arch, mode) in [("qwen3_moe", PauseMode::InPlace), ("nemotron_h", PauseMode::Retract)] {
        let g = Golden::open(arch);
        let new = tempfile::tempdir().unwrap();
        write_other_policy(&golden_root().join(arch).join("model"), new.path());
        let handle = engine(arch, |_| {});
        let prompt = g.prompt("long");

        let paused = start_paused(&handle, routed_request(&prompt, 24), mode, 3).await;
        let k = paused.tokens.len();
        assert!(k < 24, "{arch}: paused before the end");
        let update = WeightUpdate {
            dir: new.path().to_owned(),
            abort_all_requests: false,
            weight_version: Some("step-1".into()),
        };
        let updated = tokio::time::timeout(WATCHDOG, handle.update_weights(update))
            .await
            .expect("the update does not wait for the paused request")
            .unwrap();
        assert_eq!(updated.num_aborted_requests, 0);
        let stats = handle.stats().await.unwrap();
        assert_eq!(
            (stats.num_running, stats.num_kv_blocks_cached),
            (0, 0),
            "{arch}: all retracted"
        );
        handle.continue_generation().await.unwrap();
        let resumed = paused.finish().await;

        // The new weights recompute the prompt and the k tokens the old ones sampled, then go on
        // exactly as a new-weights engine continues that text.
        let mut prefix = prompt.clone();
        prefix.extend(resumed.tokens[..k].iter().map(|t| t.token));
        let want = reference(arch, new.path(), routed_request(&prefix, 24 - k as u32)).await;
        assert_eq!(resumed.finals[0].routing, want.finals[0].routing, "{arch}: new-weight rows");
        let (got, want) = (&resumed.tokens[k..], &want.tokens);
        assert_eq!(got.iter().map(|t| t.token).collect::<Vec<_>>(), tokens(want), "{arch}");
        for (a, b) in got.iter().zip(want) {
            if arch == "nemotron_h" {
                // The reference reads the k tokens as prompt, where Mamba2 clamps `dt`; the
                // resumed request computes them as the outputs they are, without the clamp.
                assert!((a.logprob - b.logprob).abs() < 1e-4, "{arch}: {a:?} {b:?}");
            } else {
                assert_eq!(a.logprob.to_bits(), b.logprob.to_bits(), "{arch}: {a:?} {b:?}");
            }
        }
        // Which weights sampled which tokens: the old ones the first k, the new ones the rest.
        assert_eq!(resumed.finals[0].weight_version, "step-1");
        let spans = [span("default", 0, k), span("step-1", k, 24)];
        assert_eq!(resumed.finals[0].weight_versions, spans, "{arch}");
        let names: Vec<&str> = resumed.tokens.iter().map(|t| &*t.weight_version).collect();
        assert_eq!(names, [["default"; 1].repeat(k), ["step-1"; 1].repeat(24 - k)].concat());
        handle.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wait_pause_lets_the_requests_in_flight_finish_and_holds_the_new_ones() {
    let g = Golden::open("nemotron_h");
    let dir = golden_root().join("nemotron_h/model");
    let want = reference("nemotron_h", &dir, routed_request(&g.prompt("long"), 40)).await;
    let handle = engine("nemotron_h", |_| {});
    let r = routed_request(&g.prompt("long"), 40);
    let frozen = start_paused(&handle, r, PauseMode::InPlace, 1).await;
    let held = handle.submit(routed_request(&g.prompt("main"), 4)).await.unwrap();
    // Switching to `wait`: the frozen request runs to its end before the pause holds.
    let done = handle.pause_generation(PauseMode::Wait).await.unwrap();
    assert_eq!((done.mode, done.num_requests), (PauseMode::Wait, 1));
    let finished = frozen.finish().await;
    assert_eq!(finished.finals[0].finish_reason, FinishReason::Length);
    assert_eq!(bits(&finished), bits(&want), "ran to its end as if never paused");
    let admission = handle.admission().await.unwrap();
    assert_eq!((admission.paused, admission.num_held_requests), (Some(PauseMode::Wait), 1));
    assert_eq!(handle.continue_generation().await.unwrap(), 1);
    assert_eq!(common::collect(held).await.finals[0].finish_reason, FinishReason::Length);
    handle.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shutdown_ends_a_pause_and_drains_its_requests() {
    let g = Golden::open("qwen3_moe");
    let handle = engine("qwen3_moe", |_| {});
    // Paused mid-flight for sure (`start_paused` checks the pause caught it).
    let paused =
        start_paused(&handle, routed_request(&g.prompt("long"), 40), PauseMode::InPlace, 1).await;
    let held = handle.submit(routed_request(&g.prompt("main"), 4)).await.unwrap();
    let (paused, held, ()) = tokio::time::timeout(WATCHDOG, async {
        tokio::join!(paused.finish(), common::collect(held), handle.shutdown())
    })
    .await
    .expect("the shutdown drains within the watchdog");
    assert_eq!(paused.finals[0].finish_reason, FinishReason::Length);
    assert_eq!(paused.tokens.len(), 40);
    assert_eq!(held.finals[0].finish_reason, FinishReason::Length);
}
