//! `routed serve` on the CUDA worker, driven over HTTP by the official `openai` Python client
//! (`tests/openai_client.py`: completions, chat, streams, logprobs, routing rows decoded with
//! numpy), and `routed bench`'s CUDA-graphs scenario. The device is `$ROUTED_TEST_DEVICE` (`cuda:0` on a GPU machine), else the CUDA
//! simulator (`cuda-sim`), which is how CI runs it. A build without `--features cuda` skips it.
//!
//! Uses `$ROUTED_PYTHON`, else `python3`; without `openai` or `numpy` the test says so and skips,
//! except under `CI=true`, where it fails.

mod common;

use common::{
    DEVICE_ENV,
    http::{Server, routed_bin},
};
use routed_test_support::{golden_root, run_python};

#[test]
fn the_openai_client_drives_serve_on_the_cuda_worker() {
    let Some(device) = cuda_device() else { return };
    let model = golden_root().join("qwen3_moe").join("model");
    let server = Server::start(&[
        "--model",
        model.to_str().expect("a UTF-8 path"),
        "--served-model-name",
        "qwen3-moe-tiny",
        "--device",
        &device,
    ]);
    // `/v1/models` and `/health` name the device (`cuda:0 (NVIDIA H100 ...)`, or `cuda-sim`).
    let models = server.request("GET", "/v1/models", None).json();
    let health = server.request("GET", "/health", None).json();
    for named in [&models["data"][0]["device"], &health["device"]] {
        assert!(named.as_str().is_some_and(|d| d.starts_with(&device)), "{models} {health}");
    }
    let args = [format!("http://{}", server.addr), "qwen3-moe-tiny".to_owned()];
    if let Some(stdout) = run_python("openai_client.py", &args) {
        assert!(stdout.contains("openai client agrees"), "{stdout}");
    }
}

/// `routed bench cuda-graphs` compares graphed and eager decode at batch 1 and 8 and writes a
/// record of each, naming the device.
#[test]
fn bench_compares_decode_graphs_with_eager_steps() {
    let Some(device) = cuda_device() else { return };
    let args = ["cuda-graphs", "--prompt-len", "8", "--output-len", "6", "--repeats", "2"];
    let records = bench_records(&device, &args);
    let scenarios: Vec<&str> = records.iter().map(|r| r["scenario"].as_str().unwrap()).collect();
    assert_eq!(scenarios, ["cuda_graphs_b1", "cuda_graphs_b8"]);
    for r in &records {
        assert!(r["median_speedup"].as_f64().is_some_and(|s| s > 0.0), "{r}");
        assert!(r["device"].as_str().unwrap().starts_with(&device), "{r}");
    }
}

/// `routed bench kernels` times every product of the model's shapes, the residual add and norm, a
/// MoE layer's experts, decode attention and token selection, and its records carry the bytes
/// and flops each case must move and compute (qwen3_moe's golden checkpoint: hidden 64, 4 query
/// and 2 KV heads of 16, 8 experts 16 wide, top 2, vocabulary 512).
#[test]
fn bench_kernels_times_the_models_products_and_attention() {
    let Some(device) = cuda_device() else { return };
    let records = bench_records(&device, &["kernels", "--batch-sizes", "2", "--repeats", "2"]);
    let find = |scenario: &str| {
        records.iter().find(|r| r["scenario"] == scenario).unwrap_or_else(|| panic!("{scenario}"))
    };
    // m = 2 rows: bf16 weights [n, k], f32 inputs [m, k] and outputs [m, n]; in the CPU's order
    // and on tensor cores, each in every tiling.
    let cases = [("q_proj_m2", 64, 64), ("kv_proj_m2", 32, 64), ("expert_up_m2", 16, 64)];
    for (case, n, k) in cases.into_iter().chain([("lm_head_m2", 512, 64)]) {
        for (prefix, kernel) in [
            ("gemm", "gemm_bf16w_f32"),
            ("gemm_staged", "gemm_bf16w_f32_staged"),
            ("gemm_mma", "gemm_bf16w_mma"),
            ("gemm_mma_staged", "gemm_bf16w_mma_staged"),
            ("gemm_mma_wide", "gemm_bf16w_mma_staged_wide"),
        ] {
            let r = find(&format!("{prefix}_{case}"));
            assert_eq!(r["kernel"], kernel, "{r}");
            assert_eq!(r["bytes"], (2 * n * k + 4 * 2 * k + 4 * 2 * n) as f64, "{r}");
            assert_eq!(r["flops"], (2 * 2 * n * k) as f64, "{r}");
        }
    }
    // A MoE layer's experts for 2 tokens, 2 experts each of 8: the bf16 up, gate and down
    // matrices (16 x 64) of the 2 to 4 experts hit, and the f32 input and output rows.
    for scenario in ["moe_experts_m2", "moe_experts_mma_m2"] {
        let r = find(scenario);
        let per_expert = 3 * 16 * 64 * 2;
        let bytes = r["bytes"].as_f64().unwrap() as usize - 8 * 2 * 64;
        let experts = bytes / per_expert;
        assert!(bytes.is_multiple_of(per_expert) && (2..=4).contains(&experts), "{r}");
    }
    // Kernel by kernel: the up (and gate) and down products read the same experts as the whole,
    // besides their f32 rows (2 tokens of 64 in, 4 pairs of 16 out; 4 pairs of 16 in, 64 out).
    let touched = (find("moe_experts_m2")["bytes"].as_f64().unwrap() as usize - 8 * 2 * 64)
        / (3 * 16 * 64 * 2);
    for (part, kernel, bytes) in [
        ("moe_up", "moe_expert_up", touched * 2 * 16 * 64 * 2 + 4 * (2 * 64 + 4 * 16)),
        ("moe_down", "moe_expert_down", touched * 16 * 64 * 2 + 4 * (4 * 16 + 4 * 64)),
    ] {
        // 4 pairs over 8 experts: the CPU's arithmetic takes the row kernels.
        for (suffix, tc) in [("", "_row"), ("_mma", " (mma)")] {
            let r = find(&format!("{part}{suffix}_m2"));
            assert_eq!(r["kernel"], format!("{kernel}{tc}"), "{r}");
            assert_eq!(r["bytes"], bytes as f64, "{r}");
        }
    }
    assert_eq!(find("moe_sort_m2")["kernel"], "moe_sort_pairs");
    // The residual add and norm of 2 rows of 64: both read, both written, and the weight.
    let norm = find("add_rms_norm_m2");
    assert_eq!(norm["kernel"], "add_rms_norm_f32");
    assert_eq!(norm["bytes"], (16 * 2 * 64 + 4 * 64) as f64);
    assert_eq!(find("moe_combine_m2")["bytes"], (4 * (4 * 64 + 2 * 64)) as f64);
    // Choosing tokens from 2 rows of 512 f32 logits.
    for scenario in [
        "argmax_b2",
        "log_softmax_b2",
        "greedy_b2",
        "sample_b2",
        "sample_top_p_b2",
        "top_logprobs_b2",
    ] {
        assert_eq!(find(scenario)["bytes"], (2 * 512 * 4) as f64, "{scenario}");
    }
    // Two sequences of 512 tokens: bf16 keys and values of 2 heads of 16, f32 queries and outputs;
    // the same case with the keys' partitions split over CTAs.
    for scenario in ["attn_decode_b2_ctx512", "attn_split_decode_b2_ctx512"] {
        let r = find(scenario);
        assert_eq!(r["bytes"], (2 * 512 * 2 * 16 * 2 * 2 + 2 * 4 * 16 * 4 * 2) as f64, "{r}");
    }
    for r in &records {
        assert!(r["us"].as_f64().is_some_and(|us| us > 0.0), "{r}");
        assert_eq!(r["runs_us"].as_array().map(Vec::len), Some(2), "{r}");
        assert!(r["device"].as_str().unwrap().starts_with(&device), "{r}");
    }
}

/// The records `routed bench ARGS` writes on `device` with qwen3_moe's golden checkpoint.
fn bench_records(device: &str, args: &[&str]) -> Vec<serde_json::Value> {
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("records.json");
    let out = std::process::Command::new(routed_bin())
        .arg("bench")
        .args(args)
        .args(["--device", device, "--model"])
        .arg(golden_root().join("qwen3_moe").join("model"))
        .arg("--json")
        .arg(&json)
        .output()
        .expect("run routed bench");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap()
}

/// The device these tests run on: `$ROUTED_TEST_DEVICE`, else the CUDA simulator; `None` (saying
/// why) in a build without CUDA.
fn cuda_device() -> Option<String> {
    if !cfg!(feature = "cuda") {
        eprintln!("skipping: this build has no CUDA support (build with --features cuda)");
        return None;
    }
    Some(std::env::var(DEVICE_ENV).unwrap_or_else(|_| "cuda-sim".to_owned()))
}
