use super::*;
use routed_test_support::SplitMix64;
use routed_types::{Regex, ResponseFormat};
use std::sync::Arc;

fn reads(text: &[u8]) -> Option<JsonState> {
    let mut state = JsonState::start();
    state.feed_all(text).then_some(state)
}

const VALID: &[&str] = &[
    "{}",
    " \n{ }",
    r#"{"a": 1}"#,
    r#"{"a": [1, -2.5e+3, 0, 0.25, 1E9, true, false, null, [], {}], "c": {"d": [[]]}}"#,
    "{\"s\": \"x\\n\\t\\\"\\\\\\/\\u00e9\\uD7FF é 中 🦀\"}",
    "{\"k\"\r\n:\t\"v\" ,\"\":\"\"}",
];

#[test]
fn whole_objects_are_read_and_complete() {
    for text in VALID {
        serde_json::from_str::<serde_json::Value>(text).expect("the examples are JSON");
        let state = reads(text.as_bytes()).unwrap_or_else(|| panic!("refused {text}"));
        assert!(state.is_complete(), "{text}");
        // Every proper prefix reads and is incomplete.
        for cut in 0..text.len() {
            let state = reads(&text.as_bytes()[..cut]).unwrap_or_else(|| panic!("{text} at {cut}"));
            assert!(!state.is_complete(), "{text} complete at {cut}");
        }
    }
}

#[test]
fn what_is_not_a_json_object_is_refused_at_the_first_bad_byte() {
    for text in [
        "[1]",
        "\"s\"",
        "1",
        "{\"a\" 1}",
        "{\"a\": 01}",
        "{\"a\": -}",
        "{\"a\": 1.}",
        "{\"a\": 1e}",
        "{\"a\": tru }",
        "{\"a\": nul}",
        "{,}",
        "{\"a\": 1,}",
        "{\"a\": 1]",
        "{\"a\": [1}",
        "{a: 1}",
        "{'a': 1}",
        "{\"a\": \"\x01\"}",
        "{\"a\": \"\\x\"}",
        "{\"a\": \"\\u12g4\"}",
        "{\"a\": \"\\ud800\"}",
        "{\"a\": \"\\uDC00\"}",
        "{} ",
        "{}{}",
        "{\"a\": +1}",
    ] {
        assert!(reads(text.as_bytes()).is_none(), "read {text:?}");
    }
    // Bytes that are not UTF-8 inside a string.
    for bad in [
        &b"{\"a\": \"\xC0\x80\"}"[..],
        b"{\"a\": \"\xE4\xB8\"}",
        b"{\"a\": \"\x80\"}",
        b"{\"\xFF\": 1}",
    ] {
        assert!(reads(bad).is_none(), "read {bad:?}");
    }
}

#[test]
fn nesting_stops_at_the_depth_limit() {
    let mut text = String::from("{\"a\": ");
    text.push_str(&"[".repeat(MAX_JSON_DEPTH as usize - 1));
    assert!(reads(text.as_bytes()).is_some());
    text.push('[');
    assert!(reads(text.as_bytes()).is_none());
}

/// A small vocabulary of JSON fragments (and some that fit nowhere), with EOS and a special
/// token.
fn vocabulary() -> (Vec<Option<Vec<u8>>>, Arc<JsonVocabulary>, JsonMasks) {
    vocabulary_with(&[])
}

/// [`vocabulary`]'s tokens and `extra` ones, then the special token and EOS (the last).
pub(crate) fn vocabulary_with(
    extra: &[&str],
) -> (Vec<Option<Vec<u8>>>, Arc<JsonVocabulary>, JsonMasks) {
    let mut tokens: Vec<Option<Vec<u8>>> = [
        "{",
        "}",
        "[",
        "]",
        "\"",
        ":",
        ",",
        " ",
        "\n",
        "{\"",
        "\":",
        "\": ",
        "\",",
        "\"}",
        "},",
        "}}",
        "]}",
        "a",
        "b",
        "key",
        "1",
        "0",
        "-",
        ".",
        "5",
        "e",
        "+",
        "true",
        "tr",
        "ue",
        "false",
        "null",
        "\\",
        "n",
        "u",
        "00",
        "e9",
        "d8",
        "\\u",
        "é",
        "\u{1F980}",
        "x y",
        "{}",
        "[]",
        "1,",
        "0.",
        ",\"",
        "\"a\"",
        "{\"a\": ",
        "abc\"",
        "\" ",
        "D",
        "7F",
        "FF",
        "l",
        "s",
        "r",
        "t",
        "f",
        // Whole escapes, which fit in any string.
        "\\n",
        "a\\\"b",
    ]
    .iter()
    .chain(extra)
    .map(|s| Some(s.as_bytes().to_vec()))
    .collect();
    tokens.push(Some(vec![0xE4])); // a character's first byte alone
    tokens.push(Some(vec![0xB8, 0xAD])); // ... and its rest
    tokens.push(None); // a special token
    tokens.push(None); // EOS
    let eos = tokens.len() as TokenId - 1;
    let vocab = Arc::new(JsonVocabulary::new(&tokens, &[eos]));
    let masks = JsonMasks::new(Arc::clone(&vocab));
    (tokens, vocab, masks)
}

/// The mask a token at a time: what the trie walk must equal.
fn brute_force(tokens: &[Option<Vec<u8>>], vocab: &JsonVocabulary, state: JsonState) -> TokenMask {
    let mut mask = TokenMask::none(tokens.len());
    for t in 0..tokens.len() as TokenId {
        if vocab.advance(state, t).is_some() {
            mask.allow(t);
        }
    }
    mask
}

/// A token drawn among those `mask` allows.
pub(crate) fn draw(rng: &mut SplitMix64, mask: &TokenMask, num_tokens: usize) -> TokenId {
    let allowed: Vec<TokenId> = (0..num_tokens as TokenId).filter(|&t| mask.allows(t)).collect();
    allowed[(rng.next_u64() % allowed.len() as u64) as usize]
}

/// A seeded walk through the vocabulary: tokens drawn among those each mask allows, until EOS.
fn generate(
    vocab: &JsonVocabulary,
    masks: &mut JsonMasks,
    seed: u64,
    max: usize,
) -> (Vec<TokenId>, bool) {
    let mut rng = SplitMix64(seed);
    let mut constraint =
        JsonConstraint::start(masks, &ResponseFormat::JsonObject, &[], None).unwrap();
    let mut out = Vec::new();
    while out.len() < max {
        let mask = constraint.allowed().expect("no thinking to wait for");
        let token = draw(&mut rng, mask, vocab.num_tokens());
        if vocab.eos.contains(&token) {
            return (out, true);
        }
        out.push(token);
        constraint.advance(token, masks);
        assert!(constraint.is_followed(), "a token the mask allowed did not read");
    }
    (out, false)
}

#[test]
fn the_trie_walk_allows_exactly_the_tokens_that_read_and_eos_only_when_complete() {
    let (tokens, vocab, mut masks) = vocabulary();
    let mut num_states = 0;
    for seed in 0..200 {
        let (out, _) = generate(&vocab, &mut masks, seed, 60);
        let mut state = JsonState::start();
        for &t in &out {
            assert_eq!(vocab.mask(state), brute_force(&tokens, &vocab, state), "seed {seed}");
            state = vocab.advance(state, t).unwrap();
            num_states += 1;
        }
    }
    assert!(num_states > 5000);
    let special = tokens.len() as TokenId - 2;
    let eos = special + 1;
    let start = vocab.mask(JsonState::start());
    assert!(!start.allows(special) && !start.allows(eos) && start.allows(0) && start.allows(7));
    // `{`, `{"`, `{}`, `{"a": `, a space and a newline.
    assert_eq!(start.num_allowed(), 6, "{start:?}");
    let done = vocab.mask(reads(b"{}").unwrap());
    assert_eq!((done.num_allowed(), done.allows(eos)), (1, true));
}

#[test]
fn every_finished_walk_is_a_json_object() {
    let (_, vocab, mut masks) = vocabulary();
    let mut finished = 0;
    for seed in 0..400 {
        let (out, ended) = generate(&vocab, &mut masks, seed, 400);
        let text: Vec<u8> = out.iter().flat_map(|&t| vocab.token_bytes(t).to_vec()).collect();
        if ended {
            // Read without building the value: `1e999` is JSON, out of an f64's range.
            serde_json::from_slice::<serde::de::IgnoredAny>(&text)
                .unwrap_or_else(|e| panic!("seed {seed}: {e}: {}", String::from_utf8_lossy(&text)));
            assert_eq!(text.iter().find(|b| !b.is_ascii_whitespace()), Some(&b'{'));
            finished += 1;
        }
    }
    assert!(finished > 50, "{finished} of 400 walks closed their object");
}

#[test]
fn a_token_that_cannot_follow_frees_the_sequence_and_masks_are_shared_by_state() {
    let (tokens, _, mut masks) = vocabulary();
    let mut a = JsonConstraint::start(&mut masks, &ResponseFormat::JsonObject, &[], None).unwrap();
    let b = JsonConstraint::start(&mut masks, &ResponseFormat::JsonObject, &[], None).unwrap();
    assert!(Arc::ptr_eq(a.allowed().unwrap(), b.allowed().unwrap()));
    a.advance(17, &mut masks); // `a` cannot start the output
    assert!(!a.is_followed());
    assert_eq!(a.allowed().unwrap().num_allowed(), tokens.len());
}

#[test]
fn a_compact_object_has_no_whitespace_outside_its_strings() {
    let read = |text: &[u8]| {
        let mut state = JsonState::start_compact();
        state.feed_all(text).then_some(state)
    };
    assert!(read(b"{\"a b\":[1,{\"c\":\" \\n \"}]}").is_some_and(|s| s.is_complete()));
    for text in [
        &b" {}"[..],
        b"{ }",
        b"{\"a\": 1}",
        b"{\"a\":1 }",
        b"{\"a\":[1, 2]}",
        b"{\"a\":1,\n\"b\":2}",
    ] {
        assert!(read(text).is_none(), "read {:?}", String::from_utf8_lossy(text));
    }
    let (tokens, vocab, mut masks) = vocabulary();
    let id = |text: &str| {
        tokens.iter().position(|t| t.as_deref() == Some(text.as_bytes())).unwrap() as TokenId
    };
    let (space, newline) = (id(" "), id("\n"));
    for state in
        [JsonState::start_compact(), read(b"{\"a\":").unwrap(), read(b"{\"a\":[1").unwrap()]
    {
        let mask = vocab.mask(state);
        assert!(
            mask.num_allowed() > 0 && !mask.allows(space) && !mask.allows(newline),
            "{state:?}"
        );
    }
    // A token ending in a space after the colon: the loose form only.
    let start = vocab.mask(JsonState::start_compact());
    assert!(start.allows(id("{\"")) && !start.allows(id("{\"a\": ")));
    assert!(vocab.mask(JsonState::start()).allows(id("{\"a\": ")));
    let after_key = vocab.mask(read(b"{\"a").unwrap());
    assert!(after_key.allows(id("\":")) && !after_key.allows(id("\": ")));
    // Inside a string, whitespace is text.
    let in_string = masks.mask(read(b"{\"a\":\"x").unwrap());
    assert!(in_string.allows(space) && in_string.allows(id("x y")));
}

#[test]
fn tokens_that_fit_any_string_end_between_characters() {
    for fits in [&b"abc"[..], b" x y", b"\\n", b"a\\\"b", b"\\u00e9", "é中".as_bytes()] {
        assert!(fits_any_string(fits), "{:?}", String::from_utf8_lossy(fits));
    }
    for not in [&b"\""[..], b"a\"", b"\\", b"\\u00", &[0xE4], &[0xB8, 0xAD], b"\x01"] {
        assert!(!fits_any_string(not), "{:?}", String::from_utf8_lossy(not));
    }
    let (tokens, vocab, _) = vocabulary();
    let walked =
        tokens.iter().filter(|t| t.as_deref().is_some_and(|b| !fits_any_string(b))).count();
    assert_eq!(vocab.num_in_any_string() + walked + 2, tokens.len(), "two special tokens");
}

/// The heap a vocabulary reports holds at least its tokens' bytes, their offsets and the
/// in-any-string mask, and grows with the vocabulary.
#[test]
fn a_vocabularys_heap_covers_its_tables() {
    let (tokens, vocab, _) = vocabulary();
    let text: usize = tokens.iter().flatten().map(Vec::len).sum();
    let floor = text + 4 * (tokens.len() + 1) + 8 * tokens.len().div_ceil(64);
    assert!(vocab.heap_bytes() >= floor, "{} < {floor}", vocab.heap_bytes());
    let mut more = tokens.clone();
    more.extend((0..1000).map(|i| Some(format!("\"k{i}\"").into_bytes())));
    let bigger = JsonVocabulary::new(&more, &[0]);
    assert!(bigger.heap_bytes() > vocab.heap_bytes() + 5 * 1000);
}

/// A seeded walk constrained to `regex`, each mask checked against a token-by-token reading:
/// the text when EOS came.
fn generate_regex(
    regex: &Arc<Regex>,
    vocab: &JsonVocabulary,
    masks: &mut JsonMasks,
    seed: u64,
) -> Option<String> {
    generate_like(&ResponseFormat::Regex(Arc::clone(regex)), regex, vocab, masks, seed)
}

/// A seeded walk under `format`, each mask checked against the tokens that `regex` (which
/// reads the same texts) reads whole, EOS where it matches; the text, if EOS ended it.
pub(crate) fn generate_like(
    format: &ResponseFormat,
    regex: &Regex,
    vocab: &JsonVocabulary,
    masks: &mut JsonMasks,
    seed: u64,
) -> Option<String> {
    let mut constraint = JsonConstraint::start(masks, format, &[], None).unwrap();
    let (mut rng, mut text, mut state) = (SplitMix64(seed), Vec::new(), regex.start());
    while text.len() < 64 {
        let mask = constraint.allowed().expect("no thinking to wait for");
        let mut want = TokenMask::none(vocab.num_tokens());
        for t in 0..vocab.num_tokens() as TokenId {
            let bytes = vocab.token_bytes(t);
            let reads = match vocab.eos.contains(&t) {
                true => regex.is_match(state),
                false => {
                    !bytes.is_empty()
                        && bytes.iter().try_fold(state, |s, &b| regex.next(s, b)).is_some()
                }
            };
            if reads {
                want.allow(t);
            }
        }
        assert_eq!(
            **mask,
            want,
            "{format:?} seed {seed} after {:?}",
            String::from_utf8_lossy(&text)
        );
        let token = draw(&mut rng, mask, vocab.num_tokens());
        if vocab.eos.contains(&token) {
            return Some(String::from_utf8(text).expect("the regex reads UTF-8 only"));
        }
        for &b in vocab.token_bytes(token) {
            state = regex.next(state, b).expect("an allowed token reads");
        }
        text.extend_from_slice(vocab.token_bytes(token));
        constraint.advance(token, masks);
        assert!(constraint.is_followed(), "a token the mask allowed did not read");
    }
    None
}

#[test]
fn a_regex_walk_allows_exactly_the_tokens_that_read_and_ends_on_a_match() {
    let (_, vocab, mut masks) = vocabulary();
    for pattern in [
        r"(true|false)",
        r"[0-5]{2}(\.[0-5]+)?",
        r"\{(\x22[a-z]+\x22: [01],? ?)*\}",
        "(é|中)+!?",
        r"[a-z]+( [a-z]+)*\.",
    ] {
        let regex = Arc::new(Regex::new(pattern).unwrap());
        let mut finished = 0;
        for seed in 0..100 {
            let Some(text) = generate_regex(&regex, &vocab, &mut masks, seed) else { continue };
            assert!(regex.matches(text.as_bytes()), "{pattern} seed {seed}: {text:?}");
            finished += 1;
        }
        assert!(finished > 20, "{pattern}: {finished} of 100 walks finished");
    }
}

#[test]
fn requests_with_equal_regexes_share_their_masks_and_eos_ends_only_a_match() {
    let (tokens, _, mut masks) = vocabulary();
    let id = |text: &str| {
        tokens.iter().position(|t| t.as_deref() == Some(text.as_bytes())).unwrap() as TokenId
    };
    let eos = tokens.len() as TokenId - 1;
    let format = || ResponseFormat::Regex(Arc::new(Regex::new("1+0").unwrap()));
    let mut a = JsonConstraint::start(&mut masks, &format(), &[], None).unwrap();
    let b = JsonConstraint::start(&mut masks, &format(), &[], None).unwrap();
    assert!(Arc::ptr_eq(a.allowed().unwrap(), b.allowed().unwrap()));
    let first = a.allowed().unwrap();
    assert!(first.allows(id("1")) && !first.allows(id("0")) && !first.allows(eos));
    a.advance(id("1"), &mut masks);
    assert!(a.allowed().unwrap().allows(id("0")) && !a.allowed().unwrap().allows(eos));
    a.advance(id("0"), &mut masks);
    // The match cannot go on: EOS alone.
    assert_eq!(a.allowed().unwrap().num_allowed(), 1);
    assert!(a.allowed().unwrap().allows(eos));
    a.advance(eos, &mut masks);
    assert!(a.is_followed());
}

#[test]
fn a_token_set_allows_exactly_its_tokens_from_the_first_and_is_shared() {
    let (tokens, vocab, mut masks) = vocabulary();
    let id = |text: &str| {
        tokens.iter().position(|t| t.as_deref() == Some(text.as_bytes())).unwrap() as TokenId
    };
    let eos = tokens.len() as TokenId - 1;
    let ids: Arc<[TokenId]> = {
        let mut ids = vec![id("a"), id("b"), eos];
        ids.sort_unstable();
        ids.into()
    };
    let format = || ResponseFormat::Tokens(Arc::clone(&ids));
    let mut a = JsonConstraint::start(&mut masks, &format(), &[], None).unwrap();
    let b = JsonConstraint::start(&mut masks, &format(), &[], None).unwrap();
    let first = Arc::clone(a.allowed().unwrap());
    assert!(Arc::ptr_eq(&first, b.allowed().unwrap()), "equal sets share their mask");
    let allowed: Vec<TokenId> =
        (0..vocab.num_tokens() as TokenId).filter(|&t| first.allows(t)).collect();
    assert_eq!(allowed, *ids);
    for token in [id("a"), id("b"), id("a")] {
        a.advance(token, &mut masks);
        assert!(a.is_followed() && Arc::ptr_eq(a.allowed().unwrap(), &first));
    }
    // A token outside the set frees the sequence.
    a.advance(id("key"), &mut masks);
    assert!(!a.is_followed());
}

#[test]
fn a_structural_tag_walk_allows_exactly_the_tokens_that_read_and_ends_in_free_text() {
    use crate::{lazy_dfa::Nfa, structural_tag::tag_dfa};
    use routed_types::{JsonSchema, StructuralTag, TagStructure};
    let (_, vocab, mut masks) = vocabulary_with(&["<", "<a>", "</a>", "a>", "22", "<a", "/", ">"]);
    let schema = Arc::new(JsonSchema::of_choices(&["1".to_owned(), "22".to_owned()]));
    let structure = TagStructure { begin: "<a>".into(), schema, end: "</a>".into() };
    let tag = Arc::new(StructuralTag::new(vec![structure], vec!["<".into()]));
    let dfa = tag_dfa(Arc::clone(&tag), 0);
    let reader = dfa.nfa();
    let format = ResponseFormat::StructuralTag(tag);
    let (mut num_structures, mut num_finished) = (0, 0);
    for seed in 0..100 {
        let mut constraint = JsonConstraint::start(&mut masks, &format, &[], None).unwrap();
        let (mut rng, mut text, mut configs) = (SplitMix64(seed), Vec::new(), reader.start());
        while text.len() < 64 {
            // The mask a token at a time: each token's bytes read by the reader itself.
            let mut want = TokenMask::none(vocab.num_tokens());
            for t in 0..vocab.num_tokens() as TokenId {
                let bytes = vocab.token_bytes(t);
                let reads = match vocab.eos.contains(&t) {
                    true => reader.is_complete(&configs),
                    false => {
                        let read =
                            bytes.iter().try_fold(configs.clone(), |c, &b| reader.step(&c, b));
                        !bytes.is_empty() && read.is_some()
                    }
                };
                if reads {
                    want.allow(t);
                }
            }
            let mask = constraint.allowed().expect("no thinking to wait for");
            assert_eq!(**mask, want, "seed {seed} after {:?}", String::from_utf8_lossy(&text));
            let token = draw(&mut rng, mask, vocab.num_tokens());
            if vocab.eos.contains(&token) {
                num_finished += 1;
                break;
            }
            for &b in vocab.token_bytes(token) {
                configs = reader.step(&configs, b).expect("an allowed token reads");
            }
            text.extend_from_slice(vocab.token_bytes(token));
            constraint.advance(token, &mut masks);
            assert!(constraint.is_followed(), "a token the mask allowed did not read");
        }
        // Every trigger opened a structure: past the whole ones, a '<' only begins the last,
        // unfinished one (and none is left when EOS ended the text).
        let text = String::from_utf8_lossy(&text);
        let (whole, rest) = structures_read(&text);
        num_structures += whole;
        assert!(!rest.contains('<') || text.len() >= 64, "seed {seed}: {text:?}");
    }
    assert!(num_structures > 10 && num_finished > 10, "{num_structures} {num_finished}");
}

/// The structures `<a>` (whitespace) `1` or `22` (whitespace) `</a>` that `text` writes whole,
/// and the text after the last one: where a structure is cut short, from its `<`.
fn structures_read(text: &str) -> (usize, &str) {
    let mut rest = text;
    let mut whole = 0;
    while let Some(at) = rest.find('<') {
        let after = rest[at..].strip_prefix("<a>").map(str::trim_start);
        let value = after.and_then(|a| a.strip_prefix("22").or_else(|| a.strip_prefix('1')));
        match value.and_then(|v| v.trim_start().strip_prefix("</a>")) {
            Some(next) => (rest, whole) = (next, whole + 1),
            None => return (whole, &rest[at..]),
        }
    }
    (whole, rest)
}
