//! Structural tags (`structural_tag`) over real HTTP, every way the clients ask for one: as
//! `response_format` on both OpenAI routes (SGLang's and vLLM's), as vLLM's
//! `structured_outputs.structural_tag` and as SGLang's `sampling_params.structural_tag` on
//! `/generate` (both the tag's JSON text). A logit bias makes the tiny checkpoint write the
//! trigger over and over; the tag must turn each into a whole structure, which a hand-written
//! reader checks (not the engine's).

mod common;

use common::{TestServer, server};
use serde_json::{Value, json};

const MODEL: &str = "tiny_hybrid_default";

/// Calls `<f>` (whitespace) an integer from 0 to 99 (whitespace) `</f>`, opened by `<`.
fn tag() -> Value {
    json!({"structures": [{"begin": "<f>", "end": "</f>",
                           "schema": {"type": "integer", "minimum": 0, "maximum": 99}}],
           "triggers": ["<"]})
}

/// How many whole structures `text` writes, each checked; `Err` with the place where the text
/// leaves the tag. Free text holds no `<` outside a structure; a structure cut short is allowed
/// at the end only when `cut` (the length ended the answer).
fn structures(text: &str, cut: bool) -> Result<usize, String> {
    let mut rest = text;
    let mut whole = 0;
    while let Some(at) = rest.find('<') {
        let open = &rest[at..];
        let wrong = || format!("{open:?} in {text:?}");
        // A structure cut short is a prefix of a whole one.
        let Some(body) = open.strip_prefix("<f>") else {
            return if cut && "<f>".starts_with(open) { Ok(whole) } else { Err(wrong()) };
        };
        let body = body.trim_start();
        let digits = body.bytes().take_while(u8::is_ascii_digit).count();
        let after = body[digits..].trim_start();
        if cut && after.is_empty() {
            return Ok(whole);
        }
        let number: Option<u32> = body[..digits].parse().ok();
        let leading_zero = digits > 1 && body.starts_with('0');
        if number.is_none_or(|n| n > 99) || leading_zero {
            return Err(wrong());
        }
        match after.strip_prefix("</f>") {
            Some(next) => (rest, whole) = (next, whole + 1),
            None if cut && "</f>".starts_with(after) => return Ok(whole),
            None => return Err(wrong()),
        }
    }
    Ok(whole)
}

/// The id of the token whose text is `<`.
fn angle(s: &TestServer) -> u64 {
    let tokens = s.ok("/tokenize", &json!({"prompt": "<", "add_special_tokens": false}));
    assert_eq!(tokens["count"], 1, "{tokens}");
    tokens["tokens"][0].as_u64().unwrap()
}

#[test]
fn the_hand_reader_tells_structures_from_the_rest() {
    assert_eq!(structures("a <f>12</f> b <f> 0 </f>", false), Ok(2));
    assert_eq!(structures("<f>\n7\n</f><f>9", true), Ok(1));
    assert!(structures("<f>9", false).is_err());
    assert!(structures("<<<", true).is_err());
    assert!(structures("<f>100</f>", false).is_err());
    assert!(structures("<f>07</f>", false).is_err());
    assert!(structures("<f>7</g>", true).is_err());
}

#[test]
fn every_trigger_opens_a_whole_structure_however_the_tag_is_asked_for() {
    let s = server(MODEL);
    let bias = json!({angle(&s).to_string(): 8});
    let text = tag().to_string();
    let mut response_format = tag();
    response_format["type"] = json!("structural_tag");
    let base = json!({"max_tokens": 40, "temperature": 1, "ignore_eos": true,
                      "logit_bias": bias, "return_routed_experts": false});
    let with = |extra: Value| {
        let mut body = base.clone();
        body.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
        body
    };
    // Unconstrained, the bias writes `<` after `<`: no structure at all.
    let free = s.ok("/v1/completions", &with(json!({"prompt": "hi", "seed": 0})));
    let free_text = free["choices"][0]["text"].as_str().unwrap();
    assert!(free_text.contains("<<") && structures(free_text, true).is_err(), "{free_text:?}");
    let mut num_structures = 0;
    for seed in 0..3 {
        let asks = [
            ("/v1/completions", with(json!({"prompt": "hi", "response_format": response_format}))),
            (
                "/v1/chat/completions",
                with(json!({"messages": [{"role": "user", "content": "hi"}],
                            "response_format": response_format})),
            ),
            (
                "/v1/completions",
                with(json!({"prompt": "hi", "structured_outputs": {"structural_tag": text}})),
            ),
        ];
        for (route, mut body) in asks {
            body["seed"] = json!(seed);
            let out = s.ok(route, &body);
            for (answer, finish) in common::answers(&out) {
                let cut = finish == "length";
                let found = structures(&answer, cut).unwrap_or_else(|e| panic!("{route}: {e}"));
                num_structures += found;
            }
        }
        let sp = json!({"max_new_tokens": 40, "temperature": 1, "seed": seed, "ignore_eos": true,
                        "logit_bias": bias, "structural_tag": text});
        let out = s.ok("/generate", &json!({"text": "hi", "sampling_params": sp}));
        let cut = out["meta_info"]["finish_reason"]["type"] == "length";
        num_structures += structures(out["text"].as_str().unwrap(), cut).unwrap();
    }
    assert!(num_structures >= 12, "{num_structures} structures in 12 answers");
    // Streamed, the same answer.
    let body = with(json!({"messages": [{"role": "user", "content": "hi"}], "seed": 1,
                           "response_format": response_format}));
    let whole = s.ok("/v1/chat/completions", &body)["choices"][0]["message"]["content"].clone();
    assert_eq!(json!(common::streamed_content(&s, &body)), whole);
}

/// [`tag`]'s structure in xgrammar's newer `format` form: a `tag` holding a `json_schema`.
fn format_tag() -> Value {
    json!({"type": "tag", "begin": "<f>", "end": "</f>",
           "content": {"type": "json_schema",
                       "json_schema": {"type": "integer", "minimum": 0, "maximum": 99}}})
}

#[test]
fn the_format_form_holds_the_answer_to_its_tags_and_flags() {
    let s = server(MODEL);
    let bias = json!({angle(&s).to_string(): 8});
    let triggered = |at_least_one: bool, stop_after_first: bool| {
        json!({"type": "triggered_tags", "triggers": ["<"], "tags": [format_tag()],
               "at_least_one": at_least_one, "stop_after_first": stop_after_first})
    };
    let (mut num_stopped, mut num_free) = (0, 0);
    for seed in 0..4 {
        for (format, starts, at_most_one) in [
            // One tag alone: the answer is that structure and nothing else.
            (format_tag(), true, true),
            (triggered(true, false), true, false),
            (triggered(false, true), false, true),
        ] {
            let body = json!({"messages": [{"role": "user", "content": "hi"}], "seed": seed,
                              "max_tokens": 40, "temperature": 1, "logit_bias": bias,
                              "response_format": {"type": "structural_tag", "format": format}});
            let out = s.ok("/v1/chat/completions", &body);
            let choice = &out["choices"][0];
            let text = choice["message"]["content"].as_str().unwrap_or_default();
            let cut = choice["finish_reason"] == "length";
            let found = structures(text, cut).unwrap_or_else(|e| panic!("{format}: {e}"));
            if starts {
                assert!(text.starts_with("<f>") || "<f>".starts_with(text), "{format}: {text:?}");
            }
            if at_most_one {
                assert!(found <= 1, "{format}: {text:?}");
                // After its structure the answer ends: EOS is all that may follow.
                if let Some(end) = text.find("</f>") {
                    assert_eq!(end + 4, text.len(), "{format}: {text:?}");
                    assert_eq!(choice["finish_reason"], "stop", "{format}: {text:?}");
                    num_stopped += 1;
                }
            }
            num_free += usize::from(!starts && !text.starts_with('<'));
        }
    }
    assert!(num_stopped >= 4, "{num_stopped} answers ended after their structure");
    assert!(num_free >= 1, "free text before the structure was never written");
}
