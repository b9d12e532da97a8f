use super::*;
use crate::json_mode::{
    JsonConstraint,
    tests::{draw, generate_like, vocabulary_with},
};
use routed_test_support::SplitMix64;
use routed_types::{Regex, ResponseFormat, TokenId};

fn dfa(text: &str) -> GrammarDfa {
    grammar_dfa(Arc::new(Grammar::new(text).unwrap_or_else(|e| panic!("{text:?}: {e}"))), 0)
}

/// The state after `text`, `None` once a byte cannot follow.
fn read(dfa: &mut GrammarDfa, text: &[u8]) -> Option<u32> {
    let start = dfa.start();
    let mut state = dfa.state(&start);
    for &b in text {
        state = dfa.step(state, b)?;
    }
    Some(state)
}

fn accepts(dfa: &mut GrammarDfa, text: &str) -> bool {
    read(dfa, text.as_bytes()).is_some_and(|s| dfa.is_complete(s))
}

/// Grammars that are regular, beside a regex that reads the same texts.
const REGULAR: [(&str, &str); 8] = [
    (r#"root ::= [a-c]+ ("x" | "yz")? [0-9]{2,3}"#, r"[a-c]+(x|yz)?[0-9]{2,3}"),
    (r#"root ::= ("ab" | "a")* "b""#, r"(ab|a)*b"),
    (r#"root ::= ("a"?)* "b""#, r"(a?)*b"),
    (r#"root ::= "ab"{0,3} "c"{2,}"#, r"(ab){0,3}c{2,}"),
    ("root ::= [α-ω]+ [^a-z]", r"[α-ω]+[^a-z]"),
    ("root ::= . \"!\"", r"(?s:.)!"),
    (
        "root ::= word (\" \" word)* \".\"\nword ::= [a-zA-Z\\u00e0-\\u00ff]+ # letters\n",
        r"[a-zA-Zà-ÿ]+( [a-zA-Zà-ÿ]+)*\.",
    ),
    ("root ::= ws \"x\" ws\nws ::= [ \\t\\n]*", r"[ \t\n]*x[ \t\n]*"),
];

/// Bytes a random text is drawn from: those the grammars read, UTF-8 pieces and a few others.
fn alphabet() -> Vec<u8> {
    let mut bytes: Vec<u8> = b"abcxyz09 .!\t\nAZ~".to_vec();
    bytes.extend("αβωéàÿ中😀".bytes());
    bytes.extend([0x80, 0xBF, 0xC0, 0xED, 0xF4, 0xFF]);
    bytes.sort_unstable();
    bytes.dedup();
    bytes
}

#[test]
fn regular_grammars_read_exactly_what_their_regexes_read() {
    let alphabet = alphabet();
    let mut rng = SplitMix64(7);
    for (text, pattern) in REGULAR {
        let mut dfa = dfa(text);
        let regex = Regex::new(pattern).unwrap();
        let start = dfa.start();
        let (mut num_live, mut num_complete) = (0, 0);
        for _ in 0..3000 {
            let (mut state, mut expected) = (dfa.state(&start), Some(regex.start()));
            for len in 0..24 {
                let (Some(g), Some(r)) = (Some(state), expected) else { unreachable!() };
                assert_eq!(dfa.is_complete(g), regex.is_match(r), "{text:?} at {len}");
                num_complete += usize::from(dfa.is_complete(g));
                // Mostly bytes the texts so far go on with, so that walks get somewhere.
                let b = match rng.next_u64() % 4 {
                    0 => alphabet[(rng.next_u64() % alphabet.len() as u64) as usize],
                    _ => match (0..=255u8)
                        .filter(|&b| regex.next(r, b).is_some())
                        .collect::<Vec<_>>()
                    {
                        next if next.is_empty() => break,
                        next => next[(rng.next_u64() % next.len() as u64) as usize],
                    },
                };
                expected = regex.next(r, b);
                match (dfa.step(g, b), expected) {
                    (Some(next), Some(_)) => state = next,
                    (None, None) => break,
                    (got, _) => panic!("{text:?}: byte {b:#x} at {len}: {got:?} vs {expected:?}"),
                }
                num_live += 1;
            }
        }
        assert!(num_live > 3_000 && num_complete > 100, "{text:?}: {num_live}, {num_complete}");
    }
}

/// Arithmetic over integers: not regular (parentheses nest).
const ARITHMETIC: &str = r#"
root ::= expr
expr ::= term (("+" | "-") term)*
term ::= factor (("*" | "/") factor)*
factor ::= [0-9]+ | "(" expr ")" | "-" factor
"#;

#[test]
fn nested_texts_are_read_to_any_depth_within_the_limit() {
    let mut dfa = dfa(ARITHMETIC);
    for text in ["1", "12+3*4", "(1+2)*3", "-(4/2)", "((((7))))", "1-2-3-4", "--1"] {
        assert!(accepts(&mut dfa, text), "{text}");
    }
    for text in ["", "1+", "(1+2", "(1+2))", "1++2", "()", "1 + 2", "*1"] {
        assert!(!accepts(&mut dfa, text), "{text}");
    }
    // Prefixes that can go on, and bytes that cannot.
    for text in ["(", "((1+", "1*(", "-"] {
        assert!(read(&mut dfa, text.as_bytes()).is_some(), "{text}");
    }
    for text in ["1)", "(+", "a", "1(", ")"] {
        assert!(read(&mut dfa, text.as_bytes()).is_none(), "{text}");
    }
    let deep = format!("{}1{}", "(".repeat(60), ")".repeat(60));
    assert!(accepts(&mut dfa, &deep));
    assert!(!accepts(&mut dfa, &deep[..deep.len() - 1]));
}

#[test]
fn a_rule_that_recurses_at_its_tail_reads_any_count_in_a_few_states() {
    let mut dfa = dfa(r#"root ::= ("ab" | "c")* "."
"#);
    let text = format!("{}.", "abc".repeat(5000));
    assert!(accepts(&mut dfa, &text));
    assert!(dfa.num_states() <= 4, "{} states", dfa.num_states());
}

#[test]
fn a_text_nesting_past_the_depth_limit_is_not_read() {
    // Each pair of brackets stacks a position: the limit cuts the nesting off, never the
    // reader.
    let mut dfa = dfa(r#"root ::= "[" root? "]""#);
    let fits = format!("{}{}", "[".repeat(200), "]".repeat(200));
    assert!(accepts(&mut dfa, &fits));
    assert!(read(&mut dfa, "[".repeat(MAX_DEPTH + 1).as_bytes()).is_none());
}

#[test]
fn a_grammar_walk_allows_exactly_what_its_regex_allows() {
    let (_, vocab, mut masks) = vocabulary_with(&[]);
    for (text, pattern) in [
        (
            r#"root ::= ("true" | "false") ("," " "? ("true" | "false"))*"#,
            r"(true|false)(, ?(true|false))*",
        ),
        (r#"root ::= [0-5]{2} ("." [0-5]+)?"#, r"[0-5]{2}(\.[0-5]+)?"),
        (r#"root ::= ("é" | "中")+ "!"?"#, "(é|中)+!?"),
        (
            r#"root ::= "{" ("\"" [a-z]+ "\": " [01] ","? " "?)* "}""#,
            r#"\{("[a-z]+": [01],? ?)*\}"#,
        ),
    ] {
        let format = ResponseFormat::Grammar(Arc::new(Grammar::new(text).unwrap()));
        let regex = Regex::new(pattern).unwrap();
        let finished = (0..100)
            .filter_map(|seed| generate_like(&format, &regex, &vocab, &mut masks, seed))
            .inspect(|out| assert!(regex.matches(out.as_bytes()), "{text}: {out:?}"))
            .count();
        assert!(finished > 20, "{text}: {finished} of 100 walks finished");
    }
}

/// Whether `text` is a bracketed list of `0`, `1` and lists, read by hand.
fn is_list(text: &[u8]) -> bool {
    fn list(text: &[u8]) -> Option<&[u8]> {
        let mut rest = text.strip_prefix(b"[")?;
        if let Some(after) = rest.strip_prefix(b"]") {
            return Some(after);
        }
        loop {
            rest = match rest.first()? {
                b'0' | b'1' => &rest[1..],
                b'[' => list(rest)?,
                _ => return None,
            };
            match rest.first()? {
                b',' => rest = &rest[1..],
                b']' => return Some(&rest[1..]),
                _ => return None,
            }
        }
    }
    list(text).is_some_and(<[u8]>::is_empty)
}

#[test]
fn nested_lists_walked_through_the_vocabulary_are_lists() {
    let grammar = "root ::= \"[\" (item (\",\" item)*)? \"]\"\nitem ::= [01] | root";
    // EOS is the vocabulary's last token.
    let (_, vocab, mut masks) = vocabulary_with(&["[[", "]]", "],", ",["]);
    let format = ResponseFormat::Grammar(Arc::new(Grammar::new(grammar).unwrap()));
    let mut finished = 0;
    for seed in 0..200 {
        let mut rng = SplitMix64(seed);
        let mut constraint = JsonConstraint::start(&mut masks, &format, &[], None).unwrap();
        let mut text = Vec::new();
        while text.len() < 48 {
            let mask = Arc::clone(constraint.allowed().expect("no thinking"));
            let token = draw(&mut rng, &mask, vocab.num_tokens());
            if token as usize == vocab.num_tokens() - 1 {
                assert!(is_list(&text), "seed {seed}: {:?}", String::from_utf8_lossy(&text));
                finished += 1;
                break;
            }
            text.extend_from_slice(vocab.token_bytes(token));
            constraint.advance(token, &mut masks);
            assert!(constraint.is_followed(), "seed {seed}: an allowed token did not read");
        }
    }
    assert!(finished > 50, "{finished} of 200 walks finished");
}

#[test]
fn requests_with_equal_grammars_share_the_dfa_and_its_masks() {
    let (tokens, _, mut masks) = vocabulary_with(&[]);
    let id = |text: &str| {
        tokens.iter().position(|t| t.as_deref() == Some(text.as_bytes())).unwrap() as TokenId
    };
    let eos = tokens.len() as TokenId - 1;
    let format =
        || ResponseFormat::Grammar(Arc::new(Grammar::new(r#"root ::= "1"+ "0""#).unwrap()));
    let mut a = JsonConstraint::start(&mut masks, &format(), &[], None).unwrap();
    let b = JsonConstraint::start(&mut masks, &format(), &[], None).unwrap();
    assert!(Arc::ptr_eq(a.allowed().unwrap(), b.allowed().unwrap()));
    assert!(!a.allowed().unwrap().allows(id("0")) && !a.allowed().unwrap().allows(eos));
    a.advance(id("1"), &mut masks);
    a.advance(id("0"), &mut masks);
    assert_eq!(a.allowed().unwrap().num_allowed(), 1);
    assert!(a.allowed().unwrap().allows(eos));
    a.advance(eos, &mut masks);
    assert!(a.is_followed());
    // A token the mask did not allow frees the sequence from the grammar.
    let mut c = JsonConstraint::start(&mut masks, &format(), &[], None).unwrap();
    c.advance(id("0"), &mut masks);
    assert!(!c.is_followed());
}

#[test]
fn a_long_chain_of_rules_before_a_byte_is_settled_without_deep_calls() {
    // Twenty thousand rules each naming the next at its tail, the last closing the cycle:
    // every step expands the whole chain (on a thread with a small stack, which calls nested
    // that deep would overflow).
    let n = 20_000;
    let mut text = String::from("root ::= r1 \"!\"\nr1 ::= r2 | \"a\"\n");
    for i in 2..n {
        text.push_str(&format!("r{i} ::= r{}\n", i + 1));
    }
    text.push_str(&format!("r{n} ::= r1 | \"z\"\n"));
    let settled = std::thread::Builder::new()
        .stack_size(256 << 10)
        .spawn(move || {
            let mut dfa = dfa(&text);
            (accepts(&mut dfa, "a!"), accepts(&mut dfa, "z!"), accepts(&mut dfa, "aa!"))
        })
        .unwrap()
        .join()
        .expect("no stack overflow");
    assert_eq!(settled, (true, true, false));
}

#[test]
fn a_dfa_past_its_byte_budget_starts_again_and_keeps_every_position() {
    // Each bracket opens a state with a deeper stack: 4 KiB of stacks fill within a few
    // dozen, and the DFA starts again while the reader goes on.
    let grammar = Arc::new(Grammar::new(r#"root ::= "[" root? "]""#).unwrap());
    let mut small = grammar_dfa(grammar, 0).with_max_config_bytes(4 << 10);
    let mut pos = small.start();
    let text = format!("{}{}", "[".repeat(120), "]".repeat(120));
    let mut generations = std::collections::HashSet::new();
    for &b in text.as_bytes() {
        let state = small.state(&pos);
        let next = small.step(state, b).unwrap_or_else(|| panic!("refused {}", b as char));
        pos = small.pos(next);
        generations.insert(pos.generation());
    }
    assert!(generations.len() > 2, "{} generations", generations.len());
    let state = small.state(&pos);
    assert!(small.is_complete(state));
}
