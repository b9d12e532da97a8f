//! Every route of the gateway over real HTTP against the real engine on the tiny golden
//! checkpoints: response shapes, streaming, `/generate`, the operational routes and client
//! disconnects.

mod common;

use std::time::{Duration, Instant};

use common::{TestServer, prompt_ids, routing_of, send_only, server, test_config};
use serde_json::{Value, json};

const MODEL: &str = "tiny_hybrid_default";

#[test]
fn models_lists_the_model_with_its_length_and_routing_layout() {
    let s = server(MODEL);
    let r = s.get("/v1/models");
    assert_eq!(r.status, 200);
    let body = r.json();
    assert_eq!(body["object"], "list");
    let model = &body["data"][0];
    assert_eq!(model["id"], MODEL);
    assert_eq!(model["object"], "model");
    assert_eq!(model["max_model_len"], 4096);
    assert_eq!(model["device"], "cpu");
    // `ME*EME`: six decoder layers, MoE at 1, 3 and 5; 8 experts, top 2.
    assert_eq!(
        model["routing"],
        json!({"num_layers": 6, "num_moe_layers": 3, "moe_layer_ids": [1, 3, 5],
               "num_experts": 8, "top_k": 2})
    );
}

#[test]
fn serve_runs_the_gateway_on_a_listener_bound_from_a_server_config() {
    let config = routed_server::ServerConfig { port: 0, ..Default::default() };
    let listener = config.bind().expect("bind");
    let addr = listener.local_addr().expect("addr");
    assert_ne!(addr.port(), 0);
    let handle = routed_runtime::Engine::start(test_config(MODEL)).expect("engine");
    std::thread::spawn(move || {
        actix_rt::System::new().block_on(routed_server::serve(handle, listener)).expect("serve")
    });
    // The socket is bound already: the connection waits in its backlog until the server runs.
    let r = common::request(addr, "GET", "/v1/models", None);
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["data"][0]["id"], MODEL);
}

#[test]
fn health_answers_ok_and_names_the_device() {
    let r = server(MODEL).get("/health");
    assert_eq!(r.status, 200);
    assert_eq!(r.json(), json!({"status": "ok", "device": "cpu"}));
}

#[test]
fn completions_answer_in_the_openai_shape_with_usage_and_routing() {
    let s = server(MODEL);
    let body = s.ok(
        "/v1/completions",
        &json!({"model": MODEL, "prompt": "Hello there", "max_tokens": 5, "temperature": 0,
                "ignore_eos": true}),
    );
    assert!(body["id"].as_str().is_some_and(|id| id.starts_with("cmpl-")), "{body}");
    assert_eq!(body["object"], "text_completion");
    assert_eq!(body["model"], MODEL);
    assert!(body["created"].as_u64().is_some());
    let choice = &body["choices"][0];
    assert_eq!(choice["index"], 0);
    assert!(choice["text"].is_string());
    assert_eq!(choice["finish_reason"], "length");
    assert_eq!(choice["logprobs"], Value::Null);
    let usage = &body["usage"];
    let prompt_tokens = usage["prompt_tokens"].as_u64().expect("prompt_tokens");
    assert!(prompt_tokens > 0);
    assert_eq!(usage["completion_tokens"], 5);
    assert_eq!(usage["total_tokens"].as_u64(), Some(prompt_tokens + 5));
    assert!(usage["prompt_tokens_details"]["cached_tokens"].is_u64());
    // Routing is on by default, over every decoder layer.
    let rows = routing_of(choice);
    assert_eq!(rows.shape, [prompt_tokens as usize + 4, 6, 2]);
    assert_eq!(body["routed_experts_meta"]["format"], "npy_b64");
}

#[test]
fn batched_prompts_and_n_are_indexed_prompt_major() {
    let s = server(MODEL);
    let (a, b) = (prompt_ids(7, 1), prompt_ids(9, 2));
    let body = s.ok(
        "/v1/completions",
        &json!({"prompt": [a, b], "n": 2, "max_tokens": 3, "temperature": 0, "ignore_eos": true,
                "return_token_ids": true}),
    );
    let choices = body["choices"].as_array().expect("choices");
    assert_eq!(choices.len(), 4);
    for (i, c) in choices.iter().enumerate() {
        assert_eq!(c["index"], i);
        let expected = if i < 2 { &a } else { &b };
        assert_eq!(c["prompt_token_ids"], json!(expected), "choice {i}");
        assert_eq!(c["token_ids"].as_array().map(Vec::len), Some(3));
        assert_eq!(routing_of(c).shape[0], expected.len() + 2);
    }
    assert_eq!(body["usage"]["prompt_tokens"], 16);
    assert_eq!(body["usage"]["completion_tokens"], 12);
    // A text batch works too.
    let body = s.ok("/v1/completions", &json!({"prompt": ["one", "two"], "max_tokens": 2}));
    assert_eq!(body["choices"].as_array().map(Vec::len), Some(2));
}

#[test]
fn choice_i_samples_with_seed_plus_i() {
    let s = server(MODEL);
    let prompt = prompt_ids(12, 3);
    let ask = |seed: u64, n: u32| {
        s.ok(
            "/v1/completions",
            &json!({"prompt": prompt, "n": n, "seed": seed, "temperature": 1.0, "max_tokens": 8,
                    "ignore_eos": true, "return_token_ids": true, "return_routed_experts": false}),
        )
    };
    let both = ask(41, 2);
    let second = ask(42, 1);
    assert_eq!(both["choices"][1]["token_ids"], second["choices"][0]["token_ids"]);
    assert_eq!(ask(41, 1)["choices"][0]["token_ids"], both["choices"][0]["token_ids"]);
}

#[test]
fn completion_logprobs_have_one_entry_per_token() {
    let s = server(MODEL);
    let body = s.ok(
        "/v1/completions",
        &json!({"prompt": prompt_ids(6, 4), "max_tokens": 4, "logprobs": 3, "temperature": 0,
                "ignore_eos": true}),
    );
    let lp = &body["choices"][0]["logprobs"];
    for key in ["tokens", "token_logprobs", "top_logprobs", "text_offset"] {
        assert_eq!(lp[key].as_array().map(Vec::len), Some(4), "{key}: {lp}");
    }
    for (v, top) in
        lp["token_logprobs"].as_array().unwrap().iter().zip(lp["top_logprobs"].as_array().unwrap())
    {
        assert!(v.as_f64().is_some_and(|v| v <= 0.0), "{lp}");
        let n = top.as_object().map_or(0, |m| m.len());
        assert!((1..=4).contains(&n), "{top}");
    }
}

#[test]
fn streamed_completions_equal_the_whole_answer_and_end_with_usage() {
    let s = server(MODEL);
    let request = json!({"prompt": "The quick brown fox", "max_tokens": 12, "temperature": 0,
                         "ignore_eos": true, "return_token_ids": true});
    let whole = s.ok("/v1/completions", &request);
    let mut streamed = request.clone();
    streamed["stream"] = json!(true);
    streamed["stream_options"] = json!({"include_usage": true});
    let r = s.post("/v1/completions", &streamed);
    assert_eq!(r.status, 200);
    assert!(r.header("content-type").is_some_and(|c| c.starts_with("text/event-stream")));
    let chunks = r.sse_json();
    let usage_chunk = chunks.last().expect("chunks");
    assert_eq!(usage_chunk["choices"], json!([]));
    assert_eq!(usage_chunk["usage"], whole["usage"]);
    let mut text = String::new();
    let mut ids = Vec::new();
    let mut finishes = Vec::new();
    for c in &chunks[..chunks.len() - 1] {
        assert_eq!(c["object"], "text_completion");
        assert_eq!(c["usage"], Value::Null);
        let choice = &c["choices"][0];
        text.push_str(choice["text"].as_str().expect("text"));
        ids.extend(choice["token_ids"].as_array().cloned().unwrap_or_default());
        if !choice["finish_reason"].is_null() {
            finishes.push(choice.clone());
        }
    }
    assert_eq!(text, whole["choices"][0]["text"].as_str().unwrap());
    assert_eq!(json!(ids), whole["choices"][0]["token_ids"]);
    assert_eq!(finishes.len(), 1);
    assert_eq!(finishes[0]["finish_reason"], "length");
    assert_eq!(finishes[0]["routed_experts"], whole["choices"][0]["routed_experts"]);
    assert_eq!(
        chunks[0]["choices"][0]["prompt_token_ids"],
        whole["choices"][0]["prompt_token_ids"]
    );
}

#[test]
fn continuous_usage_stats_count_each_choices_tokens_so_far() {
    let s = server(MODEL);
    let prompt = "The quick brown fox";
    for (path, body) in common::on_both_routes(
        &json!({"max_tokens": 6, "temperature": 1, "seed": 5, "n": 2, "ignore_eos": true,
                "return_token_ids": true, "stream": true,
                "stream_options": {"include_usage": true, "continuous_usage_stats": true}}),
        prompt,
        "hi",
    ) {
        let chunks = s.post(path, &body).sse_json();
        let (last, choices) = chunks.split_last().expect("chunks");
        let prompt_tokens = last["usage"]["prompt_tokens"].as_u64().unwrap();
        assert_eq!(last["usage"]["completion_tokens"], 12, "{path}: {last}");
        // Each chunk counts its own choice: the tokens it and the chunks before it carried.
        let mut sent = [0u64; 2];
        for c in choices {
            let choice = &c["choices"][0];
            let i = choice["index"].as_u64().unwrap() as usize;
            sent[i] += choice["token_ids"].as_array().map_or(0, |t| t.len() as u64);
            let usage = &c["usage"];
            assert_eq!(usage["prompt_tokens"], prompt_tokens, "{path}: {c}");
            assert_eq!(usage["completion_tokens"], sent[i], "{path}: {c}");
            assert_eq!(usage["total_tokens"], prompt_tokens + sent[i], "{path}: {c}");
        }
        assert_eq!(sent, [6, 6], "{path}");
        // Without include_usage, chunks carry no usage at all.
        let mut plain = body.clone();
        plain["stream_options"] = json!({"continuous_usage_stats": true});
        plain["stream_options"]["include_usage"] = json!(false);
        let chunks = s.post(path, &plain).sse_json();
        assert!(chunks.iter().all(|c| c.get("usage").is_none()), "{path}: {chunks:?}");
    }
}

#[test]
fn chat_completions_render_the_template_and_stream() {
    let s = server(MODEL);
    let request = json!({"model": MODEL, "messages": [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": [{"type": "text", "text": "Say hi"}]}],
        "max_tokens": 6, "temperature": 0, "ignore_eos": true, "logprobs": true, "top_logprobs": 2});
    let whole = s.ok("/v1/chat/completions", &request);
    assert!(whole["id"].as_str().is_some_and(|id| id.starts_with("chatcmpl-")));
    assert_eq!(whole["object"], "chat.completion");
    let choice = &whole["choices"][0];
    assert_eq!(choice["message"]["role"], "assistant");
    assert!(choice["message"]["content"].is_string());
    let content = choice["logprobs"]["content"].as_array().expect("logprobs.content");
    assert_eq!(content.len(), 6);
    assert_eq!(content[0]["top_logprobs"].as_array().map(Vec::len), Some(2));
    assert!(content[0]["bytes"].is_array());

    let mut streamed = request.clone();
    streamed["stream"] = json!(true);
    let chunks = s.post("/v1/chat/completions", &streamed).sse_json();
    assert_eq!(chunks[0]["object"], "chat.completion.chunk");
    assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
    let text: String =
        chunks.iter().filter_map(|c| c["choices"][0]["delta"]["content"].as_str()).collect();
    assert_eq!(text, choice["message"]["content"].as_str().unwrap());
    let last = chunks.last().unwrap();
    assert_eq!(last["choices"][0]["finish_reason"], "length");
    assert_eq!(last["choices"][0]["routed_experts"], choice["routed_experts"]);
    assert_eq!(last["routed_experts_meta"], whole["routed_experts_meta"]);
}

#[test]
fn chat_max_tokens_defaults_to_what_fits() {
    let mut config = test_config(MODEL);
    config.max_model_len = Some(40);
    let s = TestServer::shared("short", || config);
    let body = s.ok(
        "/v1/chat/completions",
        &json!({"messages": [{"role": "user", "content": "hi"}], "ignore_eos": true,
                "temperature": 0}),
    );
    let usage = &body["usage"];
    assert_eq!(usage["total_tokens"], 40, "{usage}");
    assert_eq!(body["choices"][0]["finish_reason"], "length");
}

#[test]
fn generate_answers_in_the_sglang_shape() {
    let s = server(MODEL);
    let ids = prompt_ids(10, 5);
    let body = s.ok(
        "/generate",
        &json!({"input_ids": ids, "sampling_params": {"max_new_tokens": 4, "temperature": 0,
                "ignore_eos": true}, "return_logprob": true, "return_routed_experts": true}),
    );
    assert_eq!(body["output_ids"].as_array().map(Vec::len), Some(4));
    assert!(body["text"].is_string());
    let meta = &body["meta_info"];
    assert_eq!(meta["prompt_tokens"], 10);
    assert_eq!(meta["completion_tokens"], 4);
    assert!(meta["cached_tokens"].is_u64());
    assert_eq!(meta["finish_reason"], json!({"type": "length", "matched": null}));
    // SGLang's `[logprob, token_id, text-or-null]` triples; no text unless asked.
    let triples = meta["output_token_logprobs"].as_array().expect("output_token_logprobs");
    assert_eq!(triples.len(), 4);
    for (t, id) in triples.iter().zip(body["output_ids"].as_array().unwrap()) {
        assert_eq!(t.as_array().map(Vec::len), Some(3), "{t}");
        assert!(t[0].as_f64().is_some_and(|lp| lp <= 0.0), "{t}");
        assert_eq!(&t[1], id);
        assert!(t[2].is_null(), "{t}");
    }
    assert!(meta.get("output_top_logprobs").is_none(), "{meta}");
    assert_eq!(meta["routed_experts_shape"], json!([13, 6, 2]));
    let raw = common::decode_raw_b64(meta["routed_experts"].as_str().unwrap(), 6, 2);
    // The same request on /v1/completions returns the same rows.
    let openai = s.ok(
        "/v1/completions",
        &json!({"prompt": ids, "max_tokens": 4, "temperature": 0, "ignore_eos": true,
                "return_token_ids": true}),
    );
    assert_eq!(openai["choices"][0]["token_ids"], body["output_ids"]);
    assert_eq!(routing_of(&openai["choices"][0]).ids, raw.ids);

    // Text in, streamed: cumulative events, the last one carries the routing.
    let events = s
        .post(
            "/generate",
            &json!({"text": "stream me", "stream": true,
                    "sampling_params": {"max_new_tokens": 5, "temperature": 0, "ignore_eos": true}}),
        )
        .sse_json();
    let last = events.last().expect("events");
    assert_eq!(last["output_ids"].as_array().map(Vec::len), Some(5));
    assert_eq!(last["meta_info"]["finish_reason"]["type"], "length");
    assert!(last["meta_info"]["routed_experts"].is_string());
    for e in &events[..events.len() - 1] {
        assert!(e["meta_info"]["finish_reason"].is_null());
        assert!(e["meta_info"].get("routed_experts").is_none());
    }
}

#[test]
fn metrics_render_the_engine_figures() {
    let s = server(MODEL);
    s.ok("/v1/completions", &json!({"prompt": prompt_ids(20, 6), "max_tokens": 2}));
    let r = s.get("/metrics");
    assert_eq!(r.status, 200);
    let text = r.text();
    for name in [
        "routed_prefill_tokens_computed_total",
        "routed_kv_blocks_total",
        "routed_requests_running",
        "routed_step_duration_seconds",
    ] {
        assert!(text.contains(name), "{name} missing from /metrics:\n{text}");
    }
}

#[test]
fn reset_prefix_cache_drops_cached_prompts() {
    let s = TestServer::shared("reset", || test_config(MODEL));
    let request = json!({"prompt": prompt_ids(40, 7), "max_tokens": 1});
    s.ok("/v1/completions", &request);
    let warm = s.ok("/v1/completions", &request);
    assert!(warm["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64() > Some(0), "{warm}");
    assert_eq!(s.ok("/reset_prefix_cache", &json!({})), json!({"reset": true}));
    let cold = s.ok("/v1/completions", &request);
    assert_eq!(cold["usage"]["prompt_tokens_details"]["cached_tokens"], 0, "{cold}");
}

/// Polls until the engine runs nothing and the gateway tracks nothing.
fn wait_until_idle(s: &TestServer) {
    let deadline = Instant::now() + Duration::from_secs(20);
    let rt = actix_rt::System::new();
    loop {
        let stats = rt.block_on(s.handle.stats()).expect("stats");
        if s.registry.is_empty() && stats.num_running == 0 && stats.num_waiting == 0 {
            return;
        }
        assert!(Instant::now() < deadline, "still busy: {stats:?}, {} tracked", s.registry.len());
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn a_client_that_disconnects_aborts_its_request() {
    let s = TestServer::shared("disconnect", || test_config(MODEL));
    let long = |stream: bool| {
        json!({"prompt": prompt_ids(8, 8), "max_tokens": 3000, "ignore_eos": true,
               "stream": stream})
    };
    let generate = json!({"input_ids": prompt_ids(8, 8),
                          "sampling_params": {"max_new_tokens": 3000, "ignore_eos": true}});
    for (k, (path, body)) in
        [("/v1/completions", long(false)), ("/v1/completions", long(true)), ("/generate", generate)]
            .into_iter()
            .enumerate()
    {
        let connection = send_only(s.addr, path, &body);
        let deadline = Instant::now() + Duration::from_secs(20);
        while s.registry.is_empty() {
            assert!(Instant::now() < deadline, "{path}: the request never started");
            std::thread::sleep(Duration::from_millis(5));
        }
        drop(connection);
        wait_until_idle(&s);
        // Thousands of tokens take seconds: the request was aborted, not finished.
        assert_eq!(s.registry.num_aborted(), k as u64 + 1, "{path}");
        assert_resources_released(&s, path);
    }
}

/// After an abort: every block is free or evictable, no live state slot is held, and the routing
/// rows held are at most those of the cached blocks (block 16, 3 MoE layers, top-2, one byte each).
fn assert_resources_released(s: &TestServer, path: &str) {
    let rt = actix_rt::System::new();
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let stats = rt.block_on(s.handle.stats()).expect("stats");
        let blocks_ok =
            stats.num_kv_blocks_free + stats.num_kv_blocks_evictable == stats.num_kv_blocks_total;
        let rows_ok = stats.routing_bytes_held <= stats.num_kv_blocks_cached * 16 * 3 * 2;
        if blocks_ok && rows_ok && stats.num_live_states_held == 0 {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{path}: resources still held after the abort: {stats:?}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn chat_echo_puts_the_last_message_before_the_answer_as_vllm_does() {
    let s = server(MODEL);
    // A partial answer continued: echo gives the whole message back.
    let base = json!({"messages": [{"role": "user", "content": "Say hi"},
                                   {"role": "assistant", "content": "Hi there"}],
                      "continue_final_message": true, "max_tokens": 5, "temperature": 0,
                      "ignore_eos": true, "n": 2});
    let plain = s.ok("/v1/chat/completions", &base);
    let mut echo = base.clone();
    echo["echo"] = json!(true);
    let echoed = s.ok("/v1/chat/completions", &echo);
    for i in 0..2 {
        let answer = plain["choices"][i]["message"]["content"].as_str().unwrap();
        let whole = format!("Hi there{answer}");
        assert_eq!(echoed["choices"][i]["message"]["content"], whole.as_str(), "{echoed}");
        assert_eq!(echoed["usage"], plain["usage"]);
        // Streamed: the echo in a chunk of its own after the role's, then the answer.
        let mut stream = echo.clone();
        stream["stream"] = json!(true);
        let chunks = s.post("/v1/chat/completions", &stream).sse_json();
        let deltas: Vec<&Value> = chunks
            .iter()
            .filter(|c| c["choices"][0]["index"] == i)
            .map(|c| &c["choices"][0]["delta"])
            .collect();
        assert_eq!(*deltas[0], json!({"role": "assistant", "content": ""}));
        assert_eq!(*deltas[1], json!({"content": "Hi there"}));
        let text: String = deltas.iter().filter_map(|d| d["content"].as_str()).collect();
        assert_eq!(text, whole);
    }
    // With a generation prompt after a user's message there is nothing to echo, and without
    // one the last message is echoed whatever its role.
    let hi = json!([{"role": "user", "content": "Say hi"}]);
    let ask = |extra: Value| {
        let mut body = json!({"messages": hi, "max_tokens": 3, "temperature": 0, "echo": true});
        body.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
        s.ok("/v1/chat/completions", &body)["choices"][0]["message"]["content"].clone()
    };
    let answer = ask(json!({"echo": false}));
    assert_eq!(ask(json!({})), answer);
    let open = ask(json!({"add_generation_prompt": false}));
    assert!(open.as_str().unwrap().starts_with("Say hi"), "{open}");
}

#[test]
fn a_messages_text_parts_reach_the_template_joined_by_newlines_as_vllm_joins_them() {
    let s = server(MODEL);
    let tokens = |content: Value| {
        let body = json!({"messages": [{"role": "user", "content": content}]});
        s.ok("/tokenize", &body)["tokens"].clone()
    };
    let parts = json!([{"type": "text", "text": "first"}, {"type": "text", "text": "second"}]);
    assert_eq!(tokens(parts), tokens(json!("first\nsecond")));
}
