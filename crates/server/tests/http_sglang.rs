//! `/generate` in SGLang's shapes, over real HTTP against the real engine: logprob triples, top
//! alternatives and the logprobs of named tokens (`token_ids_logprob`), the layer axis of `meta_info.routed_experts`, and `cache_salt` / `extra_key`
//! as cache namespaces.

mod common;

use common::{TestServer, decode_raw_b64, prompt_ids, routing_of, server, test_config};
use serde_json::{Value, json};

const MODEL: &str = "tiny_hybrid_default";

fn generate(s: &TestServer, body: Value) -> Value {
    s.ok("/generate", &body)
}

/// The text of one token, as the checkpoint's tokenizer decodes it.
fn token_text(id: u64) -> String {
    let tokenizer = routed_model::Tokenizer::from_dir(&common::checkpoint(MODEL)).unwrap();
    tokenizer.decode(&[id as u32]).unwrap()
}

#[test]
fn logprobs_are_sglang_triples_with_top_alternatives() {
    let s = server(MODEL);
    let ids = prompt_ids(12, 21);
    let body = generate(
        &s,
        json!({"input_ids": ids, "return_logprob": true, "top_logprobs_num": 3,
               "return_text_in_logprobs": true, "return_routed_experts": false,
               "sampling_params": {"max_new_tokens": 5, "temperature": 0, "ignore_eos": true}}),
    );
    let meta = &body["meta_info"];
    let output_ids: Vec<u64> =
        body["output_ids"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap()).collect();
    let triples = meta["output_token_logprobs"].as_array().expect("output_token_logprobs");
    let tops = meta["output_top_logprobs"].as_array().expect("output_top_logprobs");
    assert_eq!((triples.len(), tops.len()), (5, 5), "{meta}");
    // The same request on /v1/completions gives the same logprobs.
    let openai = s.ok(
        "/v1/completions",
        &json!({"prompt": ids, "max_tokens": 5, "temperature": 0, "ignore_eos": true,
                "logprobs": 3, "return_routed_experts": false}),
    );
    let lps = &openai["choices"][0]["logprobs"]["token_logprobs"];
    for (i, (t, top)) in triples.iter().zip(tops).enumerate() {
        let [lp, id, text] = t.as_array().unwrap().as_slice() else { panic!("{t}") };
        assert_eq!(id.as_u64(), Some(output_ids[i]));
        assert_eq!(lp.as_f64(), lps[i].as_f64(), "token {i}");
        // Text: the decoded token, as SGLang's detokenizer gives it.
        assert_eq!(text.as_str(), Some(token_text(output_ids[i]).as_str()), "{t}");
        let top = top.as_array().unwrap();
        assert_eq!(top.len(), 3, "{top:?}");
        let values: Vec<f64> = top.iter().map(|e| e[0].as_f64().unwrap()).collect();
        assert!(values.windows(2).all(|w| w[0] >= w[1]), "descending: {values:?}");
        // Greedy: the best alternative is the sampled token.
        assert_eq!(top[0][1], *id, "token {i}");
        assert_eq!(top[0][0], *lp, "token {i}");
        assert!(top.iter().all(|e| e[2].is_string()));
    }
    // Without return_text_in_logprobs the third element is null; without top_logprobs_num there
    // is no output_top_logprobs.
    let plain = generate(
        &s,
        json!({"input_ids": ids, "return_logprob": true,
               "sampling_params": {"max_new_tokens": 5, "temperature": 0, "ignore_eos": true}}),
    );
    let plain = &plain["meta_info"];
    assert!(plain["output_token_logprobs"].as_array().unwrap().iter().all(|t| t[2].is_null()));
    assert!(plain.get("output_top_logprobs").is_none(), "{plain}");
}

#[test]
fn input_logprobs_start_at_logprob_start_len() {
    let s = server(MODEL);
    let ids = prompt_ids(12, 22);
    let ask = |extra: Value| {
        let mut body = json!({"input_ids": ids, "return_logprob": true, "return_routed_experts": false,
                              "sampling_params": {"max_new_tokens": 3, "temperature": 0,
                                                  "ignore_eos": true}});
        body.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
        body
    };
    let body = generate(
        &s,
        ask(
            json!({"logprob_start_len": 0, "top_logprobs_num": 2, "return_text_in_logprobs": true}),
        ),
    );
    let meta = &body["meta_info"];
    let input = meta["input_token_logprobs"].as_array().expect("input_token_logprobs");
    let tops = meta["input_top_logprobs"].as_array().expect("input_top_logprobs");
    assert_eq!((input.len(), tops.len()), (12, 12), "{meta}");
    // SGLang's triples over the prompt; the first has no logprob, and no alternatives.
    assert_eq!(input[0], json!([null, ids[0], token_text(ids[0] as u64)]));
    assert_eq!(tops[0], Value::Null);
    // The same logprobs as vLLM's prompt_logprobs on /v1/completions.
    let openai = s.ok(
        "/v1/completions",
        &json!({"prompt": ids, "max_tokens": 1, "prompt_logprobs": 2,
                "return_routed_experts": false}),
    );
    let vllm = &openai["choices"][0]["prompt_logprobs"];
    for p in 1..12 {
        let [lp, id, text] = input[p].as_array().unwrap().as_slice() else {
            panic!("{}", input[p])
        };
        assert_eq!(id.as_u64(), Some(u64::from(ids[p])));
        assert_eq!(text.as_str(), Some(token_text(u64::from(ids[p])).as_str()));
        assert_eq!(lp.as_f64(), vllm[p][ids[p].to_string()]["logprob"].as_f64(), "position {p}");
        let top = tops[p].as_array().unwrap();
        assert_eq!(top.len(), 2);
        assert!(top[0][0].as_f64() >= top[1][0].as_f64(), "{top:?}");
        assert_eq!(vllm[p][top[0][1].to_string()]["rank"], 1, "position {p}");
    }
    // The output's logprobs are unchanged by scoring the prompt.
    let plain = generate(&s, ask(json!({"return_text_in_logprobs": true})));
    assert_eq!(meta["output_token_logprobs"], plain["meta_info"]["output_token_logprobs"]);
    assert!(plain["meta_info"].get("input_token_logprobs").is_none(), "-1 (the default): none");
    // From position 5: the entries of positions 5.., the first again without a logprob, as
    // SGLang pads it.
    let from5 = generate(&s, ask(json!({"logprob_start_len": 5})));
    let tail = from5["meta_info"]["input_token_logprobs"].as_array().unwrap();
    assert_eq!(tail.len(), 7);
    assert_eq!(tail[0], json!([null, ids[5], null]));
    for (j, t) in tail.iter().enumerate().skip(1) {
        assert_eq!(t[0], input[5 + j][0], "position {}", 5 + j);
        assert_eq!(t[2], Value::Null, "no text unless asked");
    }
    assert!(from5["meta_info"].get("input_top_logprobs").is_none());
    // Streamed: the last event carries them.
    let events =
        s.post("/generate", &ask(json!({"logprob_start_len": 5, "stream": true}))).sse_json();
    assert_eq!(events.last().unwrap()["meta_info"]["input_token_logprobs"], json!(tail));
    // Out of range: past the prompt, or below -1. Without return_logprob the field is unused.
    for start in [12, 40, -2] {
        let error = s
            .post("/generate", &ask(json!({"logprob_start_len": start})))
            .error(400, "invalid_request_error");
        assert_eq!(error["param"], "logprob_start_len", "{start}");
    }
    let unused = generate(&s, ask(json!({"logprob_start_len": 3, "return_logprob": false})));
    assert!(unused["meta_info"].get("input_token_logprobs").is_none());
}

#[test]
fn named_tokens_carry_their_logprobs_at_every_position() {
    let s = server(MODEL);
    let ids = prompt_ids(10, 23);
    // The named tokens: two the prompt holds, one it does not, one twice.
    let named = [ids[3], 7, ids[6], 7];
    let body = generate(
        &s,
        json!({"input_ids": ids, "return_logprob": true, "logprob_start_len": 0,
               "top_logprobs_num": 20, "token_ids_logprob": named,
               "return_text_in_logprobs": true, "return_routed_experts": false,
               "sampling_params": {"max_new_tokens": 4, "temperature": 0.8,
                                   "sampling_seed": 3, "ignore_eos": true}}),
    );
    let meta = &body["meta_info"];
    let output = meta["output_token_ids_logprobs"].as_array().expect("output_token_ids_logprobs");
    let sampled = meta["output_token_logprobs"].as_array().unwrap();
    let tops = meta["output_top_logprobs"].as_array().unwrap();
    assert_eq!(output.len(), 4, "{meta}");
    // Each position: a triple per named token, in the order named; a token's logprob is the one
    // the position reports for it where it reports it (sampled, or among the alternatives).
    let check = |entries: &Value, reported: &[Value], what: &str| {
        let entries = entries.as_array().unwrap();
        assert_eq!(entries.len(), named.len(), "{what}");
        for (e, &id) in entries.iter().zip(&named) {
            assert_eq!(e[1], json!(id), "{what}");
            assert_eq!(e[2].as_str(), Some(token_text(u64::from(id)).as_str()), "{what}");
            let lp = e[0].as_f64().unwrap();
            assert!(lp <= 0.0, "{what}: {e}");
            for r in reported.iter().filter(|r| r[1] == json!(id)) {
                assert_eq!(r[0].as_f64(), Some(lp), "{what}: {e} against {r}");
            }
        }
        assert_eq!(entries[1], entries[3], "{what}: a token named twice");
    };
    for (i, entries) in output.iter().enumerate() {
        let mut reported = vec![sampled[i].clone()];
        reported.extend(tops[i].as_array().unwrap().iter().cloned());
        check(entries, &reported, &format!("output {i}"));
    }
    let input = meta["input_token_ids_logprobs"].as_array().expect("input_token_ids_logprobs");
    let prompt_lps = meta["input_token_logprobs"].as_array().unwrap();
    let prompt_tops = meta["input_top_logprobs"].as_array().unwrap();
    assert_eq!(input.len(), 10);
    assert_eq!(input[0], Value::Null, "the first prompt token has no logprobs");
    for p in 1..10 {
        let mut reported = vec![prompt_lps[p].clone()];
        reported.extend(prompt_tops[p].as_array().unwrap().iter().cloned());
        check(&input[p], &reported, &format!("prompt {p}"));
    }
    // Named tokens change neither the draw nor the other logprobs.
    let mut plain = json!({"input_ids": ids, "return_logprob": true, "logprob_start_len": 0,
                           "top_logprobs_num": 20, "return_text_in_logprobs": true,
                           "return_routed_experts": false,
                           "sampling_params": {"max_new_tokens": 4, "temperature": 0.8,
                                               "sampling_seed": 3, "ignore_eos": true}});
    let without = generate(&s, plain.clone());
    assert_eq!(without["output_ids"], body["output_ids"]);
    assert_eq!(without["meta_info"]["output_token_logprobs"], meta["output_token_logprobs"]);
    assert_eq!(without["meta_info"]["input_top_logprobs"], meta["input_top_logprobs"]);
    assert!(without["meta_info"].get("output_token_ids_logprobs").is_none());

    // A batch names tokens per prompt.
    plain["input_ids"] = json!([ids, prompt_ids(6, 24)]);
    plain["token_ids_logprob"] = json!([[5], [6, 8]]);
    let batch = generate(&s, plain.clone());
    let widths: Vec<usize> = batch
        .as_array()
        .unwrap()
        .iter()
        .map(|b| b["meta_info"]["output_token_ids_logprobs"][0].as_array().unwrap().len())
        .collect();
    assert_eq!(widths, [1, 2]);
    for (bad, says) in [
        (json!([[5]]), "2 such lists"),
        (json!([5, "a"]), "token ids"),
        (json!([[5], [1 << 20]]), "token_ids_logprob must be in"),
    ] {
        plain["token_ids_logprob"] = bad;
        let error = s.post("/generate", &plain).error(400, "invalid_request_error");
        assert_eq!(error["param"], "token_ids_logprob", "{error}");
        assert!(error["message"].as_str().unwrap().contains(says), "{error}");
    }
}

#[test]
fn routed_experts_follow_the_requested_layer_axis() {
    let s = server(MODEL);
    let ids = prompt_ids(9, 23);
    let ask = |layers: Option<&str>| {
        let mut body = json!({"input_ids": ids, "return_routed_experts": true,
            "sampling_params": {"max_new_tokens": 4, "temperature": 0, "ignore_eos": true}});
        if let Some(l) = layers {
            body["routed_experts_layers"] = json!(l);
        }
        generate(&s, body)
    };
    let all = ask(None);
    assert_eq!(all["meta_info"]["routed_experts_shape"], json!([12, 6, 2]));
    let all_rows = decode_raw_b64(all["meta_info"]["routed_experts"].as_str().unwrap(), 6, 2);
    assert_eq!(ask(Some("all"))["meta_info"]["routed_experts"], all["meta_info"]["routed_experts"]);
    let moe = ask(Some("moe"));
    assert_eq!(moe["meta_info"]["routed_experts_shape"], json!([12, 3, 2]));
    let moe_rows = decode_raw_b64(moe["meta_info"]["routed_experts"].as_str().unwrap(), 3, 2);
    for r in 0..12 {
        let row = all_rows.row(r);
        for (j, layer) in [1usize, 3, 5].into_iter().enumerate() {
            assert_eq!(&moe_rows.row(r)[j * 2..j * 2 + 2], &row[layer * 2..layer * 2 + 2]);
        }
        for layer in [0usize, 2, 4] {
            assert_eq!(&row[layer * 2..layer * 2 + 2], &[0, 0], "row {r} layer {layer}");
        }
    }
    let error = s
        .post("/generate", &json!({"input_ids": ids, "routed_experts_layers": "dense"}))
        .error(400, "invalid_request_error");
    assert_eq!(error["param"], "routed_experts_layers");
}

#[test]
fn cache_salt_and_extra_key_are_cache_namespaces() {
    let s = TestServer::shared("salts", || test_config(MODEL));
    let ids = prompt_ids(64, 24);
    let cached = |extra: Value| {
        let mut body = json!({"input_ids": ids, "sampling_params": {"max_new_tokens": 1}});
        body.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
        generate(&s, body)["meta_info"]["cached_tokens"].as_u64().unwrap()
    };
    // Unsalted: the second request hits the first one's blocks.
    assert_eq!(cached(json!({})), 0);
    assert!(cached(json!({})) >= 48);
    // A salt is a namespace of its own: no hit on the unsalted blocks, then hits on its own.
    assert_eq!(cached(json!({"cache_salt": "a"})), 0);
    assert!(cached(json!({"cache_salt": "a"})) >= 48);
    // extra_key is a second namespace: both must match to share blocks.
    assert_eq!(cached(json!({"cache_salt": "a", "extra_key": "k"})), 0);
    assert!(cached(json!({"cache_salt": "a", "extra_key": "k"})) >= 48);
    assert_eq!(cached(json!({"extra_key": "k"})), 0);
    assert_eq!(cached(json!({"cache_salt": "k"})), 0, "a salt is not an extra key");
    assert_eq!(cached(json!({"cache_salt": "b", "extra_key": "k"})), 0);
    // The OpenAI routes use the same namespaces.
    let openai = s.ok(
        "/v1/completions",
        &json!({"prompt": ids, "max_tokens": 1, "cache_salt": "a", "extra_key": "k"}),
    );
    assert!(openai["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64() >= Some(48));
    for (body, param) in [
        (json!({"input_ids": ids, "cache_salt": ""}), "cache_salt"),
        (json!({"input_ids": ids, "extra_key": ""}), "extra_key"),
        (json!({"input_ids": ids, "extra_key": 7}), "extra_key"),
    ] {
        let error = s.post("/generate", &body).error(400, "invalid_request_error");
        assert_eq!(error["param"], param, "{body}");
    }
    // The rows of a salted request are those of the unsalted one (the same computation).
    let salted = s.ok(
        "/v1/completions",
        &json!({"prompt": ids, "max_tokens": 2, "temperature": 0, "cache_salt": "c"}),
    );
    let plain = s.ok("/v1/completions", &json!({"prompt": ids, "max_tokens": 2, "temperature": 0}));
    assert_eq!(routing_of(&salted["choices"][0]), routing_of(&plain["choices"][0]));
}

/// What a continuation computed, without what may differ between two runs of it (its id, its
/// cache hits).
fn computed(body: &Value) -> Value {
    let meta = &body["meta_info"];
    json!([
        body["text"],
        body["output_ids"],
        meta["prompt_tokens"],
        meta["completion_tokens"],
        meta["finish_reason"],
        meta["output_token_logprobs"],
        meta["routed_experts"],
        meta["routed_experts_shape"]
    ])
}

#[test]
fn a_batch_or_n_answers_a_list_of_continuations_prompt_major() {
    let s = server(MODEL);
    let (a, b) = (prompt_ids(10, 31), prompt_ids(14, 32));
    let params = json!({"max_new_tokens": 6, "temperature": 0, "ignore_eos": true});
    let ask = |input: Value, extra: Value| {
        let mut body = json!({"input_ids": input, "return_logprob": true,
                              "return_routed_experts": true, "sampling_params": params});
        body.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
        generate(&s, body)
    };
    let alone = [ask(json!(a), json!({})), ask(json!(b), json!({}))];
    assert!(alone[0].is_object(), "one prompt, one continuation: one object");

    // A batch of token-id lists: one object per prompt, in order, each the prompt's own run,
    // named by its rid.
    let batch = ask(json!([a, b]), json!({"rid": ["first", "second"]}));
    let items = batch.as_array().expect("a list");
    assert_eq!(items.len(), 2);
    for (i, (item, single)) in items.iter().zip(&alone).enumerate() {
        assert_eq!(computed(item), computed(single), "prompt {i}");
        assert!(item.get("index").is_none(), "only streamed events carry an index");
    }
    assert_eq!(
        (&items[0]["meta_info"]["id"], &items[1]["meta_info"]["id"]),
        (&json!("first"), &json!("second"))
    );
    // A list of one is a batch too.
    assert_eq!(ask(json!([a]), json!({})).as_array().map(Vec::len), Some(1));

    // A batch of texts: each as that text alone.
    let texts = json!({"text": ["The router picks", "experts"], "sampling_params": params});
    let texts = generate(&s, texts);
    for (i, text) in ["The router picks", "experts"].into_iter().enumerate() {
        let single = generate(&s, json!({"text": text, "sampling_params": params}));
        assert_eq!(texts[i]["output_ids"], single["output_ids"], "text {i}");
    }

    // n > 1: a list of the prompt's n samples, continuation i seeded as the OpenAI routes seed
    // it (`seed + i`), ids suffixed with the sample's index.
    let sampled = json!({"max_new_tokens": 6, "temperature": 1.0, "seed": 7, "ignore_eos": true});
    let mut two = sampled.clone();
    two["n"] = json!(2);
    let group = generate(&s, json!({"input_ids": a, "rid": "group", "sampling_params": two}));
    let group = group.as_array().expect("one prompt with n > 1: a list");
    let ids: Vec<&Value> = group.iter().map(|g| &g["meta_info"]["id"]).collect();
    assert_eq!(ids, [&json!("group-0"), &json!("group-1")]);
    let mut with_n = sampled.clone();
    with_n["n"] = json!(3);
    let both =
        generate(&s, json!({"input_ids": [a, b], "rid": ["p", "q"], "sampling_params": with_n}));
    let both = both.as_array().expect("a list");
    let openai = s.ok(
        "/v1/completions",
        &json!({"prompt": [a, b], "n": 3, "max_tokens": 6, "temperature": 1.0, "seed": 7,
                "ignore_eos": true, "return_token_ids": true, "return_routed_experts": false}),
    );
    let choices = openai["choices"].as_array().unwrap();
    assert_eq!((both.len(), choices.len()), (6, 6));
    for (i, item) in both.iter().enumerate() {
        let (prompt, j) = (i / 3, i % 3);
        assert_eq!(item["meta_info"]["id"], format!("{}-{j}", ["p", "q"][prompt]), "{i}");
        assert_eq!(
            item["output_ids"], choices[i]["token_ids"],
            "continuation {j} of prompt {prompt}"
        );
    }
    assert_eq!(group[0]["output_ids"], both[0]["output_ids"], "sample 0 is the seed's own");
    assert_eq!(group[1]["output_ids"], both[1]["output_ids"], "sample 1 is seed + 1's");
}

#[test]
fn a_batch_takes_one_sampling_params_object_per_prompt() {
    let s = server(MODEL);
    let (a, b) = (prompt_ids(9, 35), prompt_ids(12, 36));
    let greedy = json!({"max_new_tokens": 3, "temperature": 0, "ignore_eos": true, "n": 2});
    let sampled = json!({"max_new_tokens": 5, "temperature": 1.0, "seed": 11, "ignore_eos": true,
                         "stop": ["!"], "n": 2});
    let base = json!({"return_logprob": true, "return_routed_experts": true});
    let with = |input: Value, params: Value| {
        let mut body = base.clone();
        body["input_ids"] = input;
        body["sampling_params"] = params;
        generate(&s, body)
    };
    let batch = with(json!([a, b]), json!([greedy, sampled]));
    let items = batch.as_array().expect("a list");
    assert_eq!(items.len(), 4, "two prompts x n = 2, prompt-major");
    let alone = [with(json!(a), greedy.clone()), with(json!(b), sampled.clone())];
    for (i, item) in items.iter().enumerate() {
        let single = &alone[i / 2].as_array().expect("n = 2: a list")[i % 2];
        assert_eq!(computed(item), computed(single), "item {i}: its prompt's own parameters");
    }
    assert_eq!(items[0]["meta_info"]["completion_tokens"], 3);
    assert_ne!(items[2]["output_ids"], items[3]["output_ids"], "samples seed + j each");

    // Streamed, each continuation holds back its own prompt's stop strings.
    let mut streamed = base.clone();
    streamed["input_ids"] = json!([a, b]);
    streamed["sampling_params"] = json!([greedy, sampled]);
    streamed["stream"] = json!(true);
    let events = s.post("/generate", &streamed).sse_json();
    for (i, item) in items.iter().enumerate() {
        let last = events.iter().rev().find(|e| e["index"] == i).expect("events for each");
        assert_eq!(computed(last), computed(item), "streamed item {i}");
    }
}

#[test]
fn a_streamed_batch_interleaves_indexed_events_that_end_as_the_whole_answer() {
    let s = server(MODEL);
    let (a, b) = (prompt_ids(10, 33), prompt_ids(7, 34));
    let body = json!({"input_ids": [a, b], "return_logprob": true, "return_routed_experts": true,
                      "sampling_params": {"max_new_tokens": 5, "temperature": 0,
                                          "ignore_eos": true, "n": 2}});
    let whole = generate(&s, body.clone());
    let whole = whole.as_array().expect("a list");
    let mut streamed = body;
    streamed["stream"] = json!(true);
    let events = s.post("/generate", &streamed).sse_json();
    let mut last: Vec<Option<&Value>> = vec![None; 4];
    for event in &events {
        let i = event["index"].as_u64().expect("every event names its continuation") as usize;
        assert!(
            last[i].is_none_or(|l| l["meta_info"]["finish_reason"].is_null()),
            "after the end: {event}"
        );
        let seen = event["output_ids"].as_array().unwrap().len();
        assert!(last[i].is_none_or(|l| l["output_ids"].as_array().unwrap().len() <= seen));
        last[i] = Some(event);
    }
    for (i, (end, item)) in last.iter().zip(whole).enumerate() {
        let end = end.unwrap_or_else(|| panic!("no event for continuation {i}"));
        assert_eq!(computed(end), computed(item), "continuation {i}");
        let id = end["meta_info"]["id"].as_str().unwrap();
        assert!(id.starts_with("gen-") && id.ends_with(&format!("-{}", i % 2)), "{id}");
    }
}
