//! Expert parallelism from the command line: `routed serve --expert-parallel-size 2` on the
//! embedded model answers over HTTP with the same text and routing as one rank, and `routed bench`
//! runs with two ranks.

use serde_json::{Value, json};
use std::io::{BufRead, BufReader, Read, Write};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// A `routed serve` child process on a free port, killed when dropped.
struct Serve {
    child: Child,
    addr: String,
}

impl Serve {
    fn start(args: &[&str]) -> Self {
        let mut child = Command::new(env!("CARGO_BIN_EXE_routed"))
            .args(["serve", "--port", "0", "--num-kv-blocks", "64", "--threads", "2"])
            .args(args)
            .env("RUST_LOG", "info")
            .env("NO_COLOR", "1")
            .stderr(Stdio::piped())
            .spawn()
            .expect("start routed serve");
        let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
        let addr = loop {
            let line = lines.next().expect("routed serve printed its address").unwrap();
            if let Some(at) = line.find("serving on http://") {
                let rest = &line[at + "serving on http://".len()..];
                break rest.split_whitespace().next().unwrap().to_owned();
            }
        };
        // Keep draining the child's log so it never blocks on a full pipe.
        std::thread::spawn(move || lines.for_each(drop));
        Self { child, addr }
    }

    fn post(&self, path: &str, body: &Value) -> Value {
        let body = body.to_string();
        let mut stream = std::net::TcpStream::connect(&self.addr).unwrap();
        stream.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
        write!(
            stream,
            "POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n\
             Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        )
        .unwrap();
        let mut response = String::new();
        stream.read_to_string(&mut response).unwrap();
        assert!(response.starts_with("HTTP/1.1 200"), "{response}");
        let (_, json) = response.split_once("\r\n\r\n").unwrap();
        serde_json::from_str(json).unwrap()
    }
}

impl Drop for Serve {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

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
        let serve = Serve::start(&["--expert-parallel-size", ep]);
        let models = {
            let mut stream = std::net::TcpStream::connect(&serve.addr).unwrap();
            stream
                .write_all(b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
                .unwrap();
            let mut r = String::new();
            stream.read_to_string(&mut r).unwrap();
            r
        };
        assert!(models.starts_with("HTTP/1.1 200"), "{models}");
        requests.iter().map(|r| serve.post("/v1/completions", r)).collect::<Vec<_>>()
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
