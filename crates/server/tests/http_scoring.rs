//! Scoring a prompt over real HTTP: `echo` with `logprobs` on `/v1/completions` (the prompt's
//! text and logprobs first, as lm-eval's loglikelihood tasks read them), vLLM's
//! `prompt_logprobs` (its exact shape, on completions choices and chat responses), and how the
//! two agree with each other, with the generated tokens' logprobs and with a stream; vLLM's
//! `truncate_prompt_tokens`, which scores the prompt's end only.

mod common;

use common::{prompt_ids, server};
use serde_json::{Value, json};

const MODEL: &str = "tiny_hybrid_default";

fn with(body: &Value, extra: Value) -> Value {
    let mut b = body.clone();
    b.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
    b
}

fn floats(v: &Value) -> Vec<Option<f64>> {
    v.as_array().expect("array").iter().map(Value::as_f64).collect()
}

/// The text of one token, as the checkpoint's tokenizer decodes it.
fn token_text(id: u32) -> String {
    let tokenizer = routed_model::Tokenizer::from_dir(&common::checkpoint(MODEL)).unwrap();
    tokenizer.decode(&[id]).unwrap()
}

#[test]
fn echo_with_logprobs_scores_the_prompt_first() {
    let s = server(MODEL);
    let prompt = "The experts route every token";
    let base = json!({"prompt": prompt, "max_tokens": 3, "temperature": 0, "ignore_eos": true,
                      "logprobs": 2, "return_token_ids": true, "return_routed_experts": false});
    let plain = s.ok("/v1/completions", &base);
    let echoed = s.ok("/v1/completions", &with(&base, json!({"echo": true})));
    let (p, e) = (&plain["choices"][0], &echoed["choices"][0]);
    let echoed_ids = e["prompt_token_ids"].as_array().unwrap().clone();
    let n = echoed_ids.len();
    assert!(n > 2, "{e}");
    assert_eq!(e["text"], format!("{prompt}{}", p["text"].as_str().unwrap()));
    assert_eq!(e["token_ids"], p["token_ids"], "echo changes what is shown, not what is generated");
    let lp = &e["logprobs"];
    let tokens = lp["tokens"].as_array().unwrap();
    assert_eq!(tokens.len(), n + 3, "{lp}");
    for (i, id) in echoed_ids.iter().enumerate() {
        assert_eq!(tokens[i].as_str(), Some(token_text(id.as_u64().unwrap() as u32).as_str()));
    }
    // The first prompt token has no logprob (nothing predicts it), as in OpenAI and vLLM.
    let values = floats(&lp["token_logprobs"]);
    assert_eq!(values[0], None);
    assert_eq!(lp["top_logprobs"][0], Value::Null);
    assert!(values[1..].iter().all(|v| v.is_some_and(|v| v <= 0.0)), "{lp}");
    // The generated tokens' logprobs are those of the request without echo.
    assert_eq!(&values[n..], &floats(&p["logprobs"]["token_logprobs"])[..]);
    assert_eq!(
        lp["top_logprobs"].as_array().unwrap()[n..],
        p["logprobs"]["top_logprobs"].as_array().unwrap()[..]
    );
    // Each prompt token's map holds it and at most `logprobs` alternatives.
    for (i, top) in lp["top_logprobs"].as_array().unwrap().iter().enumerate().skip(1).take(n - 1) {
        let top = top.as_object().expect("a map");
        assert!((1..=3).contains(&top.len()), "{top:?}");
        assert_eq!(top[tokens[i].as_str().unwrap()].as_f64(), values[i], "position {i}");
    }
    // Text offsets run through the prompt's tokens and on into the completion.
    let offsets: Vec<u64> =
        lp["text_offset"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap()).collect();
    assert_eq!(offsets[0], 0);
    assert!(offsets.windows(2).all(|w| w[0] <= w[1]), "{offsets:?}");
    // vLLM shows the prompt logprobs the echo computed in the choice's `prompt_logprobs` too.
    let shown = e["prompt_logprobs"].as_array().expect("prompt_logprobs with echo and logprobs");
    assert_eq!(shown.len(), n);
    for i in 1..n {
        let id = echoed_ids[i].to_string();
        assert_eq!(shown[i][&id]["logprob"].as_f64(), values[i], "position {i}");
    }

    // Without logprobs, echo is the text alone.
    let text_only = s.ok("/v1/completions", &with(&base, json!({"echo": true, "logprobs": null})));
    assert_eq!(text_only["choices"][0]["text"], e["text"]);
    assert_eq!(text_only["choices"][0]["logprobs"], Value::Null);
    assert!(text_only["choices"][0].get("prompt_logprobs").is_none());

    // A token prompt echoes its decoded text; a batch echoes each prompt in its own choices.
    let ids = prompt_ids(6, 41);
    let decoded =
        s.ok("/detokenize", &json!({"tokens": ids}))["prompt"].as_str().unwrap().to_owned();
    let batch = s.ok(
        "/v1/completions",
        &json!({"prompt": [ids, prompt], "n": 2, "max_tokens": 2, "echo": true,
                "temperature": 0, "ignore_eos": true}),
    );
    let choices = batch["choices"].as_array().unwrap();
    assert_eq!(choices.len(), 4);
    for (i, c) in choices.iter().enumerate() {
        let want = if i < 2 { decoded.as_str() } else { prompt };
        assert!(c["text"].as_str().unwrap().starts_with(want), "choice {i}: {c}");
    }
}

#[test]
fn streamed_echo_adds_up_to_the_whole_answer() {
    let s = server(MODEL);
    for logprobs in [json!(1), Value::Null] {
        let body = json!({"prompt": "Stream the prompt back", "max_tokens": 5, "temperature": 0,
                          "ignore_eos": true, "echo": true, "logprobs": logprobs,
                          "return_routed_experts": false});
        let whole = s.ok("/v1/completions", &body);
        let chunks = s.post("/v1/completions", &with(&body, json!({"stream": true}))).sse_json();
        let mut text = String::new();
        let (mut tokens, mut values, mut offsets) = (vec![], vec![], vec![]);
        for c in &chunks {
            let choice = &c["choices"][0];
            text.push_str(choice["text"].as_str().unwrap());
            if let Some(lp) = choice["logprobs"].as_object() {
                tokens.extend(lp["tokens"].as_array().unwrap().iter().cloned());
                values.extend(lp["token_logprobs"].as_array().unwrap().iter().cloned());
                offsets.extend(lp["text_offset"].as_array().unwrap().iter().cloned());
            }
        }
        let want = &whole["choices"][0];
        assert_eq!(text, want["text"].as_str().unwrap(), "logprobs {logprobs}");
        if logprobs.is_null() {
            assert!(tokens.is_empty());
            continue;
        }
        assert_eq!(json!(tokens), want["logprobs"]["tokens"]);
        assert_eq!(json!(values), want["logprobs"]["token_logprobs"]);
        assert_eq!(json!(offsets), want["logprobs"]["text_offset"]);
    }
}

#[test]
fn prompt_logprobs_have_vllms_shape() {
    let s = server(MODEL);
    let ids = prompt_ids(10, 42);
    let base = json!({"prompt": ids, "max_tokens": 2, "temperature": 0, "ignore_eos": true,
                      "return_routed_experts": false});
    // The same prompt once without, so the scoring request could hit the prefix cache.
    assert!(s.ok("/v1/completions", &base)["choices"][0].get("prompt_logprobs").is_none());
    let body = s.ok("/v1/completions", &with(&base, json!({"prompt_logprobs": 3})));
    assert_eq!(body["usage"]["prompt_tokens_details"]["cached_tokens"], 0, "computes the prompt");
    let entries = body["choices"][0]["prompt_logprobs"].as_array().expect("prompt_logprobs");
    assert_eq!(entries.len(), ids.len());
    assert_eq!(entries[0], Value::Null, "the first prompt token has no logprob");
    for (p, entry) in entries.iter().enumerate().skip(1) {
        let map = entry.as_object().expect("a map from token id to logprob");
        // The prompt token, and the three most likely tokens (rank 1..=3) when it is not one.
        let own = &map[&ids[p].to_string()];
        assert!(own["logprob"].as_f64().is_some_and(|v| v <= 0.0), "{own}");
        assert_eq!(own["decoded_token"].as_str(), Some(token_text(ids[p]).as_str()));
        let own_rank = own["rank"].as_u64().expect("rank");
        assert!(own_rank >= 1);
        assert_eq!(map.len(), if own_rank <= 3 { 3 } else { 4 }, "position {p}: {entry}");
        let mut ranked: Vec<(u64, f64)> = map
            .values()
            .map(|v| (v["rank"].as_u64().unwrap(), v["logprob"].as_f64().unwrap()))
            .collect();
        ranked.sort_by_key(|r| r.0);
        let top_ranks: Vec<u64> = ranked.iter().map(|r| r.0).filter(|&r| r <= 3).collect();
        assert_eq!(top_ranks, [1, 2, 3], "position {p}: {entry}");
        assert!(ranked.windows(2).all(|w| w[0].1 >= w[1].1), "descending: {ranked:?}");
    }
    // 0 alternatives: the prompt token alone; the logprobs are the same.
    let alone = s.ok("/v1/completions", &with(&base, json!({"prompt_logprobs": 0})));
    for (p, entry) in alone["choices"][0]["prompt_logprobs"].as_array().unwrap().iter().enumerate()
    {
        if p == 0 {
            continue;
        }
        let key = ids[p].to_string();
        assert_eq!(entry.as_object().unwrap().len(), 1, "{entry}");
        assert_eq!(entry[&key], entries[p][&key], "position {p}");
    }
    // Chat carries them at the response level, as vLLM does: the choices share the prompt.
    let chat = s.ok(
        "/v1/chat/completions",
        &json!({"messages": [{"role": "user", "content": "Score me"}], "max_tokens": 2, "n": 2,
                "prompt_logprobs": 1, "return_token_ids": true}),
    );
    let chat_entries = chat["prompt_logprobs"].as_array().expect("prompt_logprobs");
    assert_eq!(chat_entries.len(), chat["prompt_token_ids"].as_array().unwrap().len());
    assert_eq!(chat_entries[0], Value::Null);
    assert!(chat_entries[1..].iter().all(Value::is_object));
    // Bad values name the field; a stream cannot carry them (0 is accepted there, as vLLM does).
    for bad in [
        json!({"prompt_logprobs": 21}),
        json!({"prompt_logprobs": -1}),
        json!({"prompt_logprobs": "all"}),
        json!({"prompt_logprobs": 2, "stream": true}),
    ] {
        let error = s
            .post("/v1/completions", &with(&base, bad.clone()))
            .error(400, "invalid_request_error");
        assert_eq!(error["param"], "prompt_logprobs", "{bad}");
    }
    let streamed =
        s.post("/v1/completions", &with(&base, json!({"prompt_logprobs": 0, "stream": true})));
    assert_eq!(streamed.status, 200, "{}", streamed.text());
}

/// The server's `max_model_len`, as `/v1/models` reports it.
fn max_model_len(s: &common::TestServer) -> usize {
    let models = s.get("/v1/models").json();
    models["data"][0]["max_model_len"].as_u64().expect("max_model_len") as usize
}

#[test]
fn truncate_prompt_tokens_keeps_the_prompts_end() {
    let s = server(MODEL);
    let ids = prompt_ids(40, 7);
    let base = json!({"max_tokens": 4, "temperature": 0, "ignore_eos": true, "logprobs": 1,
                      "echo": true, "return_token_ids": true, "return_routed_experts": false});
    // Truncated to its last 9 tokens, a prompt is answered as those 9 tokens are.
    let cut =
        s.ok("/v1/completions", &with(&base, json!({"prompt": ids, "truncate_prompt_tokens": 9})));
    let tail = s.ok("/v1/completions", &with(&base, json!({"prompt": ids[31..]})));
    assert_eq!(cut["usage"]["prompt_tokens"], 9, "{cut}");
    assert_eq!(cut["choices"][0]["prompt_token_ids"], json!(ids[31..]));
    for field in ["text", "token_ids", "logprobs"] {
        assert_eq!(cut["choices"][0][field], tail["choices"][0][field], "{field}");
    }
    // A text prompt is encoded whole, then cut; `echo` shows the text the model continued.
    let text = "The experts route every token to the ones it needs.";
    let whole = s.ok("/v1/completions", &with(&base, json!({"prompt": text})));
    let whole_ids = whole["choices"][0]["prompt_token_ids"].as_array().unwrap().clone();
    assert!(whole_ids.len() > 6, "{whole}");
    let cut =
        s.ok("/v1/completions", &with(&base, json!({"prompt": text, "truncate_prompt_tokens": 6})));
    let tail =
        s.ok("/v1/completions", &with(&base, json!({"prompt": whole_ids[whole_ids.len() - 6..]})));
    assert_eq!(cut["choices"][0], tail["choices"][0]);
    // A prompt shorter than the truncation is kept whole, its text as sent.
    let long = s.ok(
        "/v1/completions",
        &with(&base, json!({"prompt": text, "truncate_prompt_tokens": 500})),
    );
    assert_eq!(long["choices"][0], whole["choices"][0]);
    // A text longer than the model's context is served when it is truncated, refused when not.
    let len = max_model_len(&s);
    let huge = "route ".repeat(2 * len);
    let body = json!({"prompt": huge, "max_tokens": 2, "return_routed_experts": false});
    s.post("/v1/completions", &body).error(400, "invalid_request_error");
    let cut = s.ok("/v1/completions", &with(&body, json!({"truncate_prompt_tokens": 16})));
    assert_eq!(cut["usage"]["prompt_tokens"], 16, "{cut}");
    // A chat's rendered prompt is cut the same way.
    let chat = json!({"messages": [{"role": "user", "content": text}], "max_tokens": 2,
                      "truncate_prompt_tokens": 5, "return_routed_experts": false});
    let out = s.ok("/v1/chat/completions", &chat);
    assert_eq!(out["usage"]["prompt_tokens"], 5, "{out}");
    // As vLLM: -1 is max_model_len, which leaves the output no room; 0, -2 and more
    // than max_model_len are refused, naming the field.
    for (k, says) in [
        (json!(0), "must be an integer >= 1 or -1"),
        (json!(-2), "must be an integer >= 1 or -1"),
        (json!(len + 1), "is greater than max_model_len"),
        (json!("4"), "invalid type"),
    ] {
        let body = json!({"prompt": text, "truncate_prompt_tokens": k});
        let err = s.post("/v1/completions", &body).error(400, "invalid_request_error");
        assert_eq!(err["param"], "truncate_prompt_tokens", "{err}");
        assert!(err["message"].as_str().unwrap().contains(says), "{err}");
    }
    let all = json!({"prompt": huge, "truncate_prompt_tokens": -1, "max_tokens": 1});
    let err = s.post("/v1/completions", &all).error(400, "invalid_request_error");
    assert_eq!(err["param"], "prompt", "{err}");
    assert!(err["message"].as_str().unwrap().contains(&format!("the prompt has {len}")), "{err}");
}
