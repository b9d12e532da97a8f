//! Expert parallelism from the command line: `routed serve --expert-parallel-size 2` on the
//! embedded model answers over HTTP with the same text and routing as one rank, and `routed bench`
//! runs with two ranks.

mod common;

use common::http::Server;
use serde_json::{Value, json};
use std::process::Command;

#[test]
fn serve_with_two_ranks_answers_as_one_rank() {
    let requests = [
        json!({"prompt": "The router picks", "max_tokens": 12, "temperature": 0,
               "routed_experts_format": "list", "logprobs": 3}),
        json!({"prompt": "Experts", "max_tokens": 10, "temperature": 0.9, "seed": 7, "n": 2,
               "routed_experts_format": "list"}),
        json!({"prompt": [5, 9, 2, 44, 17, 3, 8, 8, 120, 33, 4, 6, 70, 71, 72, 73, 74, 75],
               "max_tokens": 6, "temperature": 0, "routed_experts_format": "list"}),
    ];
    let answers = |ep: &str| {
        let serve = Server::start(&["--num-kv-blocks", "64", "--expert-parallel-size", ep]);
        let health = serve.get("/health");
        assert_eq!(health.status, 200, "{health:?}");
        let post = |r| {
            let answer = serve.post("/v1/completions", r);
            assert_eq!(answer.status, 200, "{answer:?}");
            answer.json()
        };
        requests.iter().map(post).collect::<Vec<_>>()
    };
    let (one, two) = (answers("1"), answers("2"));
    for (i, (a, b)) in one.iter().zip(&two).enumerate() {
        let choices = a["choices"].as_array().unwrap();
        assert_eq!(choices.len(), b["choices"].as_array().unwrap().len());
        for (c, d) in choices.iter().zip(b["choices"].as_array().unwrap()) {
            assert_eq!(c["text"], d["text"], "request {i}: text");
            assert_eq!(c["logprobs"], d["logprobs"], "request {i}: logprobs");
            assert!(c["routed_experts"].is_array(), "request {i}: routing returned");
            assert_eq!(c["routed_experts"], d["routed_experts"], "request {i}: routing");
        }
        assert_eq!(a["routed_experts_meta"], b["routed_experts_meta"]);
    }
}

#[test]
fn bench_throughput_runs_with_two_ranks() {
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("routed.json");
    let out = Command::new(env!("CARGO_BIN_EXE_routed"))
        .args(["bench", "throughput", "--expert-parallel-size", "2", "--batch-sizes", "1,2"])
        .args(["--prompt-len", "16", "--output-len", "4", "--num-kv-blocks", "64", "--json"])
        .arg(&json)
        .output()
        .expect("run routed bench");
    assert!(out.status.success(), "bench failed: {}", String::from_utf8_lossy(&out.stderr));
    let records: Vec<Value> =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    for scenario in ["tg_b1", "tg_b2"] {
        let r = records.iter().find(|r| r["scenario"] == scenario).expect(scenario);
        assert!(r["tokens_per_s"].as_f64().unwrap() > 0.0, "{r}");
        assert_eq!(r["expert_parallel_size"], 2, "{r}");
    }
}
