//! The sampling fields RL and evaluation clients send (`presence_penalty`, `frequency_penalty`,
//! `repetition_penalty`, `min_p`, `logit_bias`, `allowed_token_ids`) over real HTTP on every
//! route that takes them: each is accepted, changes the tokens where it should, gives the same
//! tokens for the same seed, means the same on `/generate` (SGLang's `sampling_params`) as on
//! the OpenAI routes, and an out-of-range value is a 400 naming the field; and the text fields
//! (`skip_special_tokens`, `include_stop_str_in_output`, SGLang's `no_stop_trim` and
//! `stop_regex`), whole and streamed.

mod common;

use common::{TestServer, prompt_ids, server};
use serde_json::{Value, json};

const MODEL: &str = "tiny_hybrid_default";

/// `body` with `extra`'s fields added.
fn with(body: &Value, extra: Value) -> Value {
    let mut b = body.clone();
    b.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
    b
}

fn ids(v: &Value) -> Vec<u64> {
    v.as_array().expect("token ids").iter().map(|t| t.as_u64().unwrap()).collect()
}

/// The generated token ids of a completions request.
fn completion(s: &TestServer, body: &Value) -> Vec<u64> {
    ids(&s.ok("/v1/completions", body)["choices"][0]["token_ids"])
}

/// The base request: greedy, long enough for repeats, no routing.
fn greedy(prompt: &[u32]) -> Value {
    json!({"prompt": prompt, "max_tokens": 24, "temperature": 0, "ignore_eos": true,
           "return_token_ids": true, "return_routed_experts": false})
}

/// Tokens that occur more than once.
fn repeats(tokens: &[u64]) -> usize {
    let mut sorted = tokens.to_vec();
    sorted.sort_unstable();
    sorted.windows(2).filter(|w| w[0] == w[1]).count()
}

#[test]
fn penalties_change_greedy_tokens_deterministically() {
    let s = server(MODEL);
    let prompt = prompt_ids(12, 31);
    let base = greedy(&prompt);
    let plain = completion(&s, &base);
    assert!(repeats(&plain) > 0, "the greedy continuation should repeat tokens: {plain:?}");
    for (field, value) in
        [("presence_penalty", 2.0), ("frequency_penalty", 2.0), ("repetition_penalty", 5.0)]
    {
        let body = with(&base, json!({field: value}));
        let penalised = completion(&s, &body);
        assert_eq!(completion(&s, &body), penalised, "{field}: the same request, the same tokens");
        assert_ne!(penalised, plain, "{field} changes the greedy tokens");
        assert!(
            repeats(&penalised) < repeats(&plain),
            "{field} repeats less: {penalised:?} vs {plain:?}"
        );
        // The neutral value changes nothing.
        let neutral = if field == "repetition_penalty" { 1.0 } else { 0.0 };
        assert_eq!(completion(&s, &with(&base, json!({field: neutral}))), plain, "{field}");
        // /generate takes SGLang's names in sampling_params and means the same.
        let generated = s.ok(
            "/generate",
            &json!({"input_ids": prompt, "return_routed_experts": false,
                    "sampling_params": {"max_new_tokens": 24, "temperature": 0,
                                        "ignore_eos": true, field: value}}),
        );
        assert_eq!(ids(&generated["output_ids"]), penalised, "{field} on /generate");
    }
}

#[test]
fn min_p_cuts_the_tail_of_a_seeded_draw() {
    let s = server(MODEL);
    let prompt = prompt_ids(10, 32);
    let greedy_tokens = completion(&s, &greedy(&prompt));
    let sampled = with(&greedy(&prompt), json!({"temperature": 1.0, "seed": 5}));
    let free = completion(&s, &sampled);
    assert_ne!(free, greedy_tokens, "a draw at temperature 1 should leave the greedy path");
    // min_p = 1 keeps only the most likely token: the draw is the greedy path.
    let cut = with(&sampled, json!({"min_p": 1.0}));
    assert_eq!(completion(&s, &cut), greedy_tokens);
    // A moderate min_p is deterministic under the seed, and min_p = 0 is off.
    let some = with(&sampled, json!({"min_p": 0.2}));
    assert_eq!(completion(&s, &some), completion(&s, &some));
    assert_eq!(completion(&s, &with(&sampled, json!({"min_p": 0.0}))), free);
    let generated = s.ok(
        "/generate",
        &json!({"input_ids": prompt, "return_routed_experts": false,
                "sampling_params": {"max_new_tokens": 24, "temperature": 1.0, "seed": 5,
                                    "ignore_eos": true, "min_p": 1.0}}),
    );
    assert_eq!(ids(&generated["output_ids"]), greedy_tokens, "min_p on /generate");
}

#[test]
fn logit_bias_forces_and_forbids_tokens_on_every_route() {
    let s = server(MODEL);
    let prompt = prompt_ids(8, 33);
    let base = with(&greedy(&prompt), json!({"max_tokens": 6}));
    let plain = completion(&s, &base);
    // +100 on one token makes it the greedy choice every time.
    let forced = completion(&s, &with(&base, json!({"logit_bias": {"77": 100}})));
    assert_eq!(forced, vec![77; 6]);
    // -100 on the first greedy token takes it off the table.
    let first = plain[0].to_string();
    let forbidden = completion(&s, &with(&base, json!({"logit_bias": {first: -100}})));
    assert_ne!(forbidden[0], plain[0]);
    // Logprobs stay the raw model's: the forced token's logprob is its unbiased one.
    let scored = s.ok(
        "/v1/completions",
        &with(&base, json!({"logit_bias": {"77": 100}, "logprobs": 0, "max_tokens": 1})),
    );
    let lp = scored["choices"][0]["logprobs"]["token_logprobs"][0].as_f64().unwrap();
    assert!(lp < -0.5, "the raw logprob of a token the model does not favour: {lp}");
    // Chat and /generate.
    let chat = s.ok(
        "/v1/chat/completions",
        &json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4,
                "temperature": 0, "ignore_eos": true, "return_token_ids": true,
                "logit_bias": {"88": 100}}),
    );
    assert_eq!(ids(&chat["choices"][0]["token_ids"]), vec![88; 4]);
    let generated = s.ok(
        "/generate",
        &json!({"input_ids": prompt, "sampling_params": {"max_new_tokens": 4,
                "temperature": 0, "ignore_eos": true, "logit_bias": {"99": 100}}}),
    );
    assert_eq!(ids(&generated["output_ids"]), vec![99; 4]);
}

#[test]
fn allowed_token_ids_keep_every_token_in_the_set_on_both_routes() {
    let s = server(MODEL);
    let prompt = prompt_ids(8, 35);
    let set = [3u64, 40, 77, 120];
    for seed in 0..3 {
        let body = json!({"prompt": prompt, "max_tokens": 12, "temperature": 1.0, "seed": seed,
                          "ignore_eos": true, "return_token_ids": true, "n": 2,
                          "allowed_token_ids": [120, 3, 77, 40, 3]});
        for choice in s.ok("/v1/completions", &body)["choices"].as_array().unwrap() {
            let tokens = ids(&choice["token_ids"]);
            assert_eq!(tokens.len(), 12);
            assert!(tokens.iter().all(|t| set.contains(t)), "seed {seed}: {tokens:?}");
        }
    }
    let plain = completion(&s, &with(&greedy(&prompt), json!({"max_tokens": 8})));
    assert!(plain.iter().any(|t| !set.contains(t)), "the model alone writes other tokens");
    // On chat, and without EOS in the set the answer runs to its length.
    let chat = s.ok(
        "/v1/chat/completions",
        &json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 5,
                "temperature": 0, "return_token_ids": true, "allowed_token_ids": [88]}),
    );
    assert_eq!(ids(&chat["choices"][0]["token_ids"]), vec![88; 5]);
    assert_eq!(chat["choices"][0]["finish_reason"], "length");
    let vocab = s.handle.model_info().vocab_size;
    for (value, code) in [
        (json!([]), "invalid_value"),
        (json!([1, -2]), "invalid_value"),
        (json!([vocab]), "invalid_value"),
        (json!("5"), "invalid_type"),
    ] {
        let body = json!({"prompt": "x", "max_tokens": 2, "allowed_token_ids": value});
        let error = s.post("/v1/completions", &body).error(400, "invalid_request_error");
        assert_eq!(
            (error["param"].as_str(), error["code"].as_str()),
            (Some("allowed_token_ids"), Some(code)),
            "{body}: {error}"
        );
    }
    let both = json!({"prompt": "x", "max_tokens": 2, "allowed_token_ids": [5],
                      "guided_regex": "a"});
    let error = s.post("/v1/completions", &both).error(400, "invalid_request_error");
    assert_eq!(error["param"], "allowed_token_ids", "{error}");
}

#[test]
fn out_of_range_values_are_400_naming_the_field() {
    let s = server(MODEL);
    let vocab = s.handle.model_info().vocab_size;
    let c = "/v1/completions";
    let base = json!({"prompt": "x", "max_tokens": 2});
    for (extra, param) in [
        (json!({"presence_penalty": 2.5}), "presence_penalty"),
        (json!({"presence_penalty": -2.01}), "presence_penalty"),
        (json!({"presence_penalty": "high"}), "presence_penalty"),
        (json!({"frequency_penalty": 3}), "frequency_penalty"),
        (json!({"frequency_penalty": -7}), "frequency_penalty"),
        (json!({"repetition_penalty": 0}), "repetition_penalty"),
        (json!({"repetition_penalty": -1.5}), "repetition_penalty"),
        (json!({"min_p": 1.5}), "min_p"),
        (json!({"min_p": -0.1}), "min_p"),
        (json!({"logit_bias": {"abc": 1}}), "logit_bias"),
        (json!({"logit_bias": {"-1": 1}}), "logit_bias"),
        (json!({"logit_bias": {vocab.to_string(): 1}}), "logit_bias"),
        (json!({"logit_bias": {"5": 100.5}}), "logit_bias"),
        (json!({"logit_bias": {"5": -101}}), "logit_bias"),
        (json!({"logit_bias": {"5": "up"}}), "logit_bias"),
        (json!({"logit_bias": {"5": 1, "05": 2}}), "logit_bias"),
        (json!({"logit_bias": [5, 1]}), "logit_bias"),
    ] {
        let body = with(&base, extra);
        let error = s.post(c, &body).error(400, "invalid_request_error");
        assert_eq!(error["param"], param, "{body}: {error}");
    }
    // The edges are accepted.
    for extra in [
        json!({"presence_penalty": -2, "frequency_penalty": 2, "repetition_penalty": 0.01}),
        json!({"min_p": 0, "logit_bias": {"0": -100, (vocab - 1).to_string(): 100}}),
    ] {
        s.ok(c, &with(&base, extra));
    }
    let hi = json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2});
    for (extra, param) in [
        (json!({"frequency_penalty": 2.5}), "frequency_penalty"),
        (json!({"min_p": 2}), "min_p"),
        (json!({"logit_bias": {"x": 1}}), "logit_bias"),
    ] {
        let body = with(&hi, extra);
        let error = s.post("/v1/chat/completions", &body).error(400, "invalid_request_error");
        assert_eq!(error["param"], param, "{body}: {error}");
    }
    for (sampling, param) in [
        (json!({"presence_penalty": 3}), "sampling_params.presence_penalty"),
        (json!({"frequency_penalty": -3}), "sampling_params.frequency_penalty"),
        (json!({"repetition_penalty": 0}), "sampling_params.repetition_penalty"),
        (json!({"min_p": 1.01}), "sampling_params.min_p"),
        (json!({"logit_bias": {"y": 1}}), "sampling_params.logit_bias"),
    ] {
        let body = json!({"input_ids": [1, 2], "sampling_params": sampling});
        let error = s.post("/generate", &body).error(400, "invalid_request_error");
        assert_eq!(error["param"], param, "{body}: {error}");
    }
}

/// The whole text of a completions request, and its streamed deltas joined.
fn texts(s: &TestServer, body: &Value) -> (String, String) {
    let whole = s.ok("/v1/completions", body)["choices"][0]["text"].as_str().unwrap().to_owned();
    let events = s.post("/v1/completions", &with(body, json!({"stream": true}))).sse_json();
    let deltas = events.iter().filter_map(|e| e["choices"][0]["text"].as_str());
    (whole, deltas.collect())
}

#[test]
fn special_tokens_and_stop_strings_stay_in_the_text_when_asked() {
    let s = server(MODEL);
    let prompt = prompt_ids(8, 34);
    let base = json!({"prompt": prompt, "max_tokens": 3, "temperature": 0,
                      "return_routed_experts": false});
    // Token 1 (`<|im_start|>`) is special: out of the text by default, in it on request.
    let marker = with(&base, json!({"logit_bias": {"1": 100}, "ignore_eos": true}));
    assert_eq!(texts(&s, &marker), (String::new(), String::new()));
    let kept = "<|im_start|>".repeat(3);
    let keep = with(&marker, json!({"skip_special_tokens": false}));
    assert_eq!(texts(&s, &keep), (kept.clone(), kept));
    // EOS (`<|im_end|>`, special) ends the request: left out even when special tokens are kept,
    // unless the stop is asked for too; the stream never sends what the text leaves out.
    let eos = with(&base, json!({"logit_bias": {"2": 100}, "skip_special_tokens": false}));
    assert_eq!(texts(&s, &eos), (String::new(), String::new()));
    let with_stop = with(&eos, json!({"include_stop_str_in_output": true}));
    let end = "<|im_end|>".to_owned();
    assert_eq!(texts(&s, &with_stop), (end.clone(), end));

    // A stop string is cut from the text, or kept through the match on request.
    let plain = with(&base, json!({"max_tokens": 12, "ignore_eos": true}));
    let (full, _) = texts(&s, &plain);
    let chars: Vec<(usize, char)> = full.char_indices().collect();
    assert!(chars.len() >= 6, "{full:?}");
    let stop = &full[chars[3].0..chars[5].0];
    let at = full.find(stop).unwrap();
    let cut = with(&plain, json!({"stop": [stop]}));
    let before = full[..at].to_owned();
    assert_eq!(texts(&s, &cut), (before.clone(), before));
    let through = full[..at + stop.len()].to_owned();
    let kept = with(&cut, json!({"include_stop_str_in_output": true}));
    assert_eq!(texts(&s, &kept), (through.clone(), through.clone()));
    // SGLang's name on /generate: `no_stop_trim`.
    let generated = s.ok(
        "/generate",
        &json!({"input_ids": prompt, "sampling_params": {"max_new_tokens": 12, "temperature": 0,
                "ignore_eos": true, "stop": [stop], "no_stop_trim": true}}),
    );
    assert_eq!(generated["text"], json!(through));
    // A stop token's text is left out too (an ordinary token here), or kept on request.
    let generated =
        ids(&s.ok("/v1/completions", &with(&plain, json!({"return_token_ids": true})))["choices"]
            [0]["token_ids"]);
    let stop_id = generated[4];
    let first = generated.iter().position(|&t| t == stop_id).unwrap() as u64;
    let upto = |n: u64| texts(&s, &with(&plain, json!({"max_tokens": n}))).0;
    let on_token = with(&plain, json!({"stop_token_ids": [stop_id]}));
    let (before, through) = (upto(first), upto(first + 1));
    assert_ne!(before, through, "the stop token has text");
    assert_eq!(texts(&s, &on_token), (before.clone(), before));
    let kept = with(&on_token, json!({"include_stop_str_in_output": true}));
    assert_eq!(texts(&s, &kept), (through.clone(), through));
    // And `skip_special_tokens` in SGLang's `sampling_params`.
    let marked = s.ok(
        "/generate",
        &json!({"input_ids": prompt, "sampling_params": {"max_new_tokens": 2, "temperature": 0,
                "ignore_eos": true, "logit_bias": {"1": 100}, "skip_special_tokens": false}}),
    );
    assert_eq!(marked["text"], json!("<|im_start|>".repeat(2)));
}

#[test]
fn logprobs_name_tokens_by_id_when_asked() {
    let s = server(MODEL);
    let prompt = prompt_ids(8, 35);
    let names = |ids: &[u64]| ids.iter().map(|id| json!(format!("token_id:{id}"))).collect();
    let body = json!({"prompt": prompt, "max_tokens": 4, "temperature": 0, "ignore_eos": true,
                      "logprobs": 2, "return_token_ids": true, "return_routed_experts": false,
                      "return_tokens_as_token_ids": true});
    let whole = s.ok("/v1/completions", &body);
    let choice = &whole["choices"][0];
    let tokens = ids(&choice["token_ids"]);
    let logprobs = &choice["logprobs"];
    assert_eq!(logprobs["tokens"], Value::Array(names(&tokens)), "{logprobs}");
    // Alternatives are named the same way; offsets count the names, as vLLM counts them.
    let top = logprobs["top_logprobs"][0].as_object().unwrap();
    assert!(top.keys().all(|k| k.starts_with("token_id:")), "{top:?}");
    let offsets = ids(&logprobs["text_offset"]);
    assert_eq!(offsets[1] - offsets[0], format!("token_id:{}", tokens[0]).len() as u64);
    let events = s.post("/v1/completions", &with(&body, json!({"stream": true}))).sse_json();
    let streamed: Vec<Value> = events
        .iter()
        .filter_map(|e| e["choices"][0]["logprobs"]["tokens"].as_array())
        .flatten()
        .cloned()
        .collect();
    assert_eq!(streamed, names(&tokens));

    let chat = json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3,
                      "temperature": 0, "ignore_eos": true, "logprobs": true, "top_logprobs": 1,
                      "return_token_ids": true, "return_tokens_as_token_ids": true});
    let answer = s.ok("/v1/chat/completions", &chat);
    let choice = &answer["choices"][0];
    let content = choice["logprobs"]["content"].as_array().unwrap();
    let named: Vec<Value> = content.iter().map(|c| c["token"].clone()).collect();
    assert_eq!(named, names(&ids(&choice["token_ids"])));
    // `bytes` stay the token's text's, as vLLM gives them.
    let text: Vec<u8> = content
        .iter()
        .flat_map(|c| c["bytes"].as_array().unwrap().iter().map(|b| b.as_u64().unwrap() as u8))
        .collect();
    assert_eq!(String::from_utf8_lossy(&text), choice["message"]["content"].as_str().unwrap());
    assert!(content[0]["top_logprobs"][0]["token"].as_str().unwrap().starts_with("token_id:"));
}

/// `text` as a regular expression that matches it literally.
fn escaped(text: &str) -> String {
    text.chars()
        .flat_map(|c| (c.is_ascii_punctuation()).then_some('\\').into_iter().chain([c]))
        .collect()
}

#[test]
fn stop_patterns_cut_the_text_at_their_first_match() {
    let s = server(MODEL);
    let prompt = prompt_ids(8, 35);
    let plain = json!({"prompt": prompt, "max_tokens": 16, "temperature": 0, "ignore_eos": true,
                       "return_routed_experts": false});
    let (full, _) = texts(&s, &plain);
    let chars: Vec<(usize, char)> = full.char_indices().collect();
    assert!(chars.len() >= 8, "{full:?}");
    let lit = &full[chars[4].0..chars[7].0];
    let at = full.find(lit).unwrap();
    let (before, through) = (full[..at].to_owned(), full[..at + lit.len()].to_owned());
    assert!(!full.contains("zzz") && !full.chars().any(|c| c.is_ascii_digit()), "{full:?}");
    // Matches at most 12 bytes long (judged on a window of the output's end), and of any length
    // (the whole output searched): both stop where the literal first completes.
    for pattern in
        [format!("(?:{}|[0-9]{{12}})", escaped(lit)), format!("{}(?:zzz)*", escaped(lit))]
    {
        let cut = with(&plain, json!({"stop_regex": pattern}));
        assert_eq!(texts(&s, &cut), (before.clone(), before.clone()), "{pattern}");
        let out = s.ok("/v1/completions", &cut);
        assert_eq!(out["choices"][0]["finish_reason"], "stop");
        assert_eq!(out["choices"][0]["stop_reason"], json!(pattern));
        let kept = with(&cut, json!({"include_stop_str_in_output": true}));
        assert_eq!(texts(&s, &kept), (through.clone(), through.clone()), "{pattern}");
        // SGLang's `/generate`: the pattern is the match it reports; `no_stop_trim` keeps it.
        let sp = json!({"max_new_tokens": 16, "temperature": 0, "ignore_eos": true,
                        "stop_regex": [pattern]});
        let generated = s.ok("/generate", &json!({"input_ids": prompt, "sampling_params": sp}));
        assert_eq!(generated["text"], json!(before));
        let reason = &generated["meta_info"]["finish_reason"];
        assert_eq!(reason, &json!({"type": "stop", "matched": pattern}));
        let sp = with(&sp, json!({"no_stop_trim": true}));
        let generated = s.ok("/generate", &json!({"input_ids": prompt, "sampling_params": sp}));
        assert_eq!(generated["text"], json!(through));
    }
    // The chat route takes the field as well.
    let chat = json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 16,
                      "temperature": 0, "ignore_eos": true, "return_routed_experts": false});
    let content = s.ok("/v1/chat/completions", &chat)["choices"][0]["message"]["content"]
        .as_str()
        .unwrap()
        .to_owned();
    let chars: Vec<(usize, char)> = content.char_indices().collect();
    assert!(chars.len() >= 6, "{content:?}");
    let lit = &content[chars[3].0..chars[5].0];
    let pattern = format!("{}+", escaped(lit));
    let out = s.ok("/v1/chat/completions", &with(&chat, json!({"stop_regex": [pattern]})));
    let choice = &out["choices"][0];
    assert_eq!(choice["message"]["content"], json!(&content[..content.find(lit).unwrap()]));
    assert_eq!(
        (&choice["finish_reason"], &choice["stop_reason"]),
        (&json!("stop"), &json!(pattern))
    );
    // A pattern the engine cannot stop on is a 400 naming the field, on every route.
    for (pattern, says) in [
        (json!("a*"), "empty text"),
        (json!(["x", "^done"]), "anchors"),
        (json!("(a"), "unclosed group"),
        (json!(3), ""),
    ] {
        let body = with(&plain, json!({"stop_regex": pattern}));
        let error = s.post("/v1/completions", &body).error(400, "invalid_request_error");
        assert_eq!(error["param"], "stop_regex", "{error}");
        assert!(error["message"].as_str().unwrap().contains(says), "{error}");
        let sp = json!({"stop_regex": pattern});
        let body = json!({"input_ids": prompt, "sampling_params": sp});
        let error = s.post("/generate", &body).error(400, "invalid_request_error");
        assert_eq!(error["param"], "sampling_params.stop_regex", "{error}");
    }
}

#[test]
fn bad_words_are_encoded_as_vllm_encodes_them_and_never_written() {
    let s = server(MODEL);
    let prompt = prompt_ids(8, 36);
    let plain = greedy(&prompt);
    let free = completion(&s, &plain);
    let tokenize = |text: &str| {
        ids(&s.ok("/tokenize", &json!({"prompt": text, "add_special_tokens": false}))["tokens"])
    };
    // A token the answer writes first at `i` whose text, encoded alone or after a space (the
    // two ways vLLM encodes a bad word), gives the token back.
    let (i, word) = (1..free.len())
        .filter(|&i| !free[..i].contains(&free[i]))
        .find_map(|i| {
            let text = s.ok("/detokenize", &json!({"tokens": [free[i]]}))["prompt"]
                .as_str()?
                .trim_start()
                .to_owned();
            let back = [tokenize(&text), tokenize(&format!(" {text}"))];
            (!text.is_empty() && back.iter().any(|b| b[..] == [free[i]])).then_some((i, text))
        })
        .unwrap_or_else(|| panic!("a token whose text encodes back to it in {free:?}"));
    for words in [json!([word]), json!(word), json!(["\u{1F600}\u{1F600}", word])] {
        let tokens = completion(&s, &with(&plain, json!({"bad_words": words})));
        assert_eq!(tokens[..i], free[..i], "{words}: the same answer up to the word");
        assert!(!tokens.contains(&free[i]), "{words}: {tokens:?} writes {}", free[i]);
    }
    let chat = json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4,
                      "bad_words": [word], "return_routed_experts": false});
    s.ok("/v1/chat/completions", &chat);
    for words in [json!([""]), json!(["ok", "  "]), json!(3)] {
        let body = with(&plain, json!({"bad_words": words}));
        let error = s.post("/v1/completions", &body).error(400, "invalid_request_error");
        assert_eq!(error["param"], "bad_words", "{words}: {error}");
    }
}
