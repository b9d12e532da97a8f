use super::*;
use crate::json_mode::{
    JsonConstraint, JsonMasks, JsonVocabulary,
    tests::{draw, vocabulary_with},
};
use routed_test_support::SplitMix64;
use routed_types::{NumberBound, Property, Regex, ResponseFormat, TokenId, TokenMask};
use serde_json::Value;

fn n(i: u32) -> Node {
    Node(i)
}

fn prop(key: &str, value: u32, required: bool) -> Property {
    Property { key: format!("\"{key}\""), value: n(value), required }
}

fn literals(texts: &[&str]) -> SchemaNode {
    SchemaNode::Literals(texts.iter().map(|t| t.to_string()).collect())
}

/// `{name: string, age?: integer, tags: [1..=2 of "a" | "b" | 1 | 12], extra?: string | null}`.
fn person() -> JsonSchema {
    let nodes = vec![
        SchemaNode::Object {
            properties: vec![
                prop("name", 1, true),
                prop("age", 2, false),
                prop("tags", 3, true),
                prop("extra", 6, false),
            ],
        },
        SchemaNode::String,
        SchemaNode::Number { integer: true },
        SchemaNode::Array { prefix_items: vec![], items: n(4), min_items: 1, max_items: Some(2) },
        literals(&["\"a\"", "\"b\"", "1", "12"]),
        literals(&["null"]),
        SchemaNode::AnyOf(vec![n(1), n(5)]),
    ];
    JsonSchema { nodes }
}

/// `{value: number, children?: [tree]}`: a schema that refers to itself.
fn tree() -> JsonSchema {
    let nodes = vec![
        SchemaNode::Object { properties: vec![prop("value", 1, true), prop("children", 2, false)] },
        SchemaNode::Number { integer: false },
        SchemaNode::Array { prefix_items: vec![], items: n(0), min_items: 0, max_items: None },
    ];
    JsonSchema { nodes }
}

/// Two objects told apart only by their `kind`'s value: `{kind: "p", x: int}` or
/// `{kind: "q", y: int}`.
fn tagged() -> JsonSchema {
    let nodes = vec![
        SchemaNode::AnyOf(vec![n(1), n(2)]),
        SchemaNode::Object { properties: vec![prop("kind", 3, true), prop("x", 5, true)] },
        SchemaNode::Object { properties: vec![prop("kind", 4, true), prop("y", 5, true)] },
        literals(&["\"p\""]),
        literals(&["\"q\""]),
        SchemaNode::Number { integer: true },
    ];
    JsonSchema { nodes }
}

/// `{code: 2 to 3 characters, note?: at most 1, n?: an integer from -2 to 12, r?: a number
/// above -1.5 and at most 2.25, p?: 1 to 3 items, an `r` then a `note` then an `n`}`.
fn bounded() -> JsonSchema {
    let bound = |units, inclusive| Some(NumberBound { units, inclusive });
    let nodes = vec![
        SchemaNode::Object {
            properties: vec![
                prop("code", 1, true),
                prop("note", 2, false),
                prop("n", 3, false),
                prop("r", 4, false),
                prop("p", 5, false),
            ],
        },
        SchemaNode::BoundedString { min_length: 2, max_length: Some(3) },
        SchemaNode::BoundedString { min_length: 0, max_length: Some(1) },
        SchemaNode::BoundedInteger { minimum: Some(-2), maximum: Some(12) },
        SchemaNode::BoundedNumber {
            minimum: bound(-3 * NumberBound::ONE / 2, false),
            maximum: bound(9 * NumberBound::ONE / 4, true),
        },
        SchemaNode::Array {
            prefix_items: vec![n(4), n(2)],
            items: n(3),
            min_items: 1,
            max_items: Some(3),
        },
    ];
    JsonSchema { nodes }
}

/// `{date: "[0-5]{2}-[a-c]+", tag?: 1 to 2 characters of "a?\"?\n?"}`.
fn patterned() -> JsonSchema {
    let pattern = |p: &str| Arc::new(Regex::new(p).unwrap());
    let nodes = vec![
        SchemaNode::Object { properties: vec![prop("date", 1, true), prop("tag", 2, false)] },
        SchemaNode::PatternString {
            pattern: pattern("[0-5]{2}-[a-c]+"),
            min_length: 0,
            max_length: None,
        },
        SchemaNode::PatternString {
            pattern: pattern("a?\"?\n?"),
            min_length: 1,
            max_length: Some(2),
        },
    ];
    JsonSchema { nodes }
}

fn any() -> JsonSchema {
    JsonSchema { nodes: vec![SchemaNode::Any] }
}

/// Reads `text`: `None` when a byte cannot follow, else whether the value is whole.
fn read(schema: &JsonSchema, compact: bool, text: &[u8]) -> Option<bool> {
    let mut dfa = schema_dfa(Arc::new(schema.clone()), compact, 0);
    let pos = dfa.start();
    let mut state = dfa.state(&pos);
    for &b in text {
        state = dfa.step(state, b)?;
    }
    Some(dfa.is_complete(state))
}

#[test]
fn values_of_the_schema_are_read_whole_and_their_prefixes_are_not() {
    let cases: [(JsonSchema, &[&str]); 6] = [
        (
            person(),
            &[
                r#"{"name": "x", "tags": ["a"]}"#,
                r#"{"name":"x","age":-12,"tags":["b",12]}"#,
                r#"{"name": "", "age": 0, "tags": [1, "a"], "extra": null}"#,
                "{ \"name\" : \"\u{e9}\\n\", \"tags\" : [ 12 ] ,\n\"extra\": \"s\" }",
            ],
        ),
        (
            tree(),
            &[
                r#"{"value": 1}"#,
                r#"{"value": 1, "children": [{"value": 2.5e3}, {"value": -1, "children": []}]}"#,
            ],
        ),
        (tagged(), &[r#"{"kind": "p", "x": 1}"#, r#"{"kind":"q","y":20}"#]),
        (any(), &[r#"[1, {"a": [true, null, {}]}, "s", -0.5]"#, r#"{"k": false}"#, "null"]),
        (
            bounded(),
            &[
                r#"{"code": "ab"}"#,
                r#"{"code": "abc", "note": ""}"#,
                "{\"code\": \"\u{e9}\\n\", \"note\": \"\u{1F980}\"}",
                r#"{"code": "\u0041b\"", "note": "\\"}"#,
                r#"{"code": "ab", "n": -2}"#,
                r#"{"code": "ab", "note": "", "n": 12}"#,
                r#"{"code":"ab","n":0}"#,
                r#"{"code": "ab", "r": 2.25}"#,
                r#"{"code":"ab","n":3,"r":-1.4999}"#,
                r#"{"code": "ab", "r": 0.000}"#,
                r#"{"code": "ab", "r": -0}"#,
                r#"{"code": "ab", "r": 2.2500000000000000000000}"#,
                r#"{"code": "ab", "r": -1.4999999999999999999999}"#,
                r#"{"code": "ab", "p": [2]}"#,
                r#"{"code": "ab", "p": [0.5, "x"]}"#,
                r#"{"code": "ab", "r": 1, "p": [-1, "", 12]}"#,
            ],
        ),
        (
            patterned(),
            &[
                r#"{"date": "12-ab"}"#,
                r#"{"date": "05-c", "tag": "a\""}"#,
                r#"{"date":"50-a","tag":"\n"}"#,
                r#"{"date":"50-a","tag":"\""}"#,
            ],
        ),
    ];
    for (schema, texts) in cases {
        for text in texts {
            serde_json::from_str::<Value>(text).expect("the examples are JSON");
            assert_eq!(read(&schema, false, text.as_bytes()), Some(true), "{text}");
            for cut in 0..text.len() {
                let prefix = &text.as_bytes()[..cut];
                assert_eq!(read(&schema, false, prefix), Some(false), "{text} at {cut}");
            }
        }
    }
    // A number at the top level is whole as soon as it may end, and may go on.
    assert_eq!(read(&any(), false, b"12"), Some(true));
    assert_eq!(read(&any(), false, b"12."), Some(false));
}

#[test]
fn what_the_schema_does_not_allow_is_refused() {
    let refused: [(JsonSchema, &[&str]); 6] = [
        (
            person(),
            &[
                r#"{"tags": ["a"], "name": "x"}"#,
                r#"{"name": "x"}"#,
                r#"{"name": "x", "tags": []}"#,
                r#"{"name": "x", "tags": ["a", "b", "a"]}"#,
                r#"{"name": "x", "age": 1.5, "tags": ["a"]}"#,
                r#"{"name": "x", "age": 1e3, "tags": ["a"]}"#,
                r#"{"name": "x", "tags": ["c"]}"#,
                r#"{"name": "x", "tags": [123]}"#,
                r#"{"name": "x", "tags": [2]}"#,
                r#"{"name": "x", "other": 1, "tags": ["a"]}"#,
                r#"{"name": 1, "tags": ["a"]}"#,
                r#"{"name": "x", "tags": ["a"],}"#,
                r#"{"name": "x", "tags": ["a"], "extra": 1}"#,
                r#"{"name": "x", "tags": ["a"]} "#,
                r#"["a"]"#,
            ],
        ),
        (tree(), &[r#"{"value": 1, "children": [{"children": []}]}"#, r#"{"value": "1"}"#]),
        (tagged(), &[r#"{"kind": "p", "y": 1}"#, r#"{"kind": "r", "x": 1}"#]),
        (any(), &["tru ", "{\"a\" 1}", "[1,]", "01", "\"\\x\""]),
        (
            bounded(),
            &[
                r#"{"code": "a"}"#,
                r#"{"code": "abcd"}"#,
                r#"{"code": "ab\n\t"}"#,
                r#"{"code": "ab", "note": "xy"}"#,
                "{\"code\": \"\u{e9}\u{e9}\u{e9}\u{e9}\"}",
                r#"{"code": "ab", "n": 13}"#,
                r#"{"code": "ab", "n": -3}"#,
                r#"{"code": "ab", "n": 05}"#,
                r#"{"code": "ab", "n": 1.5}"#,
                r#"{"code": "ab", "r": -1.5}"#,
                r#"{"code": "ab", "r": -1.50}"#,
                r#"{"code": "ab", "r": 2.2500000000000000000001}"#,
                r#"{"code": "ab", "r": 2.26}"#,
                r#"{"code": "ab", "r": 3}"#,
                r#"{"code": "ab", "r": 1e0}"#,
                r#"{"code": "ab", "r": .5}"#,
                r#"{"code": "ab", "r": 1.}"#,
                r#"{"code": "ab", "p": []}"#,
                r#"{"code": "ab", "p": ["x"]}"#,
                r#"{"code": "ab", "p": [1, 2]}"#,
                r#"{"code": "ab", "p": [1, "xy"]}"#,
                r#"{"code": "ab", "p": [1, "x", 13]}"#,
                r#"{"code": "ab", "p": [1, "x", 2, 3]}"#,
            ],
        ),
        (
            patterned(),
            &[
                r#"{"date": "123-a"}"#,
                r#"{"date": "12-"}"#,
                r#"{"date": "62-a"}"#,
                r#"{"date": "12-a", "tag": "a\"\n"}"#,
                r#"{"date": "12-a", "tag": ""}"#,
                r#"{"date": "12-a", "tag": "\u000a"}"#,
                r#"{"date": "12-a", "tag": "\t"}"#,
                "{\"date\": \"12-a\", \"tag\": \"\n\"}",
            ],
        ),
    ];
    for (schema, texts) in refused {
        for text in texts {
            assert_ne!(read(&schema, false, text.as_bytes()), Some(true), "read {text}");
        }
    }
    // Compact: no whitespace outside strings.
    assert_eq!(read(&person(), true, br#"{"name":"a b","tags":["a"]}"#), Some(true));
    assert_eq!(read(&person(), true, br#"{"name": "x","tags":["a"]}"#), None);
}

#[test]
fn nesting_stops_at_the_depth_limit() {
    let deep = |levels: usize| format!("{}1{}", "[".repeat(levels), "]".repeat(levels));
    // Each array a frame, and the number one more.
    assert_eq!(read(&any(), false, deep(MAX_DEPTH - 1).as_bytes()), Some(true));
    assert_eq!(read(&any(), false, deep(MAX_DEPTH).as_bytes()), None);
}

/// The mask a token at a time: what the trie walk must equal.
fn brute_force(vocab: &JsonVocabulary, dfa: &mut SchemaDfa, state: u32) -> TokenMask {
    let mut mask = TokenMask::none(vocab.num_tokens());
    for t in 0..vocab.num_tokens() as TokenId {
        let bytes = vocab.token_bytes(t);
        let reads = match bytes.is_empty() {
            true => t == vocab.num_tokens() as TokenId - 1 && dfa.is_complete(state),
            false => bytes.iter().try_fold(state, |s, &b| dfa.step(s, b)).is_some(),
        };
        if reads {
            mask.allow(t);
        }
    }
    // A state no token continues allows EOS (the vocabulary cannot write what it needs).
    if mask.num_allowed() == 0 {
        mask.allow(vocab.num_tokens() as TokenId - 1);
    }
    mask
}

/// Tokens for the schemas' keys and literals besides the JSON fragments.
const SCHEMA_TOKENS: [&str; 26] = [
    "name",
    "\"name\"",
    "\"tags\": [",
    "age",
    "extra",
    "\"kind",
    "\": \"p",
    "q\"",
    "x\"",
    "y",
    "value",
    "children\": [",
    "k",
    "i",
    "d",
    "v",
    "h",
    "m",
    "g",
    "o",
    "p",
    "c",
    "x",
    "q",
    "2",
    "\"value\": 1",
];

/// A seeded walk: tokens drawn among those each mask allows, until EOS; the text and whether it
/// ended. Each mask is checked against [`brute_force`].
fn generate(
    schema: &JsonSchema,
    vocab: &JsonVocabulary,
    masks: &mut JsonMasks,
    seed: u64,
    max: usize,
) -> (String, bool) {
    let format = ResponseFormat::JsonSchema { schema: Arc::new(schema.clone()), compact: false };
    let mut constraint = JsonConstraint::start(masks, &format, &[], None).unwrap();
    let mut check = schema_dfa(Arc::new(schema.clone()), false, 0);
    let pos = check.start();
    let mut state = check.state(&pos);
    let mut rng = SplitMix64(seed);
    let mut text = Vec::new();
    while text.len() < max {
        let mask = constraint.allowed().expect("no thinking to wait for");
        let want = brute_force(vocab, &mut check, state);
        assert_eq!(**mask, want, "seed {seed} after {:?}", String::from_utf8_lossy(&text));
        let token = draw(&mut rng, mask, vocab.num_tokens());
        if vocab.token_bytes(token).is_empty() {
            return (String::from_utf8(text).expect("UTF-8"), true);
        }
        text.extend_from_slice(vocab.token_bytes(token));
        for &b in vocab.token_bytes(token) {
            state = check.step(state, b).expect("an allowed token reads");
        }
        constraint.advance(token, masks);
        assert!(constraint.is_followed(), "a token the mask allowed did not read");
    }
    (String::from_utf8(text).expect("UTF-8"), false)
}

/// Whether `value` is one of `node`'s (the reduced schema's meaning, independent of the reader).
fn conforms(schema: &JsonSchema, node: Node, value: &Value) -> bool {
    match (schema.node(node), value) {
        (SchemaNode::Any, _) => true,
        (SchemaNode::Literals(texts), v) => {
            texts.iter().any(|t| serde_json::from_str::<Value>(t).unwrap() == *v)
        }
        (SchemaNode::String, Value::String(_)) => true,
        // serde_json reads `-0` as a float.
        (SchemaNode::BoundedInteger { minimum, maximum }, Value::Number(x)) => {
            x.as_f64().is_some_and(|x| {
                x.fract() == 0.0
                    && minimum.is_none_or(|lo| x >= lo as f64)
                    && maximum.is_none_or(|hi| x <= hi as f64)
            })
        }
        // Within an f64's precision: the walks write few places.
        (SchemaNode::BoundedNumber { minimum, maximum }, Value::Number(x)) => {
            let x = x.as_f64().unwrap();
            let value = |b: &NumberBound| b.units as f64 / NumberBound::ONE as f64;
            minimum.is_none_or(|b| x > value(&b) || (b.inclusive && x == value(&b)))
                && maximum.is_none_or(|b| x < value(&b) || (b.inclusive && x == value(&b)))
        }
        (SchemaNode::BoundedString { min_length, max_length }, Value::String(s)) => {
            let len = s.chars().count();
            len >= *min_length as usize && max_length.is_none_or(|max| len <= max as usize)
        }
        (SchemaNode::PatternString { pattern, min_length, max_length }, Value::String(s)) => {
            let len = s.chars().count();
            pattern.matches(s.as_bytes())
                && len >= *min_length as usize
                && max_length.is_none_or(|max| len <= max as usize)
        }
        (SchemaNode::Number { integer }, Value::Number(x)) => {
            !integer || x.is_i64() || x.is_u64() || x.as_f64().is_some_and(|f| f.fract() == 0.0)
        }
        (SchemaNode::Array { prefix_items, items, min_items, max_items }, Value::Array(a)) => {
            let item = |i: usize| prefix_items.get(i).copied().unwrap_or(*items);
            a.len() >= *min_items as usize
                && max_items.is_none_or(|max| a.len() <= max as usize)
                && a.iter().enumerate().all(|(i, v)| conforms(schema, item(i), v))
        }
        (SchemaNode::Object { properties }, Value::Object(o)) => {
            let key = |p: &Property| serde_json::from_str::<String>(&p.key).unwrap();
            o.keys().all(|k| properties.iter().any(|p| key(p) == *k))
                && properties.iter().all(|p| match o.get(&key(p)) {
                    Some(v) => conforms(schema, p.value, v),
                    None => !p.required,
                })
        }
        (SchemaNode::Map { values }, Value::Object(o)) => {
            o.values().all(|v| conforms(schema, *values, v))
        }
        (SchemaNode::AnyOf(alternatives), v) => {
            alternatives.iter().any(|&a| conforms(schema, a, v))
        }
        _ => false,
    }
}

#[test]
fn the_masks_allow_exactly_the_tokens_that_read_and_every_finished_walk_conforms() {
    let (_, vocab, mut masks) = vocabulary_with(&SCHEMA_TOKENS);
    let schemas = [
        ("person", person()),
        ("tree", tree()),
        ("tagged", tagged()),
        ("bounded", bounded()),
        ("patterned", patterned()),
    ];
    for (name, schema) in schemas {
        let mut finished = 0;
        for seed in 0..150 {
            let (text, ended) = generate(&schema, &vocab, &mut masks, seed, 300);
            if !ended {
                continue;
            }
            // Read without building the value first: `1e999` is JSON, out of an f64's range.
            serde_json::from_str::<serde::de::IgnoredAny>(&text)
                .unwrap_or_else(|e| panic!("{name} seed {seed}: {e}: {text}"));
            finished += 1;
            let Ok(value) = serde_json::from_str::<Value>(&text) else { continue };
            assert!(conforms(&schema, JsonSchema::ROOT, &value), "{name} seed {seed}: {text}");
        }
        assert!(finished > 20, "{name}: {finished} of 150 walks finished");
    }
}

#[test]
fn requests_with_equal_schemas_share_a_dfa_and_its_masks() {
    let (_, _, mut masks) = vocabulary_with(&SCHEMA_TOKENS);
    let format = |schema: JsonSchema| ResponseFormat::JsonSchema {
        schema: Arc::new(schema),
        compact: false,
    };
    let a = JsonConstraint::start(&mut masks, &format(person()), &[], None).unwrap();
    let b = JsonConstraint::start(&mut masks, &format(person()), &[], None).unwrap();
    assert!(Arc::ptr_eq(a.allowed().unwrap(), b.allowed().unwrap()));
    let c = JsonConstraint::start(&mut masks, &format(tree()), &[], None).unwrap();
    assert_eq!(a.allowed(), c.allowed(), "both begin with an object");
    assert!(!Arc::ptr_eq(a.allowed().unwrap(), c.allowed().unwrap()), "but not the same DFA");
}

#[test]
fn a_dfa_that_starts_again_keeps_every_position_where_it_was() {
    let schema = Arc::new(tree());
    let text = br#"{"value": 1, "children": [{"value": 2}, {"value": 3}]}"#;
    let mut small = schema_dfa(Arc::clone(&schema), false, 0).with_max_states(8);
    let mut pos = small.start();
    let mut generations = std::collections::HashSet::new();
    for &b in text {
        let state = small.state(&pos);
        let next = small.step(state, b).unwrap_or_else(|| panic!("refused {}", b as char));
        pos = small.pos(next);
        generations.insert(pos.generation());
    }
    assert!(generations.len() > 3, "it started again: {generations:?}");
    assert!(small.num_states() <= 8 + 1, "{} states", small.num_states());
    let state = small.state(&pos);
    assert!(small.is_complete(state));
}

#[test]
fn a_choice_is_exactly_one_of_its_texts() {
    let choices = ["yes", "no", "yes, sure"].map(String::from);
    let schema = JsonSchema::of_choices(&choices);
    for (text, want) in [("yes", Some(true)), ("yes, sure", Some(true)), ("yes,", Some(false))] {
        assert_eq!(read(&schema, true, text.as_bytes()), want, "{text}");
    }
    for text in [" yes", "\"yes\"", "nope", "yes ", "no."] {
        assert_eq!(read(&schema, true, text.as_bytes()), None, "{text}");
    }
}
