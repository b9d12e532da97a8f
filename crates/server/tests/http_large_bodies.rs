//! One large legal body does not stall the gateway: while an 8 MiB prompt is being tokenized
//! (a server whose `max_model_len` lets it through the length bound), `/health` and other
//! requests, streams included, are answered; and the memory the body took is given back.
//!
//! One server and one test in this file: the resident set size is the process's, and another
//! test running beside this one would move it.

mod common;

use std::sync::mpsc;

use common::{TestServer, WATCHDOG, test_config};
use serde_json::json;

const MODEL: &str = "tiny_hybrid_default";

/// This process's resident set size, in bytes.
fn rss() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").expect("/proc/self/status");
    let line = status.lines().find(|l| l.starts_with("VmRSS:")).expect("VmRSS");
    let kb: u64 = line.split_whitespace().nth(1).and_then(|v| v.parse().ok()).expect("kB");
    kb * 1024
}

#[test]
fn a_huge_legal_body_does_not_stall_the_gateway_and_its_memory_is_given_back() {
    let mut config = test_config(MODEL);
    // Long enough that the length bound lets 8 MiB of text through to the tokenizer; max_model_len
    // is clamped to what the pool holds, so the pool is that large too (its pages stay untouched,
    // outside the resident set).
    config.max_model_len = Some(1 << 20);
    config.num_kv_blocks = Some((1 << 20) / 16);
    // One I/O worker: if tokenizing ran on it, nothing else could be answered meanwhile.
    let gateway = routed_server::ServerConfig { workers: 1, ..Default::default() };
    let s = TestServer::start_with(config, gateway);
    s.ok("/v1/completions", &json!({"prompt": "warm up", "max_tokens": 2}));
    let baseline = rss();

    let (done_tx, done_rx) = mpsc::channel();
    let huge = json!({"prompt": "hello world, the quick brown fox. ".repeat(250_000)});
    let addr = s.addr;
    std::thread::spawn(move || {
        let r = common::request(addr, "POST", "/v1/completions", Some(huge.to_string().as_bytes()));
        done_tx.send(r).expect("send the answer");
    });
    common::wait_until("the huge body to be in preparation", || s.registry.num_preparing() > 0);

    // Probe until both probes were answered while the huge body was still being prepared: a
    // gateway that tokenized on its I/O thread could answer them only after it.
    let stream = json!({"prompt": "hi", "max_tokens": 4, "stream": true});
    let answered_meanwhile = loop {
        assert_eq!(s.get("/health").status, 200);
        let streamed = s.post("/v1/completions", &stream);
        assert_eq!(streamed.status, 200, "{}", streamed.text());
        assert_eq!(streamed.sse().last().map(String::as_str), Some("[DONE]"));
        if s.registry.num_preparing() > 0 {
            break true;
        }
        if done_rx.try_recv().is_ok() {
            break false;
        }
    };
    assert!(answered_meanwhile, "the probes were only answered once the huge body was done");

    // The huge prompt passes the bound but not the exact count: refused after encoding.
    let r = done_rx.recv_timeout(WATCHDOG).expect("the huge request is answered (watchdog)");
    let error = r.error(400, "invalid_request_error");
    assert_eq!(error["param"], "prompt", "{error}");
    assert!(!error["message"].as_str().unwrap().contains("at least"), "{error}");

    // Encoding it took most of a gigabyte; that memory goes back to the OS, not to the allocator's
    // free lists.
    let after = rss();
    assert!(
        after < baseline + (256 << 20),
        "resident set {} MiB after the huge body, {} MiB before",
        after >> 20,
        baseline >> 20
    );
}
