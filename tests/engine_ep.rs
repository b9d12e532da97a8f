//! Expert parallelism through the whole engine: with 2 and 4 ranks, each holding a slice of every
//! MoE layer's experts, every request's tokens, logprobs (with top alternatives) and routing rows
//! are bitwise those of a single rank, whatever the batching, the prefill chunking and the prefix
//! hits, in either matmul precision, with the expert rows exchanged between the devices or
//! through host memory; and idle heartbeats keep the ranks in lockstep without touching the
//! prefix cache.

mod common;

use common::{Outcome, engine, greedy, run, test_device};
use futures_util::future::join_all;
use routed::runtime::{EngineError, MatmulPrecision};
use routed::types::{SamplingParams, TokenId};
use routed::{EngineHandle, GenerateRequest};
use routed_backend::DeviceSpec;
use routed_test_support::Golden;
use std::time::Duration;

const FAMILIES: [&str; 4] = ["qwen3_moe", "mixtral", "nemotron_h", "granitemoehybrid"];
const PRECISIONS: [MatmulPrecision; 2] = [MatmulPrecision::F32, MatmulPrecision::Bf16];

/// A workload that batches, chunks and hits the prefix cache: two waves of concurrent requests,
/// the second repeating and extending the first's prompts.
fn workload(g: &Golden) -> Vec<Vec<GenerateRequest>> {
    let (main, long) = (g.prompt("main"), g.prompt("long"));
    let prompts: Vec<Vec<TokenId>> =
        vec![long.clone(), main.clone(), [&main[..9], &long[3..20]].concat(), g.prompt("short2")];
    let wave = |extend: bool| {
        prompts
            .iter()
            .enumerate()
            .map(|(i, p)| {
                let prompt =
                    if extend { [p.as_slice(), &long[..5 + i]].concat() } else { p.clone() };
                let sampling = if i % 2 == 0 {
                    SamplingParams { logprobs: Some(5), ..greedy(7) }
                } else {
                    SamplingParams {
                        temperature: 0.9,
                        top_p: 0.95,
                        seed: 40 + i as u64,
                        logprobs: Some(3),
                        ..greedy(7)
                    }
                };
                GenerateRequest { n: 1 + i % 2, ..GenerateRequest::new(prompt, sampling) }
            })
            .collect()
    };
    vec![wave(false), wave(true)]
}

async fn run_workload(handle: &EngineHandle, waves: Vec<Vec<GenerateRequest>>) -> Vec<Outcome> {
    let mut outs = Vec::new();
    for wave in waves {
        outs.extend(join_all(wave.into_iter().map(|r| run(handle, r))).await);
    }
    outs
}

fn assert_bitwise(what: &str, got: &[Outcome], want: &[Outcome]) {
    assert_eq!(got.len(), want.len());
    for (i, (a, b)) in got.iter().zip(want).enumerate() {
        assert!(a.error.is_none() && b.error.is_none(), "{what} #{i}: {:?}", a.error);
        // Token events carry the logprob and the top alternatives' logprobs: comparing them as
        // floats with `==` is a bitwise comparison of the logits they came from. Continuations
        // interleave as the steps happened to batch them, so each is compared on its own.
        for index in 0..a.finals.len() {
            let of = |o: &Outcome| -> Vec<_> {
                o.tokens.iter().filter(|t| t.index == index).cloned().collect()
            };
            assert_eq!(of(a), of(b), "{what} #{i}.{index}: tokens and logprobs");
        }
        assert_eq!(a.finals, b.finals, "{what} #{i}: outputs and routing rows");
    }
}

/// In both matmul precisions (on a CUDA device, bf16 is the tensor-core kernels). On the CUDA
/// simulator the ranks' devices read each other's memory, so expert rows go straight between
/// them; once more with 2 ranks in `f32`, they go through host memory, as on GPUs without peer
/// access.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_expert_parallel_size_gives_the_same_bits() {
    let sim = test_device() == DeviceSpec::CudaSim;
    for (arch, precision) in FAMILIES.into_iter().flat_map(|a| PRECISIONS.map(|p| (a, p))) {
        let g = Golden::open(arch);
        let mut reference = None;
        let host_exchange = sim && precision == MatmulPrecision::F32;
        let runs = [(1, true), (2, true), (4, true), (2, false)];
        for (ep, peer_exchange) in runs.into_iter().filter(|&(_, peer)| peer || host_exchange) {
            let handle = engine(arch, |c| {
                c.expert_parallel_size = ep;
                c.matmul_precision = precision;
                c.peer_exchange = peer_exchange;
                // Small steps: prompts are chunked and requests share steps.
                c.max_num_batched_tokens = 11;
            });
            assert_eq!(handle.model_info().expert_parallel_size, ep);
            let outs = run_workload(&handle, workload(&g)).await;
            let what = format!("{arch} {} ep={ep} peer={peer_exchange}", precision.as_str());
            let hits: usize =
                outs.iter().flat_map(|o| &o.finals).map(|f| f.num_cached_tokens).sum();
            assert!(hits > 0, "{what}: the second wave hits the prefix cache");
            if sim && ep > 1 {
                // Host time copying rows between the ranks: none when the devices exchange them.
                let host_copies = handle.stats().await.unwrap().collective_exchange_seconds;
                assert_eq!(host_copies > 0.0, !peer_exchange, "{what}: {host_copies} s");
            }
            handle.shutdown().await;
            match &reference {
                None => reference = Some(outs),
                Some(want) => assert_bitwise(&what, &outs, want),
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_heartbeats_keep_the_ranks_in_lockstep_and_the_prefix_cache_intact() {
    let arch = "nemotron_h";
    let g = Golden::open(arch);
    let prompt = [g.prompt("long"), g.prompt("main")].concat();
    let cold = {
        let handle = engine(arch, |c| c.enable_prefix_caching = false);
        let out = run(&handle, GenerateRequest::new(prompt.clone(), greedy(6))).await;
        handle.shutdown().await;
        out
    };
    let handle = engine(arch, |c| {
        c.expert_parallel_size = 2;
        c.heartbeat_ms = 5;
    });
    let first = run(&handle, GenerateRequest::new(prompt.clone(), greedy(6))).await;
    let before = handle.stats().await.unwrap().num_dummy_forwards;
    // Idle: the heartbeat runs dummy forwards on both ranks.
    let mut beats = before;
    for _ in 0..200 {
        tokio::time::sleep(Duration::from_millis(10)).await;
        beats = handle.stats().await.unwrap().num_dummy_forwards;
        if beats >= before + 10 {
            break;
        }
    }
    assert!(beats >= before + 10, "the heartbeat beat while idle ({before} -> {beats})");
    let hit = run(&handle, GenerateRequest::new(prompt.clone(), greedy(6))).await;
    assert!(hit.error.is_none(), "{:?}", hit.error);
    assert!(hit.finals[0].num_cached_tokens > 0, "the prefix still hits after the beats");
    for out in [&first, &hit] {
        assert_eq!(out.finals[0].token_ids, cold.finals[0].token_ids);
        assert_eq!(out.finals[0].routing, cold.finals[0].routing);
        assert_eq!(out.tokens, cold.tokens);
    }
    handle.shutdown().await;
}

#[test]
fn a_size_that_does_not_divide_the_experts_is_a_clear_error() {
    let g = Golden::open("qwen3_moe");
    let mut config = routed::EngineConfig::new(routed::ModelSource::Dir(g.model_dir()));
    config.expert_parallel_size = 3;
    config.num_kv_blocks = Some(16);
    match routed::Engine::start(config) {
        Err(EngineError::Load(m)) => assert!(m.contains('8') && m.contains('3'), "{m}"),
        Err(e) => panic!("wrong error: {e}"),
        Ok(_) => panic!("3 ranks cannot split 8 experts"),
    }
}
