//! The routing-replay acceptance cases over HTTP, against the real engine on the tiny golden
//! checkpoints. The CPU engine is deterministic, so "equal" means exactly equal.
//!
//! Cases (numbered as in the routing replay acceptance list): 1 shape, 2 value validity,
//! 3 chat endpoint, 4 `max_tokens=1`, 5 disabled server, 6 per-request opt-out, 8 prefix-cache
//! hit, 9 full-prompt hit, 11 start offset, 14 `n > 1`, 17 finish reasons, 21 streaming,
//! 24 metadata, 25 encoding variants; and the layer axis: every decoder layer by default (vLLM's
//! and SGLang's layout), the MoE layers only on request.

mod common;

use std::collections::HashSet;

use common::{
    Rows, TestServer, decode_list, decode_npy_b64, decode_raw_b64, prompt_ids, routing_of, server,
    test_config,
};
use serde_json::{Value, json};

/// The checkpoints and their routing layout:
/// `(arch, num_layers, moe_layer_ids, num_experts, top_k)`.
const MODELS: [(&str, usize, [u32; 3], u32, usize); 3] = [
    ("tiny_hybrid_default", 6, [1, 3, 5], 8, 2),
    ("nemotron_h", 7, [1, 3, 6], 8, 2),
    ("qwen3_moe", 4, [0, 1, 3], 8, 2),
];

/// The embedded model's MoE layers (`ME*EME`).
const HYBRID_MOE: [u32; 3] = [1, 3, 5];

fn completion(s: &TestServer, body: Value) -> Value {
    s.ok("/v1/completions", &body)
}

fn token_ids(choice: &Value) -> Vec<u64> {
    choice["token_ids"].as_array().expect("token_ids").iter().map(|v| v.as_u64().unwrap()).collect()
}

/// Case 2 over the decoder-layer layout: in the MoE layers every id is below `num_experts` and no
/// layer of a row repeats an id; every other layer holds the fill value (0, as vLLM's buffer).
fn assert_valid(rows: &Rows, moe_layer_ids: &[u32], num_experts: u32) {
    let [n, layers, k] = rows.shape;
    for r in 0..n {
        for l in 0..layers {
            let ids = &rows.row(r)[l * k..(l + 1) * k];
            if !moe_layer_ids.contains(&(l as u32)) {
                assert!(ids.iter().all(|&id| id == 0), "row {r} non-MoE layer {l}: {ids:?}");
                continue;
            }
            assert!(ids.iter().all(|&id| id < num_experts), "row {r} layer {l}: {ids:?}");
            let distinct: HashSet<_> = ids.iter().collect();
            assert_eq!(distinct.len(), k, "row {r} layer {l} repeats an id: {ids:?}");
        }
    }
}

/// The MoE-only rows (`routed_experts_layers: "moe"`) that a decoder-layer array holds.
fn moe_only(rows: &Rows, moe_layer_ids: &[u32]) -> Vec<u32> {
    let k = rows.shape[2];
    (0..rows.shape[0])
        .flat_map(|r| {
            let row = rows.row(r);
            moe_layer_ids
                .iter()
                .flat_map(move |&l| row[l as usize * k..(l as usize + 1) * k].to_vec())
        })
        .collect()
}

#[test]
fn shape_validity_and_metadata_on_every_family() {
    for (arch, num_layers, moe_layer_ids, num_experts, top_k) in MODELS {
        let s = server(arch);
        // Case 24: the model endpoint reports the layout.
        let model = &s.get("/v1/models").json()["data"][0];
        let expected = json!({"num_layers": num_layers, "num_moe_layers": moe_layer_ids.len(),
                              "moe_layer_ids": moe_layer_ids, "num_experts": num_experts,
                              "top_k": top_k});
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
        // The layer axis is every decoder layer, as `num_hidden_layers` in the config.
        assert_eq!(rows.shape, [p + g - 1, num_layers, top_k], "{arch}");
        assert_eq!(rows.dtype, "|u1", "{arch}");
        assert_valid(&rows, &moe_layer_ids, num_experts);
        // Case 24: the response's metadata matches the model's and the array.
        let meta = &body["routed_experts_meta"];
        assert_eq!(meta["layers"], "all");
        assert_eq!(meta["num_layers"], routing["num_layers"]);
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
        // The compact layout holds the same ids, MoE layers only, in model order.
        let compact = completion(
            &s,
            json!({"prompt": prompt_ids(20, 11), "max_tokens": 16, "ignore_eos": true,
                    "temperature": 0, "routed_experts_layers": "moe"}),
        );
        let moe_rows = routing_of(&compact["choices"][0]);
        assert_eq!(moe_rows.shape, [p + g - 1, moe_layer_ids.len(), top_k], "{arch}");
        assert_eq!(moe_rows.ids, moe_only(&rows, &moe_layer_ids), "{arch}: moe layout");
        assert_eq!(compact["routed_experts_meta"]["layers"], "moe");
        assert_eq!(compact["routed_experts_meta"]["num_layers"], num_layers);
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
        let moe_layer_ids = if arch == "qwen3_moe" { [0, 1, 3] } else { HYBRID_MOE };
        assert_valid(&r2, &moe_layer_ids, 8);
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
        assert_valid(r, &HYBRID_MOE, 8);
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
    // Case 21, on both OpenAI routes, with n = 2: every chunk of a choice carries its
    // `routed_experts` key, `null` until the chunk with its `finish_reason`, which carries the
    // rows; the first such chunk carries `routed_experts_meta`.
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
        assert!(whole.get("sglext").is_none(), "{path}: sglext only when asked SGLang's way");
        body["stream"] = json!(true);
        let chunks = s.post(path, &body).sse_json();
        let mut carried = Vec::new();
        let mut metas = Vec::new();
        let mut nulls = [0usize; 2];
        for (k, chunk) in chunks.iter().enumerate() {
            for choice in chunk["choices"].as_array().unwrap() {
                let index = choice["index"].as_u64().unwrap() as usize;
                let r = choice.get("routed_experts").unwrap_or_else(|| {
                    panic!("{path}: a chunk without the routed_experts key: {chunk}")
                });
                if r.is_null() {
                    assert!(choice["finish_reason"].is_null(), "{path}: no rows at the end");
                    nulls[index] += 1;
                } else {
                    assert!(!choice["finish_reason"].is_null(), "{path}: rows before the end");
                    carried.push((index, r.clone()));
                }
            }
            if let Some(m) = chunk.get("routed_experts_meta") {
                metas.push((k, m.clone()));
            }
        }
        assert!(nulls.iter().all(|&n| n > 0), "{path}: {nulls:?} null chunks per choice");
        assert_eq!(carried.len(), 2, "{path}: one routing chunk per choice");
        for (index, r) in carried {
            assert_eq!(r, whole["choices"][index]["routed_experts"], "{path} choice {index}");
        }
        assert_eq!(metas.len(), 1, "{path}");
        assert_eq!(metas[0].1, whole["routed_experts_meta"]);
        let first_final = chunks.iter().position(|c| {
            c["choices"].as_array().unwrap().iter().any(|ch| !ch["finish_reason"].is_null())
        });
        assert_eq!(Some(metas[0].0), first_final, "{path}: meta rides the first final chunk");
    }
}

#[test]
fn sglang_clients_read_sglext_with_the_same_rows() {
    // SGLang's clients send `return_routed_experts: true` and read the response-level
    // `sglext.routed_experts`: base64 flat int32 of the first choice, decoder-layer layout.
    let s = server("tiny_hybrid_default");
    for (path, body) in [
        ("/v1/completions", json!({"prompt": prompt_ids(17, 20)})),
        ("/v1/chat/completions", json!({"messages": [{"role": "user", "content": "sglext"}]})),
    ] {
        let mut body = body;
        let fields = json!({"max_tokens": 5, "temperature": 0, "ignore_eos": true,
                            "return_routed_experts": true});
        body.as_object_mut().unwrap().extend(fields.as_object().unwrap().clone());
        let whole = s.ok(path, &body);
        let ext = whole["sglext"]["routed_experts"].as_str().expect("sglext.routed_experts");
        let choice_rows = routing_of(&whole["choices"][0]);
        let ext_rows = decode_raw_b64(ext, 6, 2);
        assert_eq!(
            (ext_rows.shape, &ext_rows.ids),
            (choice_rows.shape, &choice_rows.ids),
            "{path}"
        );
        // With the compact layout asked for, sglext follows it too.
        let mut moe = body.clone();
        moe["routed_experts_layers"] = json!("moe");
        let compact = s.ok(path, &moe);
        let ext = decode_raw_b64(compact["sglext"]["routed_experts"].as_str().unwrap(), 3, 2);
        assert_eq!(ext.ids, moe_only(&choice_rows, &HYBRID_MOE), "{path}: moe sglext");
        // Streamed: one chunk with no choices carries sglext, after every choice ended.
        body["stream"] = json!(true);
        let chunks = s.post(path, &body).sse_json();
        let with_ext: Vec<&Value> = chunks.iter().filter(|c| c.get("sglext").is_some()).collect();
        assert_eq!(with_ext.len(), 1, "{path}");
        assert_eq!(with_ext[0]["choices"], json!([]));
        assert_eq!(with_ext[0]["sglext"], whole["sglext"], "{path}: streamed sglext");
        let ext_at = chunks.iter().position(|c| c.get("sglext").is_some()).unwrap();
        let last_final = chunks.iter().rposition(|c| {
            c["choices"].as_array().unwrap().iter().any(|ch| !ch["finish_reason"].is_null())
        });
        assert!(Some(ext_at) > last_final, "{path}: sglext after the final choice chunk");
    }
}

#[test]
fn every_encoding_decodes_to_the_same_array() {
    // Case 25, in both layer layouts.
    let s = server("tiny_hybrid_default");
    let ask = |format: &str, layers: &str| {
        completion(
            &s,
            json!({"prompt": prompt_ids(25, 19), "max_tokens": 9, "temperature": 0,
                    "ignore_eos": true, "routed_experts_format": format,
                    "routed_experts_layers": layers}),
        )
    };
    for (layers, num_layers) in [("all", 6), ("moe", 3)] {
        let npy_body = ask("npy_b64", layers);
        let npy_b64 = npy_body["choices"][0]["routed_experts"].as_str().unwrap().to_owned();
        let npy = decode_npy_b64(&npy_b64);
        let raw_body = ask("raw_b64_int32", layers);
        assert_eq!(raw_body["routed_experts_meta"]["dtype"], "int32");
        assert_eq!(raw_body["routed_experts_meta"]["format"], "raw_b64_int32");
        assert_eq!(raw_body["routed_experts_meta"]["layers"], layers);
        let raw_b64 = raw_body["choices"][0]["routed_experts"].as_str().unwrap().to_owned();
        let raw = decode_raw_b64(&raw_b64, num_layers, 2);
        let list = decode_list(&ask("list", layers)["choices"][0]["routed_experts"]);
        assert_eq!(npy.shape, [33, num_layers, 2], "{layers}");
        assert_eq!((raw.shape, &raw.ids), (npy.shape, &npy.ids), "{layers}");
        assert_eq!((list.shape, &list.ids), (npy.shape, &npy.ids), "{layers}");
        // Sizes: 4/3 of the payload, plus a header of at most 128 bytes for `.npy`.
        let elements = 33 * num_layers * 2;
        let b64_len = |bytes: usize| bytes.div_ceil(3) * 4;
        assert_eq!(raw_b64.len(), b64_len(elements * 4));
        assert!(npy_b64.len() >= b64_len(elements) && npy_b64.len() <= b64_len(elements + 128));
    }
}
