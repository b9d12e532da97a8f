//! vLLM's `guided_grammar` and `structured_outputs.grammar` on both OpenAI routes and SGLang's
//! `sampling_params.ebnf` on `/generate`: every answer EOS ended is a text of the grammar
//! (checked here by a hand-written reader, not by the engine's), the others a prefix of one;
//! a grammar the engine cannot follow is a 400 naming the field. The grammar nests, so no
//! regular expression could stand in for it; the tiny checkpoint writes none of its texts by
//! itself.

mod common;

use common::{
    TestServer, answers, assert_completions_refused, count_whole_answers, streamed_content,
    test_config,
};
use serde_json::json;

const MODEL: &str = "tiny_hybrid_default";

/// Lists of digits and lists, as GBNF in the layout llama.cpp writes.
const GRAMMAR: &str = r#"# a list of digits and lists
root ::= list
list ::= "[" (item ("," item)*)? "]"
item ::= [0-9] | list
"#;

/// How far a hand-written reader gets through `text` as a list: `Err` at the first byte that
/// cannot follow, else whether the list closed (with nothing after it).
fn read_list(text: &str) -> Result<bool, usize> {
    // What comes next: an item or `]` (after `[`), `,` or `]` (after an item), an item (after `,`).
    #[derive(PartialEq)]
    enum Next {
        ItemOrClose,
        CommaOrClose,
        Item,
    }
    let (mut depth, mut next) = (0usize, Next::Item);
    for (at, b) in text.bytes().enumerate() {
        let closed = depth == 0 && at > 0;
        next = match (b, &next) {
            _ if closed => return Err(at),
            (b'[', Next::ItemOrClose | Next::Item) => {
                depth += 1;
                Next::ItemOrClose
            }
            (b'0'..=b'9', Next::ItemOrClose | Next::Item) if depth > 0 => Next::CommaOrClose,
            (b',', Next::CommaOrClose) => Next::Item,
            (b']', Next::ItemOrClose | Next::CommaOrClose) => {
                depth -= 1;
                Next::CommaOrClose
            }
            _ => return Err(at),
        };
    }
    Ok(depth == 0 && !text.is_empty())
}

/// Checks one answer, and returns whether EOS ended it on a whole list.
fn check(text: &str, finish: &str, what: &str) -> bool {
    match (read_list(text), finish) {
        (Ok(true), "stop") => true,
        (Ok(false), "length") => false,
        (read, _) => panic!("{what}: {text:?} ended by {finish}: {read:?}"),
    }
}

#[test]
fn the_hand_reader_tells_lists_from_prefixes_and_others() {
    for list in ["[]", "[1]", "[1,[2,[]],3]", "[[[]]]"] {
        assert_eq!(read_list(list), Ok(true), "{list}");
    }
    for prefix in ["", "[", "[1,", "[[2]", "[1,[]"] {
        assert_eq!(read_list(prefix), Ok(false), "{prefix}");
    }
    for (other, at) in [("1", 0), ("[,", 1), ("[1]]", 3), ("[1]x", 3), ("[12]", 2), ("[1,]", 3)] {
        assert_eq!(read_list(other), Err(at), "{other}");
    }
}

#[test]
fn answers_follow_the_grammar_however_it_is_asked_for() {
    let s = TestServer::start(test_config(MODEL));
    // vLLM's fields, and SGLang's on its OpenAI routes.
    let openai = [
        ("guided_grammar", json!(GRAMMAR)),
        ("structured_outputs", json!({"grammar": GRAMMAR})),
        ("ebnf", json!(GRAMMAR)),
    ];
    let prompts = ("A list:", "A list, please");
    let num_whole = count_whole_answers(&s, &openai, ("ebnf", json!(GRAMMAR)), prompts, check);
    assert!(num_whole > 0, "no answer ended on a whole list");
}

#[test]
fn an_answer_streamed_is_the_whole_ones() {
    let s = TestServer::start(test_config(MODEL));
    for seed in 0..2 {
        let body = json!({"messages": [{"role": "user", "content": "A list, please"}],
                          "max_tokens": 24, "temperature": 1.0, "seed": seed,
                          "guided_grammar": GRAMMAR});
        let whole = answers(&s.ok("/v1/chat/completions", &body)).remove(0).0;
        assert_eq!(streamed_content(&s, &body), whole, "seed {seed}");
    }
}

#[test]
fn grammars_the_engine_cannot_follow_are_refused_by_name() {
    let s = TestServer::start(test_config(MODEL));
    let cases = [
        (
            "guided_grammar",
            json!("root ::= item"),
            "guided_grammar",
            "invalid_value",
            "no rule is named item",
        ),
        ("guided_grammar", json!({"root": "a"}), "guided_grammar", "invalid_type", "a string"),
        ("ebnf", json!("root ::= \"a"), "ebnf", "invalid_value", "never closed"),
        (
            "structured_outputs",
            json!({"grammar": "root ::= root \"a\" | \"b\""}),
            "structured_outputs.grammar",
            "invalid_value",
            "left-recursive",
        ),
        (
            "structured_outputs",
            json!({"grammar": "start: \"a\""}),
            "structured_outputs.grammar",
            "invalid_value",
            "line 1, column 6",
        ),
        (
            "structured_outputs",
            json!({"grammar": GRAMMAR, "regex": "a"}),
            "structured_outputs",
            "invalid_value",
            "give one of them",
        ),
    ];
    assert_completions_refused(&s, &cases);
    let mut both = json!({"prompt": "hi", "max_tokens": 2, "guided_grammar": GRAMMAR});
    both["guided_regex"] = json!("a");
    let error = s.post("/v1/completions", &both).error(400, "invalid_request_error");
    assert_eq!(error["param"], "guided_grammar", "{error}");
    let mut both = json!({"prompt": "hi", "max_tokens": 2, "guided_grammar": GRAMMAR});
    both["ebnf"] = json!(GRAMMAR);
    let error = s.post("/v1/completions", &both).error(400, "invalid_request_error");
    assert_eq!(error["param"], "ebnf", "{error}");
    for (sampling, param) in [
        (json!({"ebnf": "root ::= [z-a]"}), "sampling_params.ebnf"),
        (json!({"ebnf": GRAMMAR, "regex": "a"}), "sampling_params.ebnf"),
        (json!({"ebnf": GRAMMAR, "structural_tag": "{}"}), "sampling_params.structural_tag"),
    ] {
        let mut sampling = sampling;
        sampling["max_new_tokens"] = json!(2);
        let body = json!({"input_ids": [1, 2, 3], "sampling_params": sampling});
        let error = s.post("/generate", &body).error(400, "invalid_request_error");
        assert_eq!(error["param"], param, "{error}");
    }
    assert_eq!(s.registry.len(), 0, "nothing ran");
}
