//! The routing-replay acceptance cases over HTTP, against the real engine on the tiny golden
//! checkpoints. The CPU engine is deterministic, so "equal" means exactly equal.
//!
//! Cases (numbered as in the routing replay acceptance list): 1 shape, 2 value validity,
//! 3 chat endpoint, 4 `max_tokens=1`, 5 disabled server, 6 per-request opt-out, 8 prefix-cache
//! hit, 9 full-prompt hit, 11 start offset, 14 `n > 1`, 17 finish reasons, 21 streaming,
//! 24 metadata, 25 encoding variants.

mod common;

use std::collections::HashSet;

use common::{
    Rows, TestServer, decode_list, decode_npy_b64, decode_raw_b64, prompt_ids, routing_of, server,
    test_config,
};
use serde_json::{Value, json};

/// The checkpoints and their routing layout: `(arch, moe_layer_ids, num_experts, top_k)`.
const MODELS: [(&str, [u32; 3], u32, usize); 3] = [
    ("tiny_hybrid_default", [1, 3, 5], 8, 2),
    ("nemotron_h", [1, 3, 6], 8, 2),
    ("qwen3_moe", [0, 1, 3], 8, 2),
];

fn completion(s: &TestServer, body: Value) -> Value {
    s.ok("/v1/completions", &body)
}

fn token_ids(choice: &Value) -> Vec<u64> {
    choice["token_ids"].as_array().expect("token_ids").iter().map(|v| v.as_u64().unwrap()).collect()
}

/// Case 2: every id is below `num_experts` and no layer of a row repeats an id.
fn assert_valid(rows: &Rows, num_experts: u32) {
    let [n, layers, k] = rows.shape;
    for r in 0..n {
        for l in 0..layers {
            let ids = &rows.row(r)[l * k..(l + 1) * k];
            assert!(ids.iter().all(|&id| id < num_experts), "row {r} layer {l}: {ids:?}");
            let distinct: HashSet<_> = ids.iter().collect();
            assert_eq!(distinct.len(), k, "row {r} layer {l} repeats an id: {ids:?}");
        }
    }
}

#[test]
fn shape_validity_and_metadata_on_every_family() {
    for (arch, moe_layer_ids, num_experts, top_k) in MODELS {
        let s = server(arch);
        // Case 24: the model endpoint reports the layout.
        let model = &s.get("/v1/models").json()["data"][0];
        let layers = moe_layer_ids.len();
        let expected = json!({"num_moe_layers": layers, "moe_layer_ids": moe_layer_ids,
                              "num_experts": num_experts, "top_k": top_k});
        assert_eq!(model["routing"], expected, "{arch}");
        let routing = model["routing"].clone();
        // Case 1: 20-token prompt, 16 tokens, EOS ignored.
        let body = completion(
            &s,
            json!({"prompt": prompt_ids(20, 11), "max_tokens": 16, "ignore_eos": true,
                    "temperature": 0, "return_token_ids": true}),
        );
        let choice = &body["choices"][0];
        let (p, g) =
            (body["usage"]["prompt_tokens"].as_u64().unwrap() as usize, token_ids(choice).len());
        assert_eq!((p, g), (20, 16));
        let rows = routing_of(choice);
        let layers = routing["num_moe_layers"].as_u64().unwrap() as usize;
        assert_eq!(rows.shape, [p + g - 1, layers, top_k], "{arch}");
        assert_eq!(rows.dtype, "|u1", "{arch}");
        assert_valid(&rows, num_experts);
        // Case 24: the response's metadata matches the model's and the array.
        let meta = &body["routed_experts_meta"];
        assert_eq!(meta["num_moe_layers"], routing["num_moe_layers"]);
        assert_eq!(meta["moe_layer_ids"], routing["moe_layer_ids"]);
        assert_eq!(meta["num_experts"], routing["num_experts"]);
        assert_eq!(meta["top_k"], routing["top_k"]);
        assert_eq!(meta["dtype"], "uint8");
        assert_eq!(meta["start"], 0);
        // Case 4: max_tokens=1 gives one row per prompt token.
        let one = completion(&s, json!({"prompt": prompt_ids(20, 11), "max_tokens": 1}));
        let one_rows = routing_of(&one["choices"][0]);
        assert_eq!(one_rows.shape[0], 20);
        assert_eq!(one_rows.ids, rows.rows(0, 20), "{arch}: prompt rows");
    }
}

#[test]
fn chat_rows_cover_the_templated_prompt_and_completion() {
    // Case 3.
    for (arch, ..) in MODELS {
        let s = server(arch);
        let body = s.ok(
            "/v1/chat/completions",
            &json!({"messages": [{"role": "user", "content": "Tell me about experts."}],
                    "max_tokens": 7, "temperature": 0, "ignore_eos": true, "return_token_ids": true}),
        );
        let choice = &body["choices"][0];
        let prompt = choice["prompt_token_ids"].as_array().expect("prompt_token_ids").len();
        assert_eq!(body["prompt_token_ids"], choice["prompt_token_ids"]);
        assert_eq!(routing_of(choice).shape[0], prompt + token_ids(choice).len() - 1, "{arch}");
    }
}

#[test]
fn a_server_without_capture_refuses_routing_and_returns_none() {
    // Case 5.
    let s = TestServer::shared("no_capture", || {
        let mut config = test_config("tiny_hybrid_default");
        config.enable_routing_capture = false;
        config
    });
    let error = s
        .post("/v1/completions", &json!({"prompt": "x", "return_routed_experts": true}))
        .error(400, "invalid_request_error");
    assert_eq!(error["param"], "return_routed_experts");
    assert!(error["message"].as_str().unwrap().contains("--enable-return-routed-experts"));
    s.post(
        "/v1/chat/completions",
        &json!({"messages": [{"role": "user", "content": "x"}], "return_routed_experts": true}),
    )
    .error(400, "invalid_request_error");
    s.post("/generate", &json!({"text": "x", "return_routed_experts": true}))
        .error(400, "invalid_request_error");
    let body = completion(&s, json!({"prompt": "x", "max_tokens": 2}));
    assert!(body["choices"][0].get("routed_experts").is_none(), "{body}");
    assert!(body.get("routed_experts_meta").is_none(), "{body}");
    let body = s.ok("/generate", &json!({"text": "x", "sampling_params": {"max_new_tokens": 2}}));
    assert!(body["meta_info"].get("routed_experts").is_none(), "{body}");
}

#[test]
fn opting_out_in_a_concurrent_pair_changes_nothing_but_the_routing() {
    // Case 6: two identical requests at once, one without routing.
    let s = server("tiny_hybrid_default");
    let request = |routing: bool| {
        json!({"prompt": prompt_ids(30, 12), "max_tokens": 12, "temperature": 0,
               "ignore_eos": true, "return_token_ids": true, "return_routed_experts": routing})
    };
    let (with, without) = std::thread::scope(|scope| {
        let a = scope.spawn(|| completion(&s, request(true)));
        let b = scope.spawn(|| completion(&s, request(false)));
        (a.join().expect("a"), b.join().expect("b"))
    });
    assert!(with["choices"][0]["routed_experts"].is_string());
    assert!(without["choices"][0].get("routed_experts").is_none(), "{without}");
    assert!(without.get("routed_experts_meta").is_none());
    assert_eq!(with["choices"][0]["text"], without["choices"][0]["text"]);
    assert_eq!(with["choices"][0]["token_ids"], without["choices"][0]["token_ids"]);
}

#[test]
fn prefix_cache_hits_return_the_original_rows() {
    for arch in ["tiny_hybrid_default", "qwen3_moe"] {
        let s = TestServer::shared(&format!("cache_{arch}"), || test_config(arch));
        // Case 8: a 64-token prefix with two different suffixes.
        let prefix = prompt_ids(64, 13);
        let with_suffix = |salt: u32| {
            let mut p = prefix.clone();
            p.extend(prompt_ids(9, salt));
            json!({"prompt": p, "max_tokens": 6, "temperature": 0, "ignore_eos": true,
                   "return_token_ids": true})
        };
        let first = completion(&s, with_suffix(14));
        let second = completion(&s, with_suffix(15));
        let cached = second["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64().unwrap();
        assert!(cached >= 64, "{arch}: cached_tokens {cached}");
        let (r1, r2) = (routing_of(&first["choices"][0]), routing_of(&second["choices"][0]));
        assert_eq!(r1.rows(0, 64), r2.rows(0, 64), "{arch}: prefix rows");
        assert_eq!(r2.shape[0], 73 + token_ids(&second["choices"][0]).len() - 1);
        assert_valid(&r2, 8);
        // The same request on a server without prefix caching returns the same rows.
        let cold = TestServer::shared(&format!("nocache_{arch}"), || {
            let mut config = test_config(arch);
            config.enable_prefix_caching = false;
            config
        });
        let uncached = completion(&cold, with_suffix(15));
        assert_eq!(uncached["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
        assert_eq!(routing_of(&uncached["choices"][0]), r2, "{arch}: cached vs computed");

        // Case 9: the same prompt twice.
        let again = completion(&s, with_suffix(14));
        assert!(again["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64() >= Some(64));
        assert_eq!(routing_of(&again["choices"][0]), r1, "{arch}: full-prompt hit");
        assert_eq!(again["choices"][0]["token_ids"], first["choices"][0]["token_ids"]);
    }
}

#[test]
fn start_offsets_return_the_tail_of_the_full_rows() {
    // Case 11.
    let s = server("tiny_hybrid_default");
    let prompt = prompt_ids(18, 16);
    let p = prompt.len();
    let ask = |extra: Value| {
        let mut body = json!({"prompt": prompt, "max_tokens": 5, "temperature": 0,
                              "ignore_eos": true});
        body.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
        s.post("/v1/completions", &body)
    };
    let full = routing_of(&ask(json!({})).json()["choices"][0]);
    assert_eq!(full, routing_of(&ask(json!({"routed_experts_start_len": 0})).json()["choices"][0]));
    let total = p + 5 - 1;
    for start in [0, 1, p / 2, p] {
        for field in ["routed_experts_start_len", "routed_experts_prompt_start"] {
            let body = ask(json!({field: start})).json();
            let rows = routing_of(&body["choices"][0]);
            assert_eq!(rows.shape[0], total - start, "{field}={start}");
            assert_eq!(rows.ids, full.rows(start, total), "{field}={start}");
            assert_eq!(body["routed_experts_meta"]["start"], start);
        }
    }
    let both = ask(json!({"routed_experts_start_len": 3, "routed_experts_prompt_start": 3}));
    assert_eq!(routing_of(&both.json()["choices"][0]).shape[0], total - 3);
    for bad in [
        json!({"routed_experts_start_len": p + 1}),
        json!({"routed_experts_prompt_start": p + 1}),
        json!({"routed_experts_start_len": -1}),
        json!({"routed_experts_start_len": 1, "routed_experts_prompt_start": 2}),
    ] {
        let error = ask(bad.clone()).error(400, "invalid_request_error");
        let param = error["param"].as_str().unwrap();
        assert!(param.starts_with("routed_experts_"), "{bad}: {error}");
    }
}

#[test]
fn n_choices_share_their_prompt_rows() {
    // Case 14.
    let s = server("tiny_hybrid_default");
    let body = completion(
        &s,
        json!({"prompt": prompt_ids(21, 17), "n": 4, "temperature": 1.0, "seed": 7,
                "max_tokens": 10, "return_token_ids": true}),
    );
    let choices = body["choices"].as_array().unwrap();
    assert_eq!(choices.len(), 4);
    let rows: Vec<Rows> = choices.iter().map(routing_of).collect();
    for (c, r) in choices.iter().zip(&rows) {
        assert_eq!(r.shape[0], 21 + token_ids(c).len() - 1);
        assert_eq!(r.rows(0, 21), rows[0].rows(0, 21));
        assert_valid(r, 8);
    }
    let distinct: HashSet<Vec<u64>> = choices.iter().map(token_ids).collect();
    assert!(distinct.len() > 1, "four samples at temperature 1 should not all agree");
}

#[test]
fn every_finish_reason_keeps_rows_and_ids_consistent() {
    // Case 17.
    let s = server("tiny_hybrid_default");
    let check = |body: &Value, reason: &str| {
        let choice = &body["choices"][0];
        assert_eq!(choice["finish_reason"], reason, "{body}");
        let p = body["usage"]["prompt_tokens"].as_u64().unwrap() as usize;
        let g = token_ids(choice).len();
        assert_eq!(body["usage"]["completion_tokens"].as_u64(), Some(g as u64));
        assert_eq!(routing_of(choice).shape[0], p + g - 1, "{reason}: {body}");
        choice.clone()
    };
    let base = json!({"prompt": prompt_ids(5, 29), "max_tokens": 24, "temperature": 0,
                      "return_token_ids": true});
    let with = |extra: Value| {
        let mut b = base.clone();
        b.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
        completion(&s, b)
    };
    // This prompt reaches EOS (id 2) after 21 tokens under greedy decoding.
    let eos = check(&with(json!({})), "stop");
    let ids = token_ids(&eos);
    assert_eq!(ids.len(), 21);
    assert_eq!(ids.last(), Some(&2));
    let length = check(&with(json!({"max_tokens": 8})), "length");
    assert_eq!(token_ids(&length), ids[..8]);
    let stop_token = check(&with(json!({"stop_token_ids": [ids[5]]})), "stop");
    assert_eq!(token_ids(&stop_token), ids[..6]);
    assert_eq!(stop_token["stop_reason"], ids[5]);
    // A stop string taken from the middle of the greedy text: the text is cut before it, and
    // the ids and rows still cover every generated token.
    let full = with(json!({"ignore_eos": true, "max_tokens": 16}));
    let text = full["choices"][0]["text"].as_str().unwrap().to_owned();
    let stop: String = text.chars().skip(text.chars().count() / 2).take(2).collect();
    let cut = check(&with(json!({"stop": [stop], "ignore_eos": true, "max_tokens": 16})), "stop");
    assert_eq!(cut["stop_reason"], json!(stop));
    let kept = cut["text"].as_str().unwrap();
    assert!(text.starts_with(kept) && !kept.contains(&stop), "{kept:?} / {text:?} / {stop:?}");
}

#[test]
fn streamed_routing_arrives_once_and_equals_the_whole_answer() {
    // Case 21, on both OpenAI routes, with n = 2.
    let s = server("tiny_hybrid_default");
    for (path, body) in [
        ("/v1/completions", json!({"prompt": prompt_ids(19, 18)})),
        ("/v1/chat/completions", json!({"messages": [{"role": "user", "content": "stream"}]})),
    ] {
        let mut body = body;
        let fields = json!({"n": 2, "max_tokens": 6, "temperature": 0.8, "seed": 3,
                            "ignore_eos": true});
        body.as_object_mut().unwrap().extend(fields.as_object().unwrap().clone());
        let whole = s.ok(path, &body);
        body["stream"] = json!(true);
        let chunks = s.post(path, &body).sse_json();
        let mut carried = Vec::new();
        let mut metas = Vec::new();
        for (k, chunk) in chunks.iter().enumerate() {
            for choice in chunk["choices"].as_array().unwrap() {
                if let Some(r) = choice.get("routed_experts") {
                    assert!(!choice["finish_reason"].is_null(), "{path}: routing before the end");
                    carried.push((choice["index"].as_u64().unwrap() as usize, r.clone()));
                }
            }
            if let Some(m) = chunk.get("routed_experts_meta") {
                metas.push((k, m.clone()));
            }
        }
        assert_eq!(carried.len(), 2, "{path}: one routing chunk per choice");
        for (index, r) in carried {
            assert_eq!(r, whole["choices"][index]["routed_experts"], "{path} choice {index}");
        }
        assert_eq!(metas.len(), 1, "{path}");
        assert_eq!(metas[0].1, whole["routed_experts_meta"]);
    }
}

#[test]
fn every_encoding_decodes_to_the_same_array() {
    // Case 25.
    let s = server("tiny_hybrid_default");
    let ask = |format: &str| {
        completion(
            &s,
            json!({"prompt": prompt_ids(25, 19), "max_tokens": 9, "temperature": 0,
                    "ignore_eos": true, "routed_experts_format": format}),
        )
    };
    let npy_body = ask("npy_b64");
    let npy_b64 = npy_body["choices"][0]["routed_experts"].as_str().unwrap().to_owned();
    let npy = decode_npy_b64(&npy_b64);
    let raw_body = ask("raw_b64_int32");
    assert_eq!(raw_body["routed_experts_meta"]["dtype"], "int32");
    assert_eq!(raw_body["routed_experts_meta"]["format"], "raw_b64_int32");
    let raw_b64 = raw_body["choices"][0]["routed_experts"].as_str().unwrap().to_owned();
    let raw = decode_raw_b64(&raw_b64, 3, 2);
    let list = decode_list(&ask("list")["choices"][0]["routed_experts"]);
    assert_eq!(npy.shape, [33, 3, 2]);
    assert_eq!((raw.shape, &raw.ids), (npy.shape, &npy.ids));
    assert_eq!((list.shape, &list.ids), (npy.shape, &npy.ids));
    // Sizes: 4/3 of the payload, plus a header of at most 128 bytes for `.npy`.
    let elements = 33 * 3 * 2;
    let b64_len = |bytes: usize| bytes.div_ceil(3) * 4;
    assert_eq!(raw_b64.len(), b64_len(elements * 4));
    assert!(npy_b64.len() >= b64_len(elements) && npy_b64.len() <= b64_len(elements + 128));
}
