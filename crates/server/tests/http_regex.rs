//! vLLM's `structured_outputs.regex` and `guided_regex` on both OpenAI routes, SGLang's
//! `sampling_params.regex` on `/generate`, and a JSON schema string's `pattern`: every answer
//! EOS ended is a text the pattern matches whole (checked here by hand, not by the engine's
//! regex), the others a prefix of one; a pattern the engine cannot follow is a 400 naming the
//! field. The tiny checkpoint writes none of these texts by itself.

mod common;

use common::{
    TestServer, answers, assert_completions_refused, count_whole_answers, streamed_content,
    test_config,
};
use serde_json::{Value, json};

const MODEL: &str = "tiny_hybrid_default";

/// An answer: yes or no, a count and a fruit.
const PATTERN: &str = r"(yes|no), [0-9]{1,3} (apples|pears)\.";

/// Whether [`PATTERN`] matches `text` whole, read without a regex engine.
fn matches(text: &str) -> bool {
    let Some(rest) = text.strip_prefix("yes, ").or_else(|| text.strip_prefix("no, ")) else {
        return false;
    };
    let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
    (1..=3).contains(&digits) && matches!(&rest[digits..], " apples." | " pears.")
}

/// Whether `text` can still become a match of [`PATTERN`], read without a regex engine.
fn is_prefix(text: &str) -> bool {
    let Some(rest) = ["yes, ", "no, "].iter().find_map(|w| text.strip_prefix(w)) else {
        return "yes, ".starts_with(text) || "no, ".starts_with(text);
    };
    let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
    let tail = &rest[digits..];
    digits <= 3
        && (tail.is_empty()
            || digits > 0 && [" apples.", " pears."].iter().any(|e| e.starts_with(tail)))
}

/// Checks one answer, and returns whether EOS ended it on a match.
fn check(text: &str, finish: &str, what: &str) -> bool {
    if finish == "stop" {
        assert!(matches(text), "{what}: {text:?}");
        return true;
    }
    assert!(is_prefix(text), "{what}: not a prefix of a match: {text:?}");
    false
}

#[test]
fn answers_match_the_regex_however_it_is_asked_for() {
    let s = TestServer::start(test_config(MODEL));
    // vLLM's fields, and SGLang's on its OpenAI routes.
    let openai = [
        ("structured_outputs", json!({"regex": PATTERN})),
        ("guided_regex", json!(PATTERN)),
        ("regex", json!(PATTERN)),
    ];
    let num_whole =
        count_whole_answers(&s, &openai, ("regex", json!(PATTERN)), ("Apples?", "Apples?"), check);
    assert!(num_whole > 0, "no answer ended on a match");
}

#[test]
fn an_answer_streamed_is_the_whole_ones() {
    let s = TestServer::start(test_config(MODEL));
    for seed in 0..2 {
        let body = json!({"messages": [{"role": "user", "content": "Apples?"}], "max_tokens": 24,
                          "temperature": 1.0, "seed": seed, "guided_regex": PATTERN});
        let whole = answers(&s.ok("/v1/chat/completions", &body)).remove(0).0;
        assert_eq!(streamed_content(&s, &body), whole, "seed {seed}");
    }
}

#[test]
fn a_schema_strings_pattern_is_matched_whole() {
    let s = TestServer::start(test_config(MODEL));
    let schema = json!({"type": "object", "additionalProperties": false, "required": ["answer"],
                        "properties": {"answer": {"type": "string", "pattern": PATTERN}}});
    let mut num_whole = 0;
    for seed in 0..4 {
        // Compact: the tiny checkpoint fills free whitespace until max_tokens.
        let body = json!({"prompt": "Apples?", "max_tokens": 48, "temperature": 1.0, "seed": seed,
                          "n": 2, "structured_outputs": {"json": schema,
                                                         "disable_any_whitespace": true}});
        for (text, finish) in answers(&s.ok("/v1/completions", &body)) {
            if finish != "stop" {
                continue;
            }
            let value: Value =
                serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}"));
            let answer = value["answer"].as_str().unwrap_or_else(|| panic!("{text}"));
            assert!(matches(answer), "seed {seed}: {text}");
            num_whole += 1;
        }
    }
    assert!(num_whole > 0, "no answer closed its value");
}

#[test]
fn patterns_the_engine_cannot_follow_are_refused_by_name() {
    let s = TestServer::start(test_config(MODEL));
    let cases = [
        ("guided_regex", json!("(yes"), "guided_regex", "invalid_value", "unclosed group"),
        ("guided_regex", json!(["a"]), "guided_regex", "invalid_type", "a string"),
        (
            "structured_outputs",
            json!({"regex": "a(?=b)"}),
            "structured_outputs.regex",
            "invalid_value",
            "look-around",
        ),
        (
            "structured_outputs",
            json!({"regex": "(a|b)*a(a|b){24}"}),
            "structured_outputs.regex",
            "invalid_value",
            "exceeded",
        ),
        (
            "structured_outputs",
            json!({"regex": "a", "choice": ["a"]}),
            "structured_outputs",
            "invalid_value",
            "give one of them",
        ),
    ];
    assert_completions_refused(&s, &cases);
    let mut both = json!({"prompt": "hi", "max_tokens": 2, "guided_regex": "a"});
    both["response_format"] = json!({"type": "json_object"});
    let error = s.post("/v1/completions", &both).error(400, "invalid_request_error");
    assert_eq!(error["param"], "response_format", "{error}");
    for (sampling, param) in [
        (json!({"regex": "(a"}), "sampling_params.regex"),
        (json!({"regex": "a", "json_schema": "{}"}), "sampling_params.regex"),
    ] {
        let mut sampling = sampling;
        sampling["max_new_tokens"] = json!(2);
        let body = json!({"input_ids": [1, 2, 3], "sampling_params": sampling});
        let error = s.post("/generate", &body).error(400, "invalid_request_error");
        assert_eq!(error["param"], param, "{error}");
    }
    assert_eq!(s.registry.len(), 0, "nothing ran");
}
