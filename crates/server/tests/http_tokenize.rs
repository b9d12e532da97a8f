//! `POST /tokenize` and `POST /detokenize` as vLLM serves them: the completion form (`prompt`),
//! the chat form (`messages` through the template), token strings, and the errors; and text
//! prompts on the generation routes encoded with the tokenizer's special tokens as vLLM and
//! SGLang encode them.

mod common;

use common::{TestServer, server, test_config};
use serde_json::{Value, json};

const MODEL: &str = "tiny_hybrid_default";

/// The vocabulary entry of each id, read from the checkpoint's `tokenizer.json` (added tokens
/// included): what transformers' `convert_ids_to_tokens` returns.
fn vocabulary_entries(ids: &[u64]) -> Vec<String> {
    let path = common::checkpoint(MODEL).join("tokenizer.json");
    let tokenizer: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let vocab = tokenizer["model"]["vocab"].as_object().expect("vocab");
    let added = tokenizer["added_tokens"].as_array().expect("added_tokens");
    ids.iter()
        .map(|&id| {
            let word = vocab.iter().find(|(_, v)| v.as_u64() == Some(id)).map(|(k, _)| k.clone());
            let special = added.iter().find(|t| t["id"].as_u64() == Some(id));
            word.or_else(|| special.and_then(|t| t["content"].as_str().map(str::to_owned)))
                .unwrap_or_else(|| panic!("id {id} is in no vocabulary"))
        })
        .collect()
}

fn ids_of(value: &Value) -> Vec<u64> {
    value.as_array().expect("ids").iter().map(|v| v.as_u64().expect("id")).collect()
}

#[test]
fn tokenize_a_prompt_as_vllm_does() {
    let s = server(MODEL);
    let prompt = "The experts route every token. vllm1";
    let body = s.ok("/tokenize", &json!({"model": MODEL, "prompt": prompt}));
    let tokens = ids_of(&body["tokens"]);
    assert_eq!(body["count"], tokens.len());
    assert_eq!(body["max_model_len"], 4096);
    assert_eq!(body["token_strs"], Value::Null);
    assert_eq!(body.as_object().map(|o| o.len()), Some(4), "{body}");
    // The same ids a completion of that prompt is computed from.
    let completion = s.ok(
        "/v1/completions",
        &json!({"prompt": prompt, "max_tokens": 1, "return_token_ids": true}),
    );
    assert_eq!(ids_of(&completion["choices"][0]["prompt_token_ids"]), tokens);
    // This tokenizer's post-processor adds no special tokens, so add_special_tokens changes
    // nothing here.
    let plain = s.ok("/tokenize", &json!({"prompt": prompt, "add_special_tokens": false}));
    assert_eq!(ids_of(&plain["tokens"]), tokens);
    // Token strings are the vocabulary entries (byte-level, `Ġ` for a space).
    let strs = s.ok("/tokenize", &json!({"prompt": prompt, "return_token_strs": true}));
    let got: Vec<String> = strs["token_strs"]
        .as_array()
        .expect("token_strs")
        .iter()
        .map(|v| v.as_str().unwrap().to_owned())
        .collect();
    assert_eq!(got, vocabulary_entries(&tokens));
    // Detokenize round-trips.
    let back = s.ok("/detokenize", &json!({"model": MODEL, "tokens": tokens}));
    assert_eq!(back, json!({"prompt": prompt}));
    // An empty prompt has no tokens.
    let empty = s.ok("/tokenize", &json!({"prompt": ""}));
    assert_eq!((empty["count"].as_u64(), empty["tokens"].clone()), (Some(0), json!([])));
}

#[test]
fn tokenize_chat_messages_through_the_template() {
    let s = server(MODEL);
    let conversation = json!([
        {"role": "user", "content": "Hi there!"},
        {"role": "assistant", "content": "Nice to meet you!"},
        {"role": "user", "content": "Can I ask a question?"}]);
    let chat = s.ok(
        "/v1/chat/completions",
        &json!({"messages": conversation, "max_tokens": 1, "return_token_ids": true}),
    );
    let with_prompt = s.ok("/tokenize", &json!({"messages": conversation}));
    let tokens = ids_of(&with_prompt["tokens"]);
    assert_eq!(tokens, ids_of(&chat["prompt_token_ids"]), "the chat route's prompt");
    let text = s.ok("/detokenize", &json!({"tokens": tokens}))["prompt"].clone();
    // Special tokens are kept on the way back, as transformers' decode does by default.
    let text = text.as_str().unwrap();
    assert!(text.starts_with("<|im_start|>user\nHi there!<|im_end|>\n"), "{text:?}");
    assert!(text.ends_with("<|im_start|>assistant\n"), "{text:?}");
    // Without the generation prompt, a prefix.
    let bare =
        s.ok("/tokenize", &json!({"messages": conversation, "add_generation_prompt": false}));
    let bare = ids_of(&bare["tokens"]);
    assert!(bare.len() < tokens.len() && tokens.starts_with(&bare));
    // continue_final_message leaves the last (assistant) message open.
    let mut open = conversation.as_array().unwrap().clone();
    open.push(json!({"role": "assistant", "content": "Sure,"}));
    let cont = s.ok(
        "/tokenize",
        &json!({"messages": open, "continue_final_message": true, "add_generation_prompt": false}),
    );
    let cont_text = s.ok("/detokenize", &json!({"tokens": cont["tokens"]}))["prompt"].clone();
    let cont_text = cont_text.as_str().unwrap();
    assert!(cont_text.ends_with("<|im_start|>assistant\nSure,"), "{cont_text:?}");
    assert!(cont_text.starts_with(text.trim_end_matches("<|im_start|>assistant\n")));
}

#[test]
fn tokenize_and_detokenize_refuse_bad_input_naming_the_field() {
    let s = server(MODEL);
    let hi = json!([{"role": "user", "content": "hi"}]);
    for (path, body, param) in [
        ("/tokenize", json!({}), "prompt"),
        ("/tokenize", json!({"prompt": [1, 2]}), "prompt"),
        ("/tokenize", json!({"prompt": "x", "messages": hi}), "messages"),
        ("/tokenize", json!({"messages": []}), "messages"),
        ("/tokenize", json!({"messages": "hi"}), "messages"),
        ("/tokenize", json!({"prompt": "x", "add_special_tokens": "no"}), "add_special_tokens"),
        (
            "/tokenize",
            json!({"messages": hi, "add_generation_prompt": true, "continue_final_message": true}),
            "continue_final_message",
        ),
        ("/tokenize", json!({"messages": hi, "tools": [{"type": "function"}]}), "tools[0]"),
        ("/tokenize", json!({"messages": hi, "chat_template": "{{ x }}"}), "chat_template"),
        ("/detokenize", json!({}), "tokens"),
        ("/detokenize", json!({"tokens": "abc"}), "tokens"),
        ("/detokenize", json!({"tokens": [1, -3]}), "tokens"),
        ("/detokenize", json!({"tokens": [100000]}), "tokens"),
    ] {
        let error = s.post(path, &body).error(400, "invalid_request_error");
        assert_eq!(error["param"], param, "{path} {body}: {error}");
    }
    for path in ["/tokenize", "/detokenize"] {
        let error = s
            .post(path, &json!({"model": "other", "prompt": "x", "tokens": [1]}))
            .error(404, "not_found_error");
        assert_eq!(error["param"], "model");
        let r = s.get(path);
        assert_eq!(r.status, 405, "{path}: {}", r.text());
    }
    // A prompt longer than the model is refused, as vLLM does.
    let short = TestServer::shared("short_tokenize", || {
        let mut config = test_config(MODEL);
        config.max_model_len = Some(8);
        config
    });
    let long = "one two three four five six seven eight nine ten eleven twelve";
    let error =
        short.post("/tokenize", &json!({"prompt": long})).error(400, "invalid_request_error");
    assert_eq!(error["param"], "prompt");
    assert_eq!(short.ok("/tokenize", &json!({"prompt": "one"}))["max_model_len"], 8);
}

/// The tiny checkpoint with a tokenizer that starts every encoded text with `<|im_start|>` (id
/// 1) when special tokens are added, as Llama's and Mixtral's tokenizers add a BOS.
fn with_a_bos(dir: &std::path::Path) -> std::path::PathBuf {
    let from = common::checkpoint(MODEL);
    for entry in std::fs::read_dir(&from).unwrap() {
        let entry = entry.unwrap();
        std::fs::copy(entry.path(), dir.join(entry.file_name())).unwrap();
    }
    let path = dir.join("tokenizer.json");
    let mut tokenizer: Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    tokenizer["post_processor"] = json!({
        "type": "TemplateProcessing",
        "single": [{"SpecialToken": {"id": "<|im_start|>", "type_id": 0}},
                   {"Sequence": {"id": "A", "type_id": 0}}],
        "pair": [{"Sequence": {"id": "A", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}}],
        "special_tokens": {"<|im_start|>": {"id": "<|im_start|>", "ids": [1], "tokens": ["<|im_start|>"]}}
    });
    std::fs::write(&path, tokenizer.to_string()).unwrap();
    dir.to_owned()
}

#[test]
fn text_prompts_get_the_tokenizers_special_tokens_as_vllm_and_sglang_add_them() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = test_config(MODEL);
    config.model = routed_runtime::ModelSource::Dir(with_a_bos(dir.path()));
    let s = TestServer::start(config);
    let text = "The experts route";
    let bare =
        ids_of(&s.ok("/tokenize", &json!({"prompt": text, "add_special_tokens": false}))["tokens"]);
    let with_bos = ids_of(&s.ok("/tokenize", &json!({"prompt": text}))["tokens"]);
    assert_eq!(with_bos, [&[1][..], &bare].concat(), "the tokenizer adds its BOS");
    let base = json!({"prompt": text, "max_tokens": 1, "return_token_ids": true,
                      "return_routed_experts": false});
    let prompt_ids =
        |body: &Value| ids_of(&s.ok("/v1/completions", body)["choices"][0]["prompt_token_ids"]);
    // `/v1/completions` encodes a text as `/tokenize` does (vLLM's default), or bare on request.
    assert_eq!(prompt_ids(&base), with_bos);
    let mut no_bos = base.clone();
    no_bos["add_special_tokens"] = json!(false);
    assert_eq!(prompt_ids(&no_bos), bare);
    // Token ids are taken as given.
    let mut ids = base.clone();
    ids["prompt"] = json!(bare);
    assert_eq!(prompt_ids(&ids), bare);
    // SGLang's `/generate` encodes `text` with the tokenizer's default, special tokens added.
    let generated = s.ok(
        "/generate",
        &json!({"text": text, "sampling_params": {"max_new_tokens": 1},
                                              "return_logprob": true, "logprob_start_len": 0}),
    );
    let scored = generated["meta_info"]["input_token_logprobs"].as_array().unwrap();
    let firsts: Vec<u64> = scored.iter().map(|t| t[1].as_u64().unwrap()).collect();
    assert_eq!(firsts, with_bos);
    // A chat's template writes its own markers: nothing is added unless asked (vLLM's default).
    let messages = json!([{"role": "user", "content": "hi"}]);
    let rendered = ids_of(&s.ok("/tokenize", &json!({"messages": messages}))["tokens"]);
    let chat = json!({"messages": messages, "max_tokens": 1, "return_token_ids": true,
                      "return_routed_experts": false});
    let chat_ids = |body: &Value| ids_of(&s.ok("/v1/chat/completions", body)["prompt_token_ids"]);
    assert_eq!(chat_ids(&chat), rendered);
    let mut added = chat.clone();
    added["add_special_tokens"] = json!(true);
    assert_eq!(chat_ids(&added), [&[1][..], &rendered].concat());
}
