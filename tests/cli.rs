//! The `routed` binary end to end: `generate --json` reproduces transformers' greedy tokens.

mod common;

use common::http::Server;
use routed_test_support::Golden;
use std::process::Command;

fn generate(arch: &str, extra: &[&str]) -> (serde_json::Value, Golden) {
    let g = Golden::open(arch);
    let text = g.meta["cases"]["main"]["text"].as_str().unwrap().to_owned();
    let out = Command::new(env!("CARGO_BIN_EXE_routed"))
        .args(["generate", "--model"])
        .arg(g.model_dir())
        .args(["--prompt", &text, "--max-tokens", "16", "--ignore-eos", "--json"])
        .args(extra)
        .output()
        .expect("run routed");
    assert!(out.status.success(), "routed failed: {}", String::from_utf8_lossy(&out.stderr));
    (serde_json::from_slice(&out.stdout).expect("one JSON object"), g)
}

#[test]
fn generate_json_matches_transformers_greedy_tokens() {
    for arch in ["qwen3_moe", "nemotron_h"] {
        let (out, g) = generate(arch, &[]);
        let want: Vec<i64> = g.i64("main.generate.ids").0;
        let got: Vec<i64> =
            out["token_ids"].as_array().unwrap().iter().map(|v| v.as_i64().unwrap()).collect();
        assert_eq!(got, want, "{arch}");
        assert_eq!(out["finish_reason"], "length");
        // The decoder-layer layout, as `routed serve` returns it: every layer, MoE or not.
        let layers = g.meta["num_hidden_layers"].as_u64().unwrap();
        assert!(layers as usize > g.moe_layers().len(), "{arch}: a layer without routed experts");
        assert_eq!(out["routed_experts_shape"], serde_json::json!([24 + 15, layers, 2]), "{arch}");
    }
}

/// `--matmul-precision bf16` reaches the model: the greedy tokens of the golden prompts are
/// those of float32 (the goldens keep every pick clear of its runner-up), and a precision the
/// engine does not have is refused by name.
#[test]
fn generate_with_bf16_matmul_precision() {
    for arch in ["qwen3_moe", "nemotron_h"] {
        let (out, g) = generate(arch, &["--matmul-precision", "bf16"]);
        let got: Vec<i64> =
            out["token_ids"].as_array().unwrap().iter().map(|v| v.as_i64().unwrap()).collect();
        assert_eq!(got, g.i64("main.generate.ids").0, "{arch}");
    }
    let out = Command::new(env!("CARGO_BIN_EXE_routed"))
        .args(["generate", "--prompt", "x", "--matmul-precision", "fp8"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("--matmul-precision") && err.contains("bf16"), "{err}");
}

/// `routed generate --device DEVICE` on the qwen3_moe golden checkpoint: exit status and stderr.
fn generate_on(device: &str) -> (Option<i32>, String) {
    let g = Golden::open("qwen3_moe");
    let out = Command::new(env!("CARGO_BIN_EXE_routed"))
        .args(["generate", "--device", device, "--prompt", "x", "--model"])
        .arg(g.model_dir())
        .env("RUST_BACKTRACE", "0")
        .output()
        .unwrap();
    (out.status.code(), String::from_utf8_lossy(&out.stderr).into_owned())
}

#[test]
fn a_cuda_device_without_cuda_is_a_clear_error() {
    // Without the `cuda` feature: "no CUDA support"; with it, on a machine without a driver or
    // GPU: "no CUDA driver" or "no such device". Either way exit status 1, never a panic.
    let (code, err) = generate_on("cuda:0");
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("CUDA") && !err.contains("panicked"), "{err}");
}

#[test]
fn an_unknown_device_is_refused_naming_the_forms_accepted() {
    let (code, err) = generate_on("gpu:0");
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("--device gpu:0") && err.contains("`cpu` or `cuda:N`"), "{err}");
}

/// `routed serve` with no flags serves the embedded model; the startup line names the address.
#[test]
fn serve_runs_the_embedded_model() {
    let serve = Server::start(&["--num-kv-blocks", "64"]);
    let models = serve.get("/v1/models");
    assert_eq!(models.status, 200, "{models:?}");
    assert!(
        models.body.contains("routed-tiny-hybrid") && models.body.contains("moe_layer_ids"),
        "{models:?}"
    );
}

/// `--enable-auto-tool-choice --tool-call-parser hermes` lets chats with tools run (their answers
/// read for calls) and `--reasoning-parser qwen3` splits off their reasoning; the first flag
/// without the second, or an unknown parser, is refused before anything starts.
#[test]
fn serve_reads_tool_calls_and_reasoning_with_their_flags() {
    let args = [
        "--num-kv-blocks",
        "64",
        "--enable-auto-tool-choice",
        "--tool-call-parser",
        "hermes",
        "--reasoning-parser",
        "qwen3",
    ];
    let serve = Server::start(&args);
    let tool = serde_json::json!({"type": "function", "function": {"name": "f"}});
    let body = serde_json::json!({"messages": [{"role": "user", "content": "hi"}],
                                  "max_tokens": 2, "tools": [tool]});
    let r = serve.post("/v1/chat/completions", &body);
    assert_eq!(r.status, 200, "{r:?}");
    let answer: serde_json::Value = serde_json::from_str(&r.body).expect("JSON");
    let message = &answer["choices"][0]["message"];
    assert_eq!(message["tool_calls"], serde_json::json!([]), "{answer}");
    assert!(message.get("reasoning_content").is_some_and(|r| r.is_null()), "{answer}");
    for (args, says) in [
        (&["--enable-auto-tool-choice"][..], "--tool-call-parser"),
        (&["--tool-call-parser", "nope"][..], "supported: hermes, mistral"),
        (&["--reasoning-parser", "nope"][..], "supported: qwen3, deepseek_r1"),
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_routed"))
            .arg("serve")
            .args(args)
            .output()
            .expect("run routed");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success() && err.contains(says), "{args:?}: {err}");
    }
}

/// `routed bench` on the embedded model writes the records the baseline scripts' format expects:
/// decode rates per batch size, the cold prefill rate, and prefix hits at block boundaries; its
/// requests sample at the temperature asked for.
#[test]
fn bench_writes_comparable_records() {
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("routed.json");
    let out = Command::new(env!("CARGO_BIN_EXE_routed"))
        .args(["bench", "all", "--batch-sizes", "1,2", "--prompt-len", "40", "--output-len", "4"])
        .args(["--repeats", "2", "--num-kv-blocks", "64", "--temperature", "0.7", "--json"])
        .arg(&json)
        .output()
        .expect("run routed bench");
    assert!(out.status.success(), "bench failed: {}", String::from_utf8_lossy(&out.stderr));
    let records: Vec<serde_json::Value> =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let find = |scenario: &str| {
        records
            .iter()
            .find(|r| r["scenario"] == scenario)
            .unwrap_or_else(|| panic!("no {scenario} record in {records:?}"))
    };
    for scenario in ["tg_b1", "tg_b2", "pp40"] {
        let r = find(scenario);
        assert!(r["tokens_per_s"].as_f64().unwrap() > 0.0, "{r}");
        assert_eq!(r["runs"].as_array().unwrap().len(), 2, "{r}");
        assert_eq!(r["engine"], "routed");
        assert_eq!((&r["device"], &r["dtype"]), (&"cpu".into(), &"f32".into()), "{r}");
        assert_eq!(r["temperature"].as_f64(), Some(0.7f32 as f64), "{r}");
    }
    // 40 tokens in blocks of 16: 50 % rounds to one block, 90 % and 99 % to two.
    for (scenario, cached) in [("prefix_hit_50", 16), ("prefix_hit_90", 32), ("prefix_hit_99", 32)]
    {
        assert_eq!(find(scenario)["cached_tokens"], cached, "{scenario}");
    }
    find("roofline_b1");
    // The routing pipeline's time: its part on the step's path within all of it, both taken.
    let r = find("routing_overhead");
    let (path, all) = (r["path_share_of_step"].as_f64(), r["pipeline_share_of_step"].as_f64());
    assert!(path.zip(all).is_some_and(|(p, a)| 0.0 < p && p <= a), "{r}");
    // The step split: the engine around the worker, the worker's host side, no device clock.
    for scenario in ["engine_overhead_b1", "engine_overhead_b64"] {
        let r = find(scenario);
        assert!(r["worker_host_ms"].as_f64().unwrap() > 0.0, "{r}");
        assert!(r["overhead_ms"].as_f64().unwrap() >= 0.0, "{r}");
        assert_eq!(r["device_ms"].as_f64(), Some(0.0), "{r}");
    }
}

/// The CUDA-only benchmarks on the CPU are refused before anything loads, naming what they need.
#[test]
fn cuda_benchmarks_need_a_cuda_device() {
    for scenario in ["cuda-graphs", "kernels"] {
        let out = Command::new(env!("CARGO_BIN_EXE_routed"))
            .args(["bench", scenario])
            .output()
            .expect("run routed bench");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{stderr}");
        let want = format!("{scenario} scenario needs a CUDA device");
        assert!(stderr.contains(&want), "{stderr}");
    }
}
