//! The embedding API's contract: `n > 1`, stop conditions, backpressure, validation and
//! graceful shutdown.

mod common;

use common::{engine, greedy, request, run};
use routed::GenerateRequest;
use routed::runtime::EngineError;
use routed::types::{FinishReason, SamplingParams, StopMatch};
use routed_test_support::Golden;

/// `n = 4` samples four continuations with seeds `seed + i`; the prompt is computed once (the
/// siblings wait one step and hit its blocks) and each continuation equals a solo request with
/// its own seed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn n_continuations_share_the_prompt_and_match_single_requests() {
    for arch in ["qwen3_moe", "nemotron_h"] {
        let g = Golden::open(arch);
        let prompt = g.prompt("long");
        let params = SamplingParams {
            temperature: 1.0,
            seed: 42,
            max_tokens: 6,
            ignore_eos: true,
            ..Default::default()
        };
        let handle = engine(arch, |_| {});
        let out = run(
            &handle,
            GenerateRequest { n: 4, ..GenerateRequest::new(prompt.clone(), params.clone()) },
        )
        .await;
        let stats = handle.stats().await.unwrap();
        handle.shutdown().await;
        assert_eq!(out.finals.len(), 4, "{arch}");
        assert!(
            out.finals[1..].iter().all(|f| f.num_cached_tokens > 0),
            "{arch}: siblings hit the shared prompt"
        );
        assert!(
            stats.num_prefill_tokens_computed < 2 * prompt.len() as u64,
            "{arch}: the prompt was computed once"
        );
        for (i, f) in out.finals.iter().enumerate() {
            let single = engine(arch, |c| c.enable_prefix_caching = false);
            let seed = SamplingParams { seed: 42 + i as u64, ..params.clone() };
            let want = run(&single, GenerateRequest::new(prompt.clone(), seed)).await;
            single.shutdown().await;
            assert_eq!(f.token_ids, want.finals[0].token_ids, "{arch}: continuation {i}");
            assert_eq!(f.routing, want.finals[0].routing, "{arch}: continuation {i}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stop_tokens_stop_strings_and_min_tokens() {
    let g = Golden::open("qwen3_moe");
    let prompt = g.prompt("main");
    let golden: Vec<u32> = g.i64("main.generate.ids").0.iter().map(|&x| x as u32).collect();
    let handle = engine("qwen3_moe", |_| {});

    let stop_id = golden[5];
    let first = golden.iter().position(|&t| t == stop_id).unwrap();
    let params = SamplingParams { stop_token_ids: vec![stop_id], ..greedy(16) };
    let out = run(&handle, GenerateRequest::new(prompt.clone(), params)).await;
    assert_eq!(out.finals[0].token_ids, golden[..=first]);
    assert_eq!(
        out.finals[0].finish_reason,
        FinishReason::Stop { matched: Some(StopMatch::Token(stop_id)) }
    );

    let params = SamplingParams {
        stop_token_ids: vec![stop_id],
        min_tokens: first as u32 + 2,
        ..greedy(16)
    };
    let out = run(&handle, GenerateRequest::new(prompt.clone(), params)).await;
    assert!(out.finals[0].token_ids.len() > first + 1, "min_tokens holds the stop token back");

    let full = handle.tokenizer().decode(&golden).unwrap();
    let needle: String = full.chars().skip(6).take(3).collect();
    let cut = full.find(&needle).unwrap();
    let params = SamplingParams { stop: vec![needle.clone()], ..greedy(16) };
    let out = run(&handle, GenerateRequest::new(prompt.clone(), params)).await;
    assert_eq!(out.finals[0].text, full[..cut]);
    assert_eq!(
        out.finals[0].finish_reason,
        FinishReason::Stop { matched: Some(StopMatch::Text(needle)) }
    );

    let out = run(&handle, request(&prompt, 3)).await;
    assert_eq!(out.finals[0].finish_reason, FinishReason::Length);
    assert_eq!(out.finals[0].routing.as_ref().unwrap().num_rows, prompt.len() + 2);
    handle.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalid_requests_name_the_field() {
    let g = Golden::open("nemotron_h");
    let handle = engine("nemotron_h", |c| c.max_model_len = Some(64));
    let param = |r: Result<_, EngineError>| match r {
        Err(EngineError::InvalidRequest { param, .. }) => param,
        other => panic!(
            "expected an invalid request, got {:?}",
            other.map(|_: routed::runtime::RequestStream| ())
        ),
    };
    assert_eq!(param(handle.submit(request(&[], 4)).await), "prompt");
    assert_eq!(param(handle.submit(request(&[512], 4)).await), "prompt");
    assert_eq!(param(handle.submit(request(&g.prompt("long"), 30)).await), "max_tokens");
    let tiny = engine("nemotron_h", |c| c.num_kv_blocks = Some(8));
    // 8 blocks of 4 clamp max_model_len to 32 tokens.
    assert_eq!(
        param(tiny.submit(request(&g.prompt("long"), 1)).await),
        "prompt",
        "40 prompt tokens > 8 blocks of 4"
    );
    assert_eq!(
        param(tiny.submit(request(&g.prompt("main"), 16)).await),
        "max_tokens",
        "24 prompt + 16 new tokens > 8 blocks of 4"
    );
    tiny.shutdown().await;
    let r = GenerateRequest { n: 0, ..request(&g.prompt("short1"), 4) };
    assert_eq!(param(handle.submit(r).await), "n");
    let r = GenerateRequest { routing_start: 5, ..request(&g.prompt("short3"), 4) };
    assert_eq!(param(handle.submit(r).await), "routed_experts_start_len");
    handle.shutdown().await;

    let off = engine("nemotron_h", |c| c.enable_routing_capture = false);
    assert_eq!(param(off.submit(request(&g.prompt("short3"), 4)).await), "return_routed_experts");
    let r = GenerateRequest { return_routing: false, ..request(&g.prompt("short3"), 4) };
    assert!(run(&off, r).await.finals[0].routing.is_none());
    off.shutdown().await;
}

/// An embedder calling `submit` directly gets the same sampling ranges as the HTTP gateway: a
/// NaN temperature or a bias on a token past the vocabulary is refused naming the field, and
/// the engine serves the next request.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn out_of_range_sampling_parameters_are_refused_and_the_engine_keeps_serving() {
    let g = Golden::open("qwen3_moe");
    let prompt = g.prompt("short1");
    let handle = engine("qwen3_moe", |_| {});
    let vocab = handle.model_info().vocab_size as u32;
    for (params, field) in [
        (SamplingParams { temperature: f32::NAN, ..greedy(4) }, "temperature"),
        (SamplingParams { logit_bias: vec![(vocab, 1.0)], ..greedy(4) }, "logit_bias"),
    ] {
        match handle.submit(GenerateRequest::new(prompt.clone(), params)).await {
            Err(EngineError::InvalidRequest { param, message }) => {
                assert_eq!(param, field, "{message}");
                assert!(message.contains(field), "{message}");
            }
            Err(other) => panic!("{field}: expected an invalid request, got {other}"),
            Ok(_) => panic!("{field}: the request was admitted"),
        }
    }
    // The last id of the vocabulary is in range, and the engine still serves.
    let params = SamplingParams { logit_bias: vec![(vocab - 1, 1.0)], ..greedy(4) };
    let out = run(&handle, GenerateRequest::new(prompt, params)).await;
    assert_eq!(out.error, None);
    assert_eq!(out.finals[0].token_ids.len(), 4);
    handle.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_waiting_queue_is_an_overload_error() {
    let g = Golden::open("qwen3_moe");
    let handle = engine("qwen3_moe", |c| {
        c.max_num_seqs = 1;
        c.max_waiting_requests = 1;
    });
    // One running and one waiting fill the engine; a third is refused unless
    // the engine finished a whole request between two submissions, so keep
    // submitting (streams held) until the refusal comes.
    let mut streams = Vec::new();
    let mut refused = false;
    for _ in 0..32 {
        match handle.submit(request(&g.prompt("long"), 32)).await {
            Ok(stream) => streams.push(stream),
            Err(EngineError::Overloaded(_)) => {
                refused = true;
                break;
            }
            Err(e) => panic!("unexpected error: {e}"),
        }
    }
    assert!(refused, "{} requests admitted with room for two", streams.len());
    drop(streams);
    handle.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_drains_in_flight_requests_and_refuses_new_ones() {
    let g = Golden::open("nemotron_h");
    let handle = engine("nemotron_h", |_| {});
    let stream = handle.submit(request(&g.prompt("long"), 12)).await.unwrap();
    let (out, ()) = tokio::join!(common::collect(stream), handle.shutdown());
    assert!(out.error.is_none());
    assert_eq!(out.finals[0].token_ids.len(), 12, "the in-flight request finished");
    assert!(matches!(
        handle.submit(request(&g.prompt("short1"), 2)).await,
        Err(EngineError::ShutDown)
    ));
}

/// The stats split a step's time whether routing is captured or not: the worker's wall time
/// (`forward_seconds`) inside the step's, and of that the device's own time where the device
/// has a clock (a GPU: its events) and none elsewhere (the CPU, the CUDA simulator).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stats_split_the_step_time_with_routing_captured_or_not() {
    let arch = "qwen3_moe";
    let prompt = Golden::open(arch).prompt("main");
    for capture in [true, false] {
        let handle = engine(arch, |c| c.enable_routing_capture = capture);
        let on_gpu = handle.model_info().device.starts_with("cuda:");
        let asked = GenerateRequest { return_routing: capture, ..request(&prompt, 4) };
        let out = run(&handle, asked).await;
        assert!(out.error.is_none(), "{:?}", out.error);
        let s = handle.stats().await.unwrap();
        let what = format!("capture {capture}: {s:?}");
        assert!(s.num_steps > 0 && s.forward_seconds > 0.0, "{what}");
        assert!(s.forward_seconds <= s.step_seconds, "{what}");
        assert!(s.device_seconds <= s.forward_seconds, "{what}");
        assert_eq!(s.device_seconds > 0.0, on_gpu, "{what}");
        handle.shutdown().await;
    }
}
