//! Times the JSON constraints' work on a vocabulary of Qwen3's size (151,643 entries,
//! synthetic: every byte, then words of 2 to 10 letters with and without a leading space, CJK
//! runs of 1 to 3 characters, pieces of such runs cut anywhere, and JSON punctuation pairs):
//! building the vocabulary's trie once, one `json_object` mask walk from states of each kind, a
//! memoised mask, advancing a state by a token; then a `json_schema` output, three `regex`
//! ones (a sentence, a phone number, counted words) and three `grammar` ones (the sentence's
//! texts, arithmetic, the counted words' texts) read a token at a time, first with the DFA's
//! states and masks built as it goes, then again with both kept; last, compiling three
//! patterns.
//!
//! Run: `cargo bench -p routed-scheduler --bench json_mask`

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Instant;

use routed_scheduler::json_mode::{JsonConstraint, JsonMasks, JsonState, JsonVocabulary};
use routed_types::{
    Grammar, JsonSchema, Property, Regex, ResponseFormat, SchemaNode, SchemaNodeId, TokenId,
};

const VOCAB_SIZE: usize = 151_643;

/// The synthetic vocabulary's entries, distinct, with an EOS (special) at the end.
fn vocabulary() -> Vec<Option<Vec<u8>>> {
    let mut rng = 0x2545_F491_4F6C_DD1Du64;
    let mut next = move |n: u64| {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng % n
    };
    let mut seen: BTreeSet<Vec<u8>> = (0..=255u8).map(|b| vec![b]).collect();
    let punctuation: Vec<&[u8]> = vec![
        b"{\"", b"\":", b"\": ", b"\",", b"\"}", b"},", b"}}", b"]}", b"[{", b"\n  ", b"0.", b"\\n",
    ];
    seen.extend(punctuation.iter().map(|p| p.to_vec()));
    while seen.len() < VOCAB_SIZE - 1 {
        let mut token = Vec::new();
        match next(20) {
            // Pieces of characters, as byte-level BPE has them: a cut run of CJK characters.
            0..=1 => {
                let mut run = Vec::new();
                for _ in 0..2 + next(2) {
                    let c = char::from_u32(0x4E00 + next(0x5000) as u32).unwrap();
                    run.extend_from_slice(c.to_string().as_bytes());
                }
                let from = next(3) as usize;
                token.extend_from_slice(
                    &run[from..from + 1 + next((run.len() - from - 1) as u64) as usize],
                );
            }
            2..=5 => {
                for _ in 0..1 + next(3) {
                    let c = char::from_u32(0x4E00 + next(0x5000) as u32).unwrap();
                    token.extend_from_slice(c.to_string().as_bytes());
                }
            }
            kind => {
                if kind % 2 == 0 {
                    token.push(b' ');
                }
                for _ in 0..2 + next(9) {
                    token.push(b'a' + next(26) as u8);
                }
            }
        }
        seen.insert(token);
    }
    let mut tokens: Vec<Option<Vec<u8>>> = seen.into_iter().map(Some).collect();
    tokens.push(None);
    tokens
}

fn state_after(text: &str) -> JsonState {
    let mut state = JsonState::start();
    assert!(state.feed_all(text.as_bytes()), "{text}");
    state
}

/// Median of `runs` timings of `f`, in microseconds.
fn median_us(runs: usize, mut f: impl FnMut()) -> f64 {
    let mut times: Vec<f64> = (0..runs)
        .map(|_| {
            let start = Instant::now();
            f();
            start.elapsed().as_secs_f64() * 1e6
        })
        .collect();
    times.sort_by(f64::total_cmp);
    times[runs / 2]
}

fn main() {
    let tokens = vocabulary();
    let eos = [tokens.len() as u32 - 1];
    let start = Instant::now();
    let vocab = Arc::new(JsonVocabulary::new(&tokens, &eos));
    let built_ms = start.elapsed().as_secs_f64() * 1e3;
    println!(
        "tries of {} tokens built in {built_ms:.1} ms, {:.1} MB on the heap; a memoised mask {:.1} KB",
        tokens.len(),
        vocab.heap_bytes() as f64 / 1e6,
        tokens.len().div_ceil(64) as f64 * 8.0 / 1e3
    );
    let walked = tokens.len() - vocab.num_in_any_string();
    println!("tokens walked between a string's characters: {walked} (the rest fit any string)");
    println!("| state | allowed | walk (us) |");
    println!("| --- | --- | --- |");
    for (name, text) in [
        ("before the object", ""),
        ("after `{`", "{"),
        ("in a key", "{\"ke"),
        ("after a key's `:`", "{\"key\":"),
        ("in a string value", "{\"key\": \"some text"),
        ("in a number", "{\"key\": 12"),
        ("in a nested array", "{\"a\": [1, {\"b\": [true"),
    ] {
        let state = state_after(text);
        let allowed = vocab.mask(state).num_allowed();
        let us = median_us(21, || {
            std::hint::black_box(vocab.mask(state));
        });
        println!("| {name} | {allowed} | {us:.0} |");
    }
    let mut masks = JsonMasks::new(Arc::clone(&vocab));
    let state = state_after("{\"key\": \"some text");
    masks.mask(state);
    let hit = median_us(1001, || {
        std::hint::black_box(masks.mask(state));
    });
    let token = tokens.iter().position(|t| t.as_deref() == Some(b" hello".as_slice()));
    let token = token.unwrap_or(300) as u32;
    let advance = median_us(1001, || {
        std::hint::black_box(vocab.advance(state, token));
    });
    println!("memoised mask: {hit:.2} us; advancing a state by a token: {advance:.3} us");
    constrained_outputs(&tokens, &vocab);
    for pattern in [r"\d{4}-\d{2}-\d{2}", r"[a-z]{1,1000}", r"\w{50}"] {
        let start = Instant::now();
        let regex = Regex::new(pattern).expect("compiles");
        let ms = start.elapsed().as_secs_f64() * 1e3;
        let mb = regex.heap_bytes() as f64 / 1e6;
        println!("compiling {pattern}: {ms:.1} ms, {mb:.2} MB");
    }
}

/// `{city: string, units: "celsius" | "fahrenheit", alerts?: [{level: integer, note: string |
/// null}]}`, as the gateway reduces it.
fn forecast() -> JsonSchema {
    let prop = |key: &str, value: u32, required| Property {
        key: format!("\"{key}\""),
        value: SchemaNodeId(value),
        required,
    };
    let literals =
        |texts: &[&str]| SchemaNode::Literals(texts.iter().map(|t| t.to_string()).collect());
    let nodes = vec![
        SchemaNode::Object {
            properties: vec![
                prop("city", 1, true),
                prop("units", 2, true),
                prop("alerts", 3, false),
            ],
        },
        SchemaNode::String,
        literals(&["\"celsius\"", "\"fahrenheit\""]),
        SchemaNode::Array {
            prefix_items: vec![],
            items: SchemaNodeId(4),
            min_items: 0,
            max_items: None,
        },
        SchemaNode::Object { properties: vec![prop("level", 5, true), prop("note", 6, true)] },
        SchemaNode::Number { integer: true },
        SchemaNode::AnyOf(vec![SchemaNodeId(1), SchemaNodeId(7)]),
        literals(&["null"]),
    ];
    JsonSchema { nodes }
}

/// Reads constrained outputs a token at a time (the greedy longest-token spelling of a text), as
/// the scheduler does after each sampled token: once with nothing kept, then again.
fn constrained_outputs(tokens: &[Option<Vec<u8>>], vocab: &Arc<JsonVocabulary>) {
    let schema = ResponseFormat::JsonSchema { schema: Arc::new(forecast()), compact: false };
    let forecast = br#"{"city": "some text here", "units": "celsius", "alerts": [{"level": 3, "note": null}, {"level": 12, "note": "wind"}]}"#;
    let regex = Regex::new(r"[A-Z][a-z]+ ([a-z]+ ){2,8}(on|at) [0-9]{1,2}:[0-9]{2}\.").unwrap();
    let regex = ResponseFormat::Regex(Arc::new(regex));
    let sentence = b"Some text here and there at 10:45.";
    let phone =
        ResponseFormat::Regex(Arc::new(Regex::new(r"\([0-9]{3}\) [0-9]{3}-[0-9]{4}").unwrap()));
    let number = b"(555) 123-4567";
    let prose =
        ResponseFormat::Regex(Arc::new(Regex::new(r"([A-Za-z,]+ ){3,12}[A-Za-z]+\.").unwrap()));
    let words = b"Some text here, and there, for a while.";
    // The sentence regex's texts as a grammar, and arithmetic, which nests.
    let sentence_grammar = grammar(
        r#"root ::= [A-Z] [a-z]+ " " (word " "){2,8} ("on" | "at") " " [0-9]{1,2} ":" [0-9]{2} "."
word ::= [a-z]+"#,
    );
    let arithmetic = grammar(
        r#"root ::= expr
expr ::= term (("+" | "-") term)*
term ::= factor (("*" | "/") factor)*
factor ::= [0-9]+ | "(" expr ")""#,
    );
    let sum = b"(12+3)*(4-5)/((67+8)*9)-10";
    let prose_grammar = grammar(r#"root ::= ([A-Za-z,]+ " "){3,12} [A-Za-z]+ ".""#);
    for (name, format, text) in [
        ("json_schema", schema, &forecast[..]),
        ("regex (a sentence: words of [a-z]+)", regex, &sentence[..]),
        ("regex (a phone number)", phone, &number[..]),
        ("regex (words: ([A-Za-z,]+ ){3,12})", prose, &words[..]),
        ("grammar (the sentence regex's texts)", sentence_grammar, &sentence[..]),
        ("grammar (arithmetic)", arithmetic, &sum[..]),
        ("grammar (the words regex's texts)", prose_grammar, &words[..]),
    ] {
        let spelled = spell(tokens, text);
        let mut masks = JsonMasks::new(Arc::clone(vocab));
        let read = |masks: &mut JsonMasks| {
            let start = Instant::now();
            let mut constraint = JsonConstraint::start(masks, &format, &[], None).expect("one");
            for &t in &spelled {
                assert!(constraint.allowed().expect("constrained").allows(t));
                constraint.advance(t, masks);
            }
            start.elapsed().as_secs_f64() * 1e6
        };
        let per_token = |us: f64| us / spelled.len() as f64;
        let first = per_token(read(&mut masks));
        let again = per_token(median_us(21, || {
            std::hint::black_box(read(&mut masks));
        }));
        println!(
            "{name} output of {} tokens: {first:.0} us a token the first time (DFA and masks \
             built), {again:.2} us a token with both kept",
            spelled.len()
        );
    }
}

/// A grammar output.
fn grammar(text: &str) -> ResponseFormat {
    ResponseFormat::Grammar(Arc::new(Grammar::new(text).expect("a grammar")))
}

/// `text` as the greedy longest-token spelling in `tokens`.
fn spell(tokens: &[Option<Vec<u8>>], text: &[u8]) -> Vec<TokenId> {
    let ids: std::collections::HashMap<&[u8], TokenId> = tokens
        .iter()
        .enumerate()
        .filter_map(|(i, t)| Some((t.as_deref()?, i as TokenId)))
        .collect();
    let mut spelled = Vec::new();
    let mut at = 0;
    while at < text.len() {
        let len =
            (1..=(text.len() - at).min(12)).rev().find(|&l| ids.contains_key(&text[at..at + l]));
        let len = len.expect("every byte is a token");
        spelled.push(ids[&text[at..at + len]]);
        at += len;
    }
    spelled
}
