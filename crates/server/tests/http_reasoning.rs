//! A chat answer's reasoning split off as vLLM's `--reasoning-parser` splits it. The tiny
//! checkpoint writes no `<think>` tags, so `deepseek_r1` (whose answers start in the thinking)
//! reads its whole answer as reasoning and `qwen3` its whole answer as content, whole and
//! streamed alike. (Texts with the tags are split in the crate's unit tests.)

mod common;

use common::{TestServer, test_config};
use routed_server::{ReasoningParser, ServerConfig};
use serde_json::{Value, json};

const MODEL: &str = "tiny_hybrid_default";

fn reasoning_server(parser: ReasoningParser) -> TestServer {
    let server = ServerConfig { reasoning_parser: Some(parser), ..ServerConfig::default() };
    TestServer::start_with(test_config(MODEL), server)
}

/// The whole answer's message and the streamed deltas' reasoning and content, concatenated;
/// `extra` fields join the request.
fn answers_with(s: &TestServer, extra: Value) -> (Value, String, String) {
    let mut body = json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 8,
                          "temperature": 0, "ignore_eos": true});
    body.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
    let whole = s.ok("/v1/chat/completions", &body)["choices"][0]["message"].clone();
    // vLLM's name and SGLang's (older vLLM's) for the same text.
    assert_eq!(whole["reasoning"], whole["reasoning_content"], "{whole}");
    let mut stream = body.clone();
    stream["stream"] = json!(true);
    let chunks = s.post("/v1/chat/completions", &stream).sse_json();
    let field = |name: &str| -> String {
        chunks.iter().filter_map(|c| c["choices"][0]["delta"][name].as_str()).collect()
    };
    assert_eq!(field("reasoning"), field("reasoning_content"));
    (whole, field("reasoning"), field("content"))
}

fn answers(s: &TestServer) -> (Value, String, String) {
    answers_with(s, json!({}))
}

#[test]
fn deepseek_r1_reads_an_answer_without_tags_as_all_reasoning() {
    let s = reasoning_server(ReasoningParser::DeepseekR1);
    // SGLang's server info names the parsers.
    let info = s.get("/server_info").json();
    assert_eq!(
        (&info["reasoning_parser"], &info["tool_call_parser"]),
        (&json!("deepseek_r1"), &Value::Null)
    );
    let (whole, reasoning, content) = answers(&s);
    let thinking = whole["reasoning"].as_str().expect("reasoning").to_owned();
    assert!(!thinking.is_empty());
    assert_eq!(whole["content"], Value::Null);
    assert_eq!((reasoning, content), (thinking.clone(), String::new()));
    // SGLang's `separate_reasoning: false` leaves the answer whole, as content.
    let (whole, reasoning, content) = answers_with(&s, json!({"separate_reasoning": false}));
    assert_eq!(whole["content"].as_str(), Some(thinking.as_str()));
    assert!(whole.get("reasoning").is_none() && whole.get("reasoning_content").is_none());
    assert_eq!((reasoning, content), (String::new(), thinking.clone()));
    // vLLM's `include_reasoning: false` drops it, whole and streamed.
    let (whole, reasoning, content) = answers_with(&s, json!({"include_reasoning": false}));
    assert_eq!((&whole["reasoning"], &whole["content"]), (&Value::Null, &Value::Null));
    assert_eq!((reasoning, content), (String::new(), String::new()));
}

#[test]
fn qwen3_reads_an_answer_without_tags_as_all_content() {
    let (whole, reasoning, content) = answers(&reasoning_server(ReasoningParser::Qwen3));
    let text = whole["content"].as_str().expect("content").to_owned();
    assert!(!text.is_empty());
    assert_eq!(whole["reasoning"], Value::Null);
    assert!(whole.as_object().unwrap().contains_key("reasoning"));
    assert!(whole.as_object().unwrap().contains_key("reasoning_content"));
    assert_eq!((reasoning, content), (String::new(), text));
}
