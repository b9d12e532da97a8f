//! `routed serve` on the CUDA worker, driven over HTTP by the official `openai` Python client
//! (`tests/openai_client.py`: completions, chat, streams, logprobs, routing rows decoded with
//! numpy). The device is `$ROUTED_TEST_DEVICE` (`cuda:0` on a GPU machine), else the CUDA
//! simulator (`cuda-sim`), which is how CI runs it. A build without `--features cuda` skips it.
//!
//! Uses `$ROUTED_PYTHON`, else `python3`; without `openai` or `numpy` the test says so and skips,
//! except under `CI=true`, where it fails.

mod common;

use common::{DEVICE_ENV, http::Server};
use routed_test_support::golden_root;

#[test]
fn the_openai_client_drives_serve_on_the_cuda_worker() {
    if !cfg!(feature = "cuda") {
        eprintln!("skipping: this build has no CUDA support (build with --features cuda)");
        return;
    }
    let device = std::env::var(DEVICE_ENV).unwrap_or_else(|_| "cuda-sim".to_owned());
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
    if let Some(stdout) = common::run_python("openai_client.py", &args) {
        assert!(stdout.contains("openai client agrees"), "{stdout}");
    }
}
