//! A request the server aborts after it computed some tokens ends with `finish_reason: "abort"`
//! and still returns the routing rows of every token it computed, on the OpenAI routes and on
//! `/generate`: the rows a trainer needs to replay what was generated before the abort.
//!
//! The abort is the gateway's own (`Registry::abort_all`, what an embedding app calls when it
//! stops), sent once the first token has streamed out, so the request has computed its prompt
//! and at least one token whatever the timing. Each test has its own server: the abort reaches
//! every request in flight. An OpenAI request named by SGLang's `rid` is aborted by that id, as
//! SGLang's clients abort it.

mod common;

use common::{
    TestServer, decode_raw_b64, prompt_ids, read_bytes_until, read_rest, routing_of, send_closing,
    test_config,
};
use serde_json::{Value, json};

const MODEL: &str = "tiny_hybrid_default";

/// Starts `body` streaming on `path`, aborts everything in flight once the first event with
/// `needle` arrived, and returns the stream's JSON events.
fn abort_after_first(s: &TestServer, path: &str, body: &Value, needle: &str) -> Vec<Value> {
    let mut stream = send_closing(s.addr, path, body);
    let seen = read_bytes_until(&mut stream, needle);
    s.registry.abort_all(&s.handle);
    let response = read_rest(&mut stream, seen);
    assert_eq!(response.status, 200, "{}", response.text());
    response.sse_json()
}

#[test]
fn an_aborted_completion_returns_the_rows_it_computed() {
    let s = TestServer::start(test_config(MODEL));
    let prompt = prompt_ids(20, 51);
    let body = json!({"prompt": prompt, "max_tokens": 3000, "temperature": 0, "ignore_eos": true,
                      "stream": true, "stream_options": {"include_usage": true},
                      "return_token_ids": true});
    let chunks = abort_after_first(&s, "/v1/completions", &body, "\"token_ids\":[");
    let mut tokens = Vec::new();
    let mut last = None;
    for c in &chunks {
        if let Some(choice) = c["choices"].get(0) {
            tokens.extend(choice["token_ids"].as_array().cloned().unwrap_or_default());
            if !choice["finish_reason"].is_null() {
                last = Some(choice.clone());
            }
        }
    }
    let last = last.expect("a final chunk");
    assert_eq!(last["finish_reason"], "abort");
    let usage = &chunks.last().unwrap()["usage"];
    let generated = usage["completion_tokens"].as_u64().unwrap() as usize;
    assert_eq!(tokens.len(), generated);
    assert!((1..3000).contains(&generated), "aborted early: {generated}");
    // One row per token fed to the model: the prompt and every generated token but the last.
    let rows = routing_of(&last);
    assert_eq!(rows.shape, [20 + generated - 1, 6, 2]);
    // The rows are those of the same greedy request run to that length.
    let full = s.ok(
        "/v1/completions",
        &json!({"prompt": prompt, "max_tokens": generated, "temperature": 0, "ignore_eos": true,
                "return_token_ids": true}),
    );
    assert_eq!(full["choices"][0]["token_ids"], json!(tokens));
    assert_eq!(routing_of(&full["choices"][0]), rows);
}

#[test]
fn an_aborted_generate_returns_the_rows_it_computed() {
    let s = TestServer::start(test_config(MODEL));
    let ids = prompt_ids(16, 52);
    let body = json!({"input_ids": ids, "stream": true, "return_routed_experts": true,
                      "sampling_params": {"max_new_tokens": 3000, "temperature": 0,
                                          "ignore_eos": true}});
    let events = abort_after_first(&s, "/generate", &body, "data: ");
    let last = &events.last().expect("events")["meta_info"];
    assert_eq!(last["finish_reason"]["type"], "abort", "{last}");
    let generated = events.last().unwrap()["output_ids"].as_array().unwrap().len();
    assert!((1..3000).contains(&generated), "aborted early: {generated}");
    assert_eq!(last["routed_experts_shape"], json!([16 + generated - 1, 6, 2]));
    let rows = decode_raw_b64(last["routed_experts"].as_str().expect("rows, not null"), 6, 2);
    assert_eq!(rows.shape[0], 16 + generated - 1);
}

#[test]
fn an_openai_request_named_by_its_rid_is_aborted_by_it_as_sglang_does() {
    let s = TestServer::start(test_config(MODEL));
    let body = json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3000,
                      "temperature": 0, "ignore_eos": true, "stream": true, "rid": "rollout-7"});
    let mut stream = send_closing(s.addr, "/v1/chat/completions", &body);
    let seen = read_bytes_until(&mut stream, "\"content\":\"");
    // In flight: its id is taken.
    let again = s.post("/v1/chat/completions", &body).error(400, "invalid_request_error");
    assert_eq!(again["param"], "rid");
    assert_eq!(s.post("/abort_request", &json!({"rid": "rollout-7"})).status, 200);
    let chunks = read_rest(&mut stream, seen).sse_json();
    assert!(chunks.iter().all(|c| c["id"] == "rollout-7"), "{chunks:?}");
    let last = chunks.iter().rev().find(|c| !c["choices"][0]["finish_reason"].is_null());
    assert_eq!(last.unwrap()["choices"][0]["finish_reason"], "abort");
    // Ended, the id is free again; vLLM's request_id names the response after the route's
    // prefix.
    let short = json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2,
                       "rid": "rollout-7"});
    assert_eq!(s.ok("/v1/chat/completions", &short)["id"], "rollout-7");
    let named = json!({"prompt": "hi", "max_tokens": 2, "request_id": "abc"});
    assert_eq!(s.ok("/v1/completions", &named)["id"], "cmpl-abc");
    for (extra, param) in [
        (json!({"rid": ["a", "b"]}), "rid"),
        (json!({"rid": ""}), "rid"),
        (json!({"rid": "a", "request_id": "b"}), "request_id"),
    ] {
        let mut body = json!({"prompt": "hi", "max_tokens": 2});
        body.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
        let err = s.post("/v1/completions", &body).error(400, "invalid_request_error");
        assert_eq!(err["param"], param, "{extra}");
    }
}
