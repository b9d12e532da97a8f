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

/// The whole answer's message and the streamed deltas' reasoning and content, concatenated.
fn answers(s: &TestServer) -> (Value, String, String) {
    let body = json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 8,
                      "temperature": 0, "ignore_eos": true});
    let whole = s.ok("/v1/chat/completions", &body)["choices"][0]["message"].clone();
    let mut stream = body.clone();
    stream["stream"] = json!(true);
    let chunks = s.post("/v1/chat/completions", &stream).sse_json();
    let field = |name: &str| -> String {
        chunks.iter().filter_map(|c| c["choices"][0]["delta"][name].as_str()).collect()
    };
    (whole, field("reasoning_content"), field("content"))
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
    let thinking = whole["reasoning_content"].as_str().expect("reasoning_content").to_owned();
    assert!(!thinking.is_empty());
    assert_eq!(whole["content"], Value::Null);
    assert_eq!((reasoning, content), (thinking, String::new()));
}

#[test]
fn qwen3_reads_an_answer_without_tags_as_all_content() {
    let (whole, reasoning, content) = answers(&reasoning_server(ReasoningParser::Qwen3));
    let text = whole["content"].as_str().expect("content").to_owned();
    assert!(!text.is_empty());
    assert_eq!(whole["reasoning_content"], Value::Null);
    assert!(whole.as_object().unwrap().contains_key("reasoning_content"));
    assert_eq!((reasoning, content), (String::new(), text));
}
