//! The engine on a CUDA device, end to end, against the same engine on the CPU. Skips, saying why,
//! in a build without the `cuda` feature or on a machine without a usable GPU (CI has none: these
//! run where a device is lent, from executables built with `--features cuda`).
//!
//! The GPU keeps KV in bf16 where the CPU keeps f32, so logits differ slightly: tokens must be
//! equal, and routing ids equal wherever transformers' selection margin is clear.

mod common;

use common::{engine, request, run, test_config};
use routed::runtime::EngineError;
use routed::{Engine, EngineHandle};
use routed_test_support::Golden;

const ARCHS: [&str; 4] = ["qwen3_moe", "mixtral", "nemotron_h", "granitemoehybrid"];

/// An engine on `cuda:0` with `common::test_config`'s settings, or `None` (with the reason printed)
/// when no CUDA device can be opened.
fn cuda_engine(arch: &str, test: &str) -> Option<EngineHandle> {
    let mut config = test_config(arch);
    config.device = "cuda:0".parse().expect("a device spec");
    match Engine::start(config) {
        Ok(handle) => Some(handle),
        Err(EngineError::Load(why)) if why.contains("CUDA") => {
            eprintln!("skipping {test}: {why}");
            None
        }
        Err(e) => panic!("{arch}: the CUDA engine failed to start: {e}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn greedy_tokens_and_routing_rows_match_the_cpu_engine() {
    for arch in ARCHS {
        let test = "greedy_tokens_and_routing_rows_match_the_cpu_engine";
        let Some(gpu) = cuda_engine(arch, test) else { return };
        assert!(gpu.model_info().device.starts_with("cuda:0"));
        let g = Golden::open(arch);
        let prompt = g.prompt("main");
        let cpu = engine(arch, |_| {});
        let (want, got) =
            (run(&cpu, request(&prompt, 16)).await, run(&gpu, request(&prompt, 16)).await);
        assert!(got.error.is_none(), "{arch}: {:?}", got.error);
        let (want, got) = (&want.finals[0], &got.finals[0]);
        assert_eq!(got.token_ids, want.token_ids, "{arch}: tokens");
        let (rows, want_rows) = (got.routing.as_ref().unwrap(), want.routing.as_ref().unwrap());
        assert_eq!(rows.shape(), want_rows.shape(), "{arch}");
        let layers = g.moe_layers();
        for r in 0..rows.num_rows.min(prompt.len() + 15) {
            for (li, layer) in layers.iter().enumerate() {
                let (margin, _) = g.f32(&format!("main.generate.layer{layer}.selection_margin"));
                if margin.get(r).is_some_and(|&m| m > 1e-3) {
                    let k = rows.row(r).len() / layers.len();
                    let at = li * k..(li + 1) * k;
                    assert_eq!(rows.row(r)[at.clone()], want_rows.row(r)[at], "{arch}: row {r}");
                }
            }
        }
        cpu.shutdown().await;
        gpu.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_prefix_hit_on_the_gpu_reproduces_the_cold_run() {
    for arch in ["qwen3_moe", "nemotron_h"] {
        let Some(gpu) = cuda_engine(arch, "a_prefix_hit_on_the_gpu_reproduces_the_cold_run") else {
            return;
        };
        let prompt = Golden::open(arch).prompt("main");
        let cold = run(&gpu, request(&prompt, 8)).await;
        let warm = run(&gpu, request(&prompt, 8)).await;
        let (cold, warm) = (&cold.finals[0], &warm.finals[0]);
        assert!(warm.num_cached_tokens > 0, "{arch}: the second request hit the prefix cache");
        assert_eq!(warm.token_ids, cold.token_ids, "{arch}: tokens");
        assert_eq!(warm.routing, cold.routing, "{arch}: routing rows");
        gpu.shutdown().await;
    }
}
