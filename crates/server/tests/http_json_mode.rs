//! `response_format: {"type": "json_object"}` on both OpenAI routes: every answer is a prefix of
//! one JSON object and an answer ended by EOS is a whole one, whole and streamed; the ways to ask
//! for a constraint that is not served are each a 400 naming the field. The tiny checkpoint
//! writes no JSON by itself (the same requests without the constraint are checked not to be),
//! so what holds is the constraint's doing.

mod common;

use common::{TestServer, answers, on_both_routes, streamed_content, test_config};
use routed_runtime::ModelSource;
use routed_server::{ReasoningParser, ServerConfig};
use routed_test_support::json_object_prefix;
use serde_json::{Value, json};

const MODEL: &str = "tiny_hybrid_default";

/// Whether `text` has whitespace outside its JSON strings.
fn whitespace_outside_strings(text: &str) -> bool {
    let (mut in_string, mut escaped) = (false, false);
    text.chars().any(|c| {
        let outside = !in_string && c.is_ascii_whitespace();
        match (in_string, escaped, c) {
            (true, true, _) => escaped = false,
            (true, false, '\\') => escaped = true,
            (_, false, '"') => in_string = !in_string,
            _ => {}
        }
        outside
    })
}

#[test]
fn answers_are_json_objects_or_their_prefixes_on_both_routes() {
    let s = TestServer::start(test_config(MODEL));
    let json_object = json!({"type": "json_object"});
    let (mut num_whole, mut num_loose, mut num_answers) = (0, 0, 0);
    for seed in 0..5 {
        let temperature = if seed == 0 { 0.0 } else { 1.0 };
        let sampling = json!({"max_tokens": 48, "temperature": temperature, "seed": seed, "n": 3,
                              "response_format": json_object});
        for (route, body) in on_both_routes(&sampling, "Answer in JSON:", "Answer in JSON.") {
            for (text, finish) in answers(&s.ok(route, &body)) {
                let whole = json_object_prefix(&text)
                    .unwrap_or_else(|| panic!("{route} seed {seed}: not JSON: {text:?}"));
                assert!(whole || finish != "stop", "{route} seed {seed}: stopped in {text:?}");
                num_whole += usize::from(whole);
                num_loose += usize::from(whitespace_outside_strings(&text));
                num_answers += 1;
            }
            let mut free = body.clone();
            free.as_object_mut().unwrap().remove("response_format");
            for (text, _) in answers(&s.ok(route, &free)) {
                assert_eq!(json_object_prefix(&text), None, "{route} seed {seed}: {text:?}");
            }
        }
    }
    assert!(num_whole > 0, "none of {num_answers} answers closed its object");
    assert!(num_loose > 0, "the loose form lets whitespace in");
    // vLLM's own spelling, and a backend named beside it, ask for the same.
    let body = json!({"prompt": "Answer in JSON:", "max_tokens": 16, "temperature": 0,
                      "structured_outputs": {"json_object": true, "disable_fallback": true},
                      "guided_decoding_backend": "xgrammar", "response_format": {"type": "text"}});
    let (text, _) = answers(&s.ok("/v1/completions", &body)).remove(0);
    assert!(json_object_prefix(&text).is_some(), "{text:?}");
    // Compact: no whitespace outside strings, where the loose answers above had plenty.
    for seed in 0..4 {
        let body = json!({"prompt": "Answer in JSON:", "max_tokens": 48, "temperature": 1.0, "seed": seed,
                          "response_format": {"type": "json_object"},
                          "structured_outputs": {"disable_any_whitespace": true}});
        let (text, _) = answers(&s.ok("/v1/completions", &body)).remove(0);
        assert!(json_object_prefix(&text).is_some(), "{text:?}");
        assert!(!whitespace_outside_strings(&text), "{text:?}");
    }
    // `{"type": "text"}` is no constraint.
    let body = json!({"prompt": "Answer in JSON:", "max_tokens": 8, "temperature": 0,
                      "response_format": {"type": "text"}});
    assert_eq!(json_object_prefix(answers(&s.ok("/v1/completions", &body))[0].0.as_str()), None);
}

#[test]
fn a_streamed_answer_is_the_whole_ones() {
    let s = TestServer::start(test_config(MODEL));
    for seed in 1..4 {
        let body = json!({"messages": [{"role": "user", "content": "JSON please"}], "max_tokens": 40,
                          "temperature": 1.0, "seed": seed, "response_format": {"type": "json_object"}});
        let whole = answers(&s.ok("/v1/chat/completions", &body)).remove(0).0;
        let streamed = streamed_content(&s, &body);
        assert_eq!(streamed, whole, "seed {seed}");
        assert!(json_object_prefix(&streamed).is_some(), "seed {seed}: {streamed:?}");
    }
}

#[test]
fn constraints_that_are_not_served_or_malformed_are_refused_by_name() {
    let s = TestServer::start(test_config(MODEL));
    let chat = json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4});
    let completion = json!({"prompt": "hi", "max_tokens": 4});
    for base in [&chat, &completion] {
        let route =
            if base.get("messages").is_some() { "/v1/chat/completions" } else { "/v1/completions" };
        for (field, value, param, code) in [
            ("response_format", json!({"type": "xml"}), "response_format.type", "invalid_value"),
            // A structural tag without its structures, or of a format that is not served.
            (
                "response_format",
                json!({"type": "structural_tag"}),
                "response_format",
                "invalid_type",
            ),
            (
                "response_format",
                json!({"type": "structural_tag", "format": {"type": "any_text"}}),
                "response_format.format.type",
                "unsupported_parameter",
            ),
            ("response_format", json!({}), "response_format.type", "missing_required_parameter"),
            ("response_format", json!("json_object"), "response_format", "invalid_type"),
            ("response_format", json!({"type": 1}), "response_format.type", "invalid_value"),
            (
                "structured_outputs",
                json!({"structural_tag": "{}"}),
                "structured_outputs.structural_tag",
                "invalid_type",
            ),
            ("structured_outputs", json!(true), "structured_outputs", "invalid_type"),
            (
                "guided_whitespace_pattern",
                json!(" "),
                "guided_whitespace_pattern",
                "unsupported_parameter",
            ),
        ] {
            let mut body = base.clone();
            body[field] = value;
            let error = s.post(route, &body).error(400, "invalid_request_error");
            assert_eq!(
                (error["param"].as_str(), error["code"].as_str()),
                (Some(param), Some(code)),
                "{route} {field}: {error}"
            );
        }
    }
    let body = json!({"input_ids": [1, 2, 3],
                      "sampling_params": {"max_new_tokens": 2, "structural_tag": "{}"}});
    let error = s.post("/generate", &body).error(400, "invalid_request_error");
    assert_eq!(error["param"], "sampling_params.structural_tag", "{error}");
}

/// The tiny checkpoint with two of its byte tokens (`#` and `$`, in no merge) turned into
/// `<think>` and `</think>`, as a reasoning model's vocabulary holds them: single, non-special
/// tokens the model can sample.
fn with_thinking_tags() -> (tempfile::TempDir, u32) {
    let dir = tempfile::tempdir().unwrap();
    let source = common::checkpoint(MODEL);
    for entry in std::fs::read_dir(&source).unwrap() {
        let entry = entry.unwrap();
        std::fs::copy(entry.path(), dir.path().join(entry.file_name())).unwrap();
    }
    let path = dir.path().join("tokenizer.json");
    let mut tokenizer: Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    let vocab = tokenizer["model"]["vocab"].as_object_mut().unwrap();
    let (start, end) = (vocab.remove("#").unwrap(), vocab.remove("$").unwrap());
    vocab.insert("<think>".into(), start.clone());
    vocab.insert("</think>".into(), end.clone());
    for (id, content) in [(start, "<think>"), (end.clone(), "</think>")] {
        tokenizer["added_tokens"].as_array_mut().unwrap().push(json!({
            "id": id, "content": content, "single_word": false, "lstrip": false,
            "rstrip": false, "normalized": false, "special": false}));
    }
    std::fs::write(&path, serde_json::to_vec(&tokenizer).unwrap()).unwrap();
    (dir, end.as_u64().unwrap() as u32)
}

#[test]
fn with_a_reasoning_parser_the_answer_after_the_thinking_is_constrained() {
    let (dir, end) = with_thinking_tags();
    let config = |dir: &std::path::Path| {
        let mut config = test_config(MODEL);
        config.model = ModelSource::Dir(dir.to_owned());
        config
    };
    // The end tag biased far above everything: free to be sampled while the model thinks, ruled
    // out once the answer is constrained.
    let body = json!({"messages": [{"role": "user", "content": "JSON please"}], "max_tokens": 24,
                      "temperature": 0, "response_format": {"type": "json_object"},
                      "logit_bias": {end.to_string(): 100}, "return_token_ids": true});
    let thinking = ServerConfig {
        reasoning_parser: Some(ReasoningParser::DeepseekR1),
        ..ServerConfig::default()
    };
    let s = TestServer::start_with(config(dir.path()), thinking);
    let choice = s.ok("/v1/chat/completions", &body)["choices"][0].clone();
    assert_eq!(choice["token_ids"][0], json!(end), "{choice}");
    let message = &choice["message"];
    // DeepSeek-R1's answers start in the thinking: the first token closes it (the bias), and the
    // rest is the constrained answer.
    assert_eq!(message["reasoning_content"], json!(""), "{message}");
    let content = message["content"].as_str().expect("content");
    assert_eq!(json_object_prefix(content).map(|_| ()), Some(()), "{content:?}");
    assert!(content.trim_start().starts_with('{'), "{content:?}");
    // Without a reasoning parser the whole answer is constrained: the tag cannot come first
    // (only inside a string, as any text can).
    let plain = TestServer::start(config(dir.path()));
    let out = plain.ok("/v1/chat/completions", &body);
    let content = out["choices"][0]["message"]["content"].as_str().unwrap().to_owned();
    assert_eq!(json_object_prefix(&content).map(|_| ()), Some(()), "{content:?}");
    assert_ne!(out["choices"][0]["token_ids"][0], json!(end), "{out}");
}
