//! The lines `docs/api.md` shows for reading routing in RL trainers (vLLM-style clients, verl,
//! slime, SGLang's OpenAI clients) run as written, in Python with numpy and the `openai` client
//! (`tests/rl_clients.py`), against a live server on the embedded hybrid (Mamba, attention and MoE
//! layers), on an all-MoE model (Mixtral) and on a model with a dense layer among its MoE layers
//! (Qwen3-MoE). The trainers take `num_hidden_layers` and `num_experts_per_tok` from the
//! checkpoint's `config.json`, as they do with vLLM and SGLang.
//!
//! Uses `$ROUTED_PYTHON`, else `python3`. Without `openai` or `numpy` the test says so and
//! skips, except under `CI=true`, where it fails.

mod common;

use common::{checkpoint, server};
use routed_test_support::{repo_root, run_python};

fn rl_clients_read(arch: &str) {
    let s = server(arch);
    let args = [
        format!("http://{}", s.addr),
        arch.to_owned(),
        checkpoint(arch).display().to_string(),
        repo_root().join("docs/api.md").display().to_string(),
    ];
    if let Some(stdout) = run_python("rl_clients.py", &args) {
        assert!(stdout.contains("rl clients agree: vllm, verl, slime, sglang-openai"), "{stdout}");
    }
}

#[test]
fn rl_clients_read_the_embedded_hybrid() {
    rl_clients_read("tiny_hybrid_default");
}

#[test]
fn rl_clients_read_an_all_moe_model() {
    rl_clients_read("mixtral");
}

#[test]
fn rl_clients_read_a_model_with_a_dense_layer() {
    rl_clients_read("qwen3_moe");
}
