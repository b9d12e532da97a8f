//! Every bad input is a 4xx in the OpenAI error shape naming its field; overload is a 503; an
//! engine failure mid-stream is one error event and `[DONE]`.

mod common;

use common::{TestServer, prompt_ids, request, server, test_config};
use serde_json::{Value, json};

const MODEL: &str = "tiny_hybrid_default";

/// Asserts a 400 `invalid_request_error` whose `param` is `param`.
fn assert_400(s: &TestServer, path: &str, body: Value, param: &str) -> Value {
    let error = s.post(path, &body).error(400, "invalid_request_error");
    assert_eq!(error["param"], param, "{path} {body}: {error}");
    error
}

#[test]
fn malformed_json_and_wrong_types_are_400() {
    let s = server(MODEL);
    let r = request(s.addr, "POST", "/v1/completions", Some(b"{\"prompt\": \"x\""));
    let error = r.error(400, "invalid_request_error");
    assert_eq!(error["code"], "invalid_json");
    let r = request(s.addr, "POST", "/v1/chat/completions", Some(b"not json"));
    r.error(400, "invalid_request_error");
    let r = request(s.addr, "POST", "/v1/completions", Some(b"[1, 2]"));
    r.error(400, "invalid_request_error");
    let error = assert_400(
        &s,
        "/v1/completions",
        json!({"prompt": "x", "max_tokens": "many"}),
        "max_tokens",
    );
    assert_eq!(error["code"], "invalid_type");
    assert_400(&s, "/v1/completions", json!({"prompt": "x", "n": -1}), "n");
    assert_400(&s, "/v1/completions", json!({"prompt": "x", "stream": "yes"}), "stream");
    assert_400(&s, "/v1/completions", json!({"prompt": "x", "stop": 7}), "stop");
    assert_400(
        &s,
        "/v1/completions",
        json!({"prompt": "x", "stream": true, "stream_options": {"include_usage": 1}}),
        "stream_options.include_usage",
    );
    assert_400(&s, "/v1/chat/completions", json!({"messages": "hi"}), "messages");
    assert_400(
        &s,
        "/v1/chat/completions",
        json!({"messages": [{"content": "hi"}]}),
        "messages[0].role",
    );
    assert_400(
        &s,
        "/generate",
        json!({"input_ids": [1], "sampling_params": {"temperature": "hot"}}),
        "sampling_params.temperature",
    );
}

#[test]
fn missing_and_out_of_range_fields_are_400_naming_the_field() {
    let s = server(MODEL);
    let c = "/v1/completions";
    let error = assert_400(&s, c, json!({"max_tokens": 3}), "prompt");
    assert_eq!(error["code"], "missing_required_parameter");
    for (body, param) in [
        (json!({"prompt": ""}), "prompt"),
        (json!({"prompt": []}), "prompt"),
        (json!({"prompt": [[]]}), "prompt"),
        (json!({"prompt": [1, 100000]}), "prompt"),
        (json!({"prompt": [1, -3]}), "prompt"),
        (json!({"prompt": {"text": "x"}}), "prompt"),
        (json!({"prompt": "x", "n": 0}), "n"),
        (json!({"prompt": "x", "n": 129}), "n"),
        (json!({"prompt": "x", "max_tokens": 0}), "max_tokens"),
        (json!({"prompt": "x", "max_tokens": 4096}), "max_tokens"),
        (json!({"prompt": prompt_ids(4096, 0)}), "prompt"),
        (json!({"prompt": "x", "temperature": -0.5}), "temperature"),
        (json!({"prompt": "x", "temperature": -1}), "temperature"),
        (json!({"prompt": "x", "top_p": 0}), "top_p"),
        (json!({"prompt": "x", "top_p": 1.5}), "top_p"),
        (json!({"prompt": "x", "top_k": -2}), "top_k"),
        (json!({"prompt": "x", "logprobs": 21}), "logprobs"),
        (json!({"prompt": "x", "logprobs": 21, "echo": true}), "logprobs"),
        (json!({"prompt": "x", "prompt_logprobs": 21}), "prompt_logprobs"),
        (json!({"prompt": "x", "prompt_logprobs": -1}), "prompt_logprobs"),
        (json!({"prompt": "x", "min_tokens": 20, "max_tokens": 10}), "min_tokens"),
        (json!({"prompt": "x", "stop": ["ok", ""]}), "stop"),
        (json!({"prompt": "x", "suffix": "tail"}), "suffix"),
        (json!({"prompt": "x", "best_of": 3}), "best_of"),
        (json!({"prompt": "x", "use_beam_search": true}), "use_beam_search"),
        (json!({"prompt": "x", "logits_processors": ["mine"]}), "logits_processors"),
        (json!({"prompt": "x", "priority": -1}), "priority"),
        (json!({"prompt": "x", "prompt_embeds": "AAAA"}), "prompt_embeds"),
        (json!({"prompt": "x", "max_repetition_pattern_size": 4}), "max_repetition_pattern_size"),
        (json!({"prompt": "x", "repetition_min_count": 3}), "repetition_min_count"),
        (json!({"prompt": "x", "vllm_xargs": {"k": 1}}), "vllm_xargs"),
        (
            json!({"prompt": "x", "kv_transfer_params": {"do_remote_decode": true}}),
            "kv_transfer_params",
        ),
        (json!({"prompt": "x", "stream_options": {"include_usage": true}}), "stream_options"),
        (json!({"prompt": "x", "cache_salt": ""}), "cache_salt"),
        (json!({"prompt": "x", "routed_experts_format": "csv"}), "routed_experts_format"),
        (json!({"prompt": "x", "routed_experts_layers": "dense"}), "routed_experts_layers"),
        (json!({"prompt": "x", "routed_experts_layers": 1}), "routed_experts_layers"),
        (json!({"prompt": "x", "extra_key": ""}), "extra_key"),
    ] {
        assert_400(&s, c, body, param);
    }
    // Unserved fields holding their neutral values change nothing, and pass.
    s.ok(
        c,
        &json!({"prompt": "x", "max_tokens": 2, "use_beam_search": false,
                "logits_processors": null, "priority": 0, "prompt_embeds": null,
                "max_repetition_pattern_size": 0, "vllm_xargs": {}, "kv_transfer_params": null}),
    );
    let chat = "/v1/chat/completions";
    let hi = json!([{"role": "user", "content": "hi"}]);
    for (body, param) in [
        (json!({"messages": []}), "messages"),
        (json!({"messages": hi, "top_logprobs": 2}), "top_logprobs"),
        (json!({"messages": hi, "logprobs": true, "top_logprobs": 21}), "top_logprobs"),
        (json!({"messages": hi, "max_completion_tokens": 0}), "max_completion_tokens"),
        (json!({"messages": hi, "max_tokens": 5000}), "max_tokens"),
        (
            json!({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}),
            "messages[0].content",
        ),
        (json!({"messages": hi, "tools": [{"type": "function"}]}), "tools[0]"),
        (json!({"messages": hi, "echo": "yes"}), "echo"),
        (
            json!({"messages": hi, "continue_final_message": true, "add_generation_prompt": true}),
            "continue_final_message",
        ),
    ] {
        assert_400(&s, chat, body, param);
    }
    let g = "/generate";
    for (body, param) in [
        (json!({}), "text"),
        (json!({"text": "a", "input_ids": [1]}), "text"),
        (json!({"text": []}), "text"),
        (json!({"text": ["a", 2]}), "text"),
        (json!({"input_ids": [[1], 2]}), "input_ids"),
        (json!({"input_ids": [[1], []]}), "input_ids"),
        (json!({"input_ids": [[1], [2]], "rid": "one"}), "rid"),
        (json!({"input_ids": [[1], [2]], "rid": ["a", "a"]}), "rid"),
        (json!({"input_ids": [1], "sampling_params": {"n": 0}}), "sampling_params.n"),
        (json!({"input_ids": [1], "sampling_params": {"n": 129}}), "sampling_params.n"),
        (
            json!({"input_ids": [1], "sampling_params": {"max_new_tokens": 0}}),
            "sampling_params.max_new_tokens",
        ),
        (json!({"input_ids": [1], "sampling_params": {"top_k": -5}}), "sampling_params.top_k"),
        (json!({"input_ids": [1], "sampling_params": {"top_p": 0}}), "sampling_params.top_p"),
        (
            json!({"input_ids": [1], "sampling_params": {"temperature": -1}}),
            "sampling_params.temperature",
        ),
        (
            json!({"input_ids": [1], "sampling_params": {"min_new_tokens": 20, "max_new_tokens": 10}}),
            "sampling_params.min_new_tokens",
        ),
        (json!({"input_ids": [1], "sampling_params": {"stop": [""]}}), "sampling_params.stop"),
        (
            json!({"input_ids": [1], "sampling_params": {"stop_regex": "a?"}}),
            "sampling_params.stop_regex",
        ),
        (
            json!({"input_ids": [1], "return_logprob": true, "top_logprobs_num": 21}),
            "top_logprobs_num",
        ),
        (json!({"input_ids": [1], "routed_experts_start_len": 2}), "routed_experts_start_len"),
        (json!({"input_ids": [1], "top_logprobs_num": 21}), "top_logprobs_num"),
        (json!({"input_ids": [1], "return_text_in_logprobs": "yes"}), "return_text_in_logprobs"),
        (json!({"input_ids": [1], "input_embeds": [[0.5]]}), "input_embeds"),
        (json!({"input_ids": [1], "image_data": "x.png"}), "image_data"),
        (json!({"input_ids": [1], "video_data": ["v.mp4"]}), "video_data"),
        (json!({"input_ids": [1], "audio_data": "a.wav"}), "audio_data"),
        (json!({"input_ids": [1], "lora_path": "adapter"}), "lora_path"),
        (json!({"input_ids": [1], "custom_logit_processor": "{}"}), "custom_logit_processor"),
        (json!({"input_ids": [1], "return_hidden_states": true}), "return_hidden_states"),
    ] {
        assert_400(&s, g, body, param);
    }
    // SGLang's unserved fields holding their neutral values pass, as clients send them.
    s.ok(
        g,
        &json!({"input_ids": [1], "sampling_params": {"max_new_tokens": 1}, "image_data": null,
                "lora_path": null, "input_embeds": null, "return_hidden_states": false}),
    );
}

/// The sampling ranges are the engine's rules; their messages name the field as the route does.
#[test]
fn range_messages_name_the_field_as_the_route_does() {
    let s = server(MODEL);
    let vocab = s.handle.model_info().vocab_size;
    let hi = json!([{"role": "user", "content": "hi"}]);
    for (path, body, param, message) in [
        (
            "/generate",
            json!({"input_ids": [1], "sampling_params": {"top_p": 0}}),
            "sampling_params.top_p",
            "top_p must be in (0, 1], got 0".to_string(),
        ),
        (
            "/generate",
            json!({"input_ids": [1], "sampling_params": {"min_new_tokens": 20, "max_new_tokens": 10}}),
            "sampling_params.min_new_tokens",
            "min_new_tokens (20) must not exceed the maximum tokens (10)".into(),
        ),
        (
            "/generate",
            json!({"input_ids": [1], "top_logprobs_num": 21}),
            "top_logprobs_num",
            "top_logprobs_num must be between 0 and 20, got 21".into(),
        ),
        (
            "/v1/chat/completions",
            json!({"messages": hi, "logprobs": true, "top_logprobs": 21}),
            "top_logprobs",
            "top_logprobs must be between 0 and 20, got 21".into(),
        ),
        (
            "/v1/completions",
            json!({"prompt": "x", "temperature": -1}),
            "temperature",
            "temperature must be a number >= 0, got -1".into(),
        ),
        (
            "/v1/completions",
            json!({"prompt": "x", "logit_bias": {vocab.to_string(): 1}}),
            "logit_bias",
            format!("logit_bias token ids must be in [0, {vocab}), got {vocab}"),
        ),
    ] {
        let error = assert_400(&s, path, body, param);
        assert_eq!(error["message"], message, "{path}: {error}");
    }
}

#[test]
fn an_unknown_model_or_route_is_404_and_a_wrong_method_405() {
    let s = server(MODEL);
    let error = s
        .post("/v1/completions", &json!({"model": "gpt-4", "prompt": "x"}))
        .error(404, "not_found_error");
    assert_eq!(error["param"], "model");
    assert_eq!(error["code"], "model_not_found");
    s.post(
        "/v1/chat/completions",
        &json!({"model": "nope", "messages": [{"role": "user", "content": "x"}]}),
    )
    .error(404, "not_found_error");
    let error = s.get("/v1/nothing").error(404, "not_found_error");
    assert_eq!(error["code"], "route_not_found");
    s.post("/v2/completions", &json!({})).error(404, "not_found_error");
    let r = s.get("/v1/completions");
    assert_eq!(r.status, 405, "{}", r.text());
    assert_eq!(r.json()["error"]["code"], "method_not_allowed");
}

#[test]
fn a_request_that_can_never_fit_the_waiting_queue_is_400_naming_the_limit() {
    let s = TestServer::shared("small_queue", || {
        let mut config = test_config(MODEL);
        config.max_waiting_requests = 4;
        config
    });
    let c = "/v1/completions";
    for (body, param) in [
        (json!({"prompt": "x", "n": 5}), "n"),
        (json!({"prompt": ["a", "b", "c"], "n": 2}), "n"),
        (json!({"prompt": ["a", "b", "c", "d", "e"]}), "prompt"),
        (json!({"prompt": [[1], [2], [3]], "n": 2, "stream": true}), "n"),
    ] {
        let error = assert_400(&s, c, body, param);
        assert!(error["message"].as_str().unwrap().contains("--max-waiting-requests 4"), "{error}");
    }
    let chat = json!({"messages": [{"role": "user", "content": "hi"}], "n": 5});
    assert_400(&s, "/v1/chat/completions", chat, "n");
    // /generate's batches, with SGLang's names.
    let g = "/generate";
    for (body, param) in [
        (json!({"input_ids": [1], "sampling_params": {"n": 5}}), "sampling_params.n"),
        (json!({"text": ["a", "b", "c"], "sampling_params": {"n": 2}}), "sampling_params.n"),
        (json!({"input_ids": [[1], [2], [3], [4], [5]]}), "input_ids"),
    ] {
        let error = assert_400(&s, g, body, param);
        assert!(error["message"].as_str().unwrap().contains("--max-waiting-requests 4"), "{error}");
    }
    // A sampling_params list: one entry per prompt, the same n in each, errors naming the entry.
    for (body, param) in [
        (json!({"input_ids": [[1], [2]], "sampling_params": [{}]}), "sampling_params"),
        (json!({"input_ids": [1], "sampling_params": [{}, {}]}), "sampling_params"),
        (json!({"input_ids": [[1], [2]], "sampling_params": 3}), "sampling_params"),
        (
            json!({"input_ids": [[1], [2]], "sampling_params": [{"n": 2}, {"n": 1}]}),
            "sampling_params[1].n",
        ),
        (
            json!({"input_ids": [[1], [2]], "sampling_params": [{}, {"temperature": "hot"}]}),
            "sampling_params[1].temperature",
        ),
        (
            json!({"input_ids": [[1], [2]], "sampling_params": [{}, {"top_p": 2}]}),
            "sampling_params[1].top_p",
        ),
        (
            json!({"input_ids": [[1], [2]], "sampling_params": [{"max_new_tokens": 0}, {}]}),
            "sampling_params[0].max_new_tokens",
        ),
    ] {
        assert_400(&s, g, body, param);
    }
    // Four sequences fit an idle queue of four.
    let out = s.ok(c, &json!({"prompt": ["a", "b"], "n": 2, "max_tokens": 2}));
    assert_eq!(out["choices"].as_array().unwrap().len(), 4);
    let body = json!({"text": ["a", "b"], "sampling_params": {"n": 2, "max_new_tokens": 2}});
    assert_eq!(s.ok(g, &body).as_array().unwrap().len(), 4);
}

#[test]
fn a_queue_that_is_full_now_is_503() {
    let s = TestServer::shared("full_queue", || {
        let mut config = test_config(MODEL);
        // One running slot, one waiting place, and room for a request that runs for minutes.
        config.max_num_seqs = 1;
        config.max_waiting_requests = 1;
        config.max_model_len = Some(65536);
        config.num_kv_blocks = Some(4200);
        config
    });
    let long = json!({"prompt": "x", "max_tokens": 60000, "ignore_eos": true, "stream": true});
    let mut running = common::send_only(s.addr, "/v1/completions", &long);
    common::read_until(&mut running, "data: ");
    let waiting = common::send_only(s.addr, "/v1/completions", &json!({"prompt": "y"}));
    common::wait_until("the second request to be queued", || s.registry.len() == 2);
    let error = s.post("/v1/completions", &json!({"prompt": "z"})).error(503, "overloaded_error");
    assert_eq!(error["code"], "queue_full");
    s.post("/v1/completions", &json!({"prompt": "z", "stream": true}))
        .error(503, "overloaded_error");
    // Both clients leave; their requests are aborted and the queue serves again.
    drop((running, waiting));
    common::wait_until("the aborted requests to leave", || s.registry.is_empty());
    s.ok("/v1/completions", &json!({"prompt": "x", "max_tokens": 2}));
}

#[test]
fn a_model_without_a_chat_template_refuses_chat() {
    let dir = std::env::temp_dir().join(format!("routed-server-notemplate-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let source = common::checkpoint(MODEL);
    for entry in std::fs::read_dir(&source).expect("checkpoint") {
        let path = entry.expect("entry").path();
        let name = path.file_name().expect("name").to_owned();
        if name == "tokenizer_config.json" {
            let mut config: Value =
                serde_json::from_str(&std::fs::read_to_string(&path).expect("read")).expect("json");
            config.as_object_mut().expect("object").remove("chat_template");
            std::fs::write(dir.join(name), config.to_string()).expect("write");
        } else {
            std::fs::copy(&path, dir.join(name)).expect("copy");
        }
    }
    let mut config = test_config(MODEL);
    config.model = routed_runtime::ModelSource::Dir(dir.clone());
    let s = TestServer::start(config);
    let error = s
        .post("/v1/chat/completions", &json!({"messages": [{"role": "user", "content": "hi"}]}))
        .error(400, "invalid_request_error");
    assert_eq!(error["param"], "messages");
    assert!(error["message"].as_str().unwrap().contains("chat template"), "{error}");
    s.ok("/v1/completions", &json!({"prompt": "hi", "max_tokens": 2}));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn an_engine_failure_is_a_500_or_one_error_event_then_done() {
    let s = TestServer::shared("faults", || test_config(MODEL));
    let seed = routed_runtime::worker::faults::FAIL_SEED;
    let body = json!({"prompt": "boom", "seed": seed, "max_tokens": 4});
    let error = s.post("/v1/completions", &body).error(500, "internal_error");
    assert!(error["message"].as_str().unwrap().contains("injected"), "{error}");
    let mut streamed = body.clone();
    streamed["stream"] = json!(true);
    let r = s.post("/v1/completions", &streamed);
    assert_eq!(r.status, 200);
    let events = r.sse();
    assert_eq!(events.len(), 2, "{events:?}");
    let event: Value = serde_json::from_str(&events[0]).expect("json");
    assert_eq!(event["error"]["type"], "internal_error", "{event}");
    assert_eq!(events[1], "[DONE]");
    // The engine keeps serving.
    assert_eq!(s.get("/health").status, 200);
    s.ok("/v1/completions", &json!({"prompt": "fine", "max_tokens": 2}));
}

#[test]
fn a_text_that_cannot_fit_is_refused_before_it_is_encoded() {
    let s = server(MODEL);
    // 16 MiB of text: the tokenizer's bound (13 bytes per token at most for this vocabulary)
    // already says it cannot fit 4096 tokens, so it is refused without encoding it.
    let text = "the quick brown fox. ".repeat(800_000);
    let messages = json!([{"role": "user", "content": text}]);
    for (path, body, param) in [
        ("/v1/completions", json!({"prompt": text}), "prompt"),
        ("/v1/completions", json!({"prompt": ["hi", text]}), "prompt"),
        ("/v1/chat/completions", json!({"messages": messages}), "messages"),
        ("/generate", json!({"text": text}), "text"),
        ("/tokenize", json!({"prompt": text}), "prompt"),
    ] {
        let error = assert_400(&s, path, body, param);
        let message = error["message"].as_str().unwrap();
        assert!(message.contains("encodes to at least") && message.contains("4096"), "{message}");
    }
    // A text the bound lets through is encoded and checked exactly, as before.
    let error = assert_400(&s, "/v1/completions", json!({"prompt": "a ".repeat(5000)}), "prompt");
    assert!(error["message"].as_str().unwrap().contains("the prompt has"), "{error}");
}

#[test]
fn a_body_that_stalls_mid_upload_is_408_and_disconnected() {
    use std::io::{Read, Write};
    let gateway = routed_server::ServerConfig {
        body_read_timeout: std::time::Duration::from_secs(1),
        ..routed_server::ServerConfig::default()
    };
    let s = TestServer::start_with(test_config(MODEL), gateway);
    let body = json!({"prompt": "hello", "max_tokens": 2}).to_string();
    let mut stream = std::net::TcpStream::connect(s.addr).unwrap();
    let head = format!(
        "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\n\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes()).unwrap();
    stream.write_all(&body.as_bytes()[..body.len() / 2]).unwrap();
    // The rest never comes. The watchdog on the read stops a server that never answers.
    stream.set_read_timeout(Some(common::WATCHDOG)).unwrap();
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw).expect("the server answers and closes (watchdog)");
    let text = String::from_utf8_lossy(&raw);
    assert!(text.starts_with("HTTP/1.1 408"), "{text}");
    assert!(text.contains("\"code\":\"body_timeout\""), "{text}");
    // The server keeps serving whole bodies.
    s.ok("/v1/completions", &json!({"prompt": "hello", "max_tokens": 2}));
}
