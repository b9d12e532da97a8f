use super::*;

fn refused(text: &str) -> String {
    Grammar::new(text).expect_err(text).to_string()
}

/// The elements of each alternative of `rule`.
fn alternatives(g: &Grammar, rule: u32) -> Vec<Vec<GrammarElement>> {
    g.alternatives(rule).iter().map(|&start| g.run(start).collect()).collect()
}

fn byte(b: u8) -> GrammarElement {
    GrammarElement::Byte { lo: b, hi: b }
}

#[test]
fn literals_and_escapes_lower_to_bytes() {
    let g = Grammar::new(r#"root ::= "a\n\t\"\\\x41\u00e9\U0001F600""#).unwrap();
    let mut expected: Vec<_> = b"a\n\t\"\\A".iter().map(|&b| byte(b)).collect();
    expected.extend("é😀".bytes().map(byte));
    assert_eq!(alternatives(&g, g.root()), vec![expected]);
}

#[test]
fn rules_span_lines_or_sit_one_a_line() {
    let one_a_line = "root ::= a b # a comment\na ::= \"x\" | \"y\"\nb ::= \"z\"\n";
    let spread = "# leading comment\nroot ::=\n  a\n  b\na ::=\n  \"x\"\n  | \"y\"\nb ::= \"z\"";
    for text in [one_a_line, spread] {
        let g = Grammar::new(text).unwrap();
        assert_eq!(
            alternatives(&g, g.root()),
            vec![vec![GrammarElement::Rule(1), GrammarElement::Rule(2)]]
        );
        assert_eq!(alternatives(&g, 1), vec![vec![byte(b'x')], vec![byte(b'y')]]);
        assert_eq!(alternatives(&g, 2), vec![vec![byte(b'z')]]);
    }
}

#[test]
fn classes_lower_to_byte_ranges_by_encoding_length() {
    // ASCII only: one range, in place.
    let g = Grammar::new("root ::= [a-z]").unwrap();
    assert_eq!(alternatives(&g, g.root()), vec![vec![GrammarElement::Byte { lo: b'a', hi: b'z' }]]);
    // Two ranges, or characters of two lengths: a rule with an alternative per run.
    let g = Grammar::new("root ::= [a-cé]").unwrap();
    let [GrammarElement::Rule(class)] = alternatives(&g, g.root())[0][..] else { panic!() };
    let encoded: Vec<u8> = "é".bytes().collect();
    assert_eq!(
        alternatives(&g, class),
        vec![
            vec![GrammarElement::Byte { lo: b'a', hi: b'c' }],
            vec![byte(encoded[0]), byte(encoded[1])],
        ]
    );
}

#[test]
fn negated_classes_and_any_leave_out_surrogates() {
    let g = Grammar::new(r#"root ::= [^"\\] ."#).unwrap();
    for rule in [1, 2] {
        let runs = alternatives(&g, rule);
        // No run starts with 0xED followed by 0xA0..=0xBF (a surrogate's encoding).
        for run in &runs {
            if let [
                GrammarElement::Byte { lo: 0xED, hi: 0xED },
                GrammarElement::Byte { hi, .. },
                ..,
            ] = run[..]
            {
                assert!(hi < 0xA0, "{run:?}");
            }
        }
        // Every length of encoding is there.
        for len in 1..=4 {
            assert!(runs.iter().any(|r| r.len() == len), "rule {rule}: no {len}-byte run");
        }
    }
    let [_, ref first_ascii, ..] = alternatives(&g, 1)[..] else { panic!() };
    assert_eq!(*first_ascii, vec![GrammarElement::Byte { lo: 0x23, hi: 0x5B }]);
}

#[test]
fn repetitions_count_out() {
    // x{2,4}: two in place, then two optional levels.
    let g = Grammar::new(r#"root ::= "x"{2,4}"#).unwrap();
    let [a, b, GrammarElement::Rule(outer)] = alternatives(&g, g.root())[0][..] else { panic!() };
    assert_eq!((a, b), (byte(b'x'), byte(b'x')));
    let [ref more, ref none] = alternatives(&g, outer)[..] else { panic!() };
    assert!(none.is_empty());
    let [x, GrammarElement::Rule(inner)] = more[..] else { panic!("{more:?}") };
    assert_eq!(x, byte(b'x'));
    assert_eq!(alternatives(&g, inner), vec![vec![byte(b'x')], vec![]]);
    // x*: a rule reading x then itself, or nothing.
    let g = Grammar::new(r#"root ::= "x"*"#).unwrap();
    let [GrammarElement::Rule(star)] = alternatives(&g, g.root())[0][..] else { panic!() };
    assert_eq!(alternatives(&g, star), vec![vec![byte(b'x'), GrammarElement::Rule(star)], vec![]]);
    // x{3}: three in place.
    let g = Grammar::new(r#"root ::= "x"{3} "y"{0}"#).unwrap();
    assert_eq!(alternatives(&g, g.root()), vec![vec![byte(b'x'); 3]]);
}

#[test]
fn bad_grammars_are_refused_with_where_and_why() {
    let cases = [
        ("root ::= \"a\"\nroot ::= \"b\"", "line 2, column 1: rule root is defined twice"),
        ("start ::= \"a\"", "no rule named root"),
        ("root ::= item", "line 1, column 10: no rule is named item"),
        ("root ::= \"abc", "a string is never closed"),
        ("root ::= [a-", "a [class] is never closed"),
        ("root ::= [z-a]", "is reversed"),
        ("root ::= (\"a\"", "line 1, column 10: this ( is never closed"),
        ("root ::= \"\\q\"", "unknown escape \\q"),
        ("root ::= \"\\x4\"", "hex digits"),
        ("root ::= \"a\"{3,2}", "maximum is below its minimum"),
        ("root ::= \"a\"{2000}", "at most 1024 times"),
        ("root ::= \"a\"{", "expected a count"),
        ("root ::= \"a\" )", "expected a rule's name"),
        ("root = \"a\"", "expected ::= after the rule name \"root\""),
        ("root ::= (= \"a\") \"a\"", "lookahead"),
        ("root ::= root \"a\" | \"b\"", "rule root is left-recursive"),
        ("root ::= a | \"z\"\na ::= b? root \"x\"\nb ::= \"y\"", "rule a is left-recursive"),
        ("root ::= \"a\" root", "rule root never ends"),
        ("root ::= [^\\x00-\\U0010FFFF]", "matches no character"),
        ("root ::= (((\"a\"{1000}){1000}){1000})", "too large"),
    ];
    for (text, expected) in cases {
        let e = refused(text);
        assert!(e.contains(expected), "{text:?}: {e:?}, expected {expected:?}");
    }
}

#[test]
fn tail_cycles_through_empty_texts_are_kept() {
    // A starred rule that may read nothing reaches itself only at its tail: kept.
    for text in [r#"root ::= ("a"?)* "b""#, "root ::= ws* \"x\"\nws ::= [ ]*"] {
        Grammar::new(text).unwrap_or_else(|e| panic!("{text:?}: {e}"));
    }
}

#[test]
fn equal_by_text_and_serialized_as_it() {
    let text = "root ::= [0-9]+";
    let g = Grammar::new(text).unwrap();
    assert_eq!(g, Grammar::new(text).unwrap());
    assert_ne!(g, Grammar::new("root ::= [0-9]*").unwrap());
    let json = serde_json::to_string(&g).unwrap();
    assert_eq!(json, serde_json::to_string(text).unwrap());
    assert_eq!(serde_json::from_str::<Grammar>(&json).unwrap(), g);
    assert!(serde_json::from_str::<Grammar>("\"root ::= x\"").is_err());
}

#[test]
fn bytes_of_one_class_are_read_alike_by_every_element() {
    for text in [r#"root ::= [a-z]+ ("on" | "at") [0-9]{2}"#, r#"root ::= [^"\\]* . "é""#] {
        let g = Grammar::new(text).unwrap();
        let classes = g.byte_classes();
        let ranges: Vec<(u8, u8)> = g
            .elements
            .iter()
            .filter_map(|e| match *e {
                GrammarElement::Byte { lo, hi } => Some((lo, hi)),
                _ => None,
            })
            .collect();
        for a in 0..=255u8 {
            for b in 0..=255u8 {
                if classes[a as usize] == classes[b as usize] {
                    for &(lo, hi) in &ranges {
                        assert_eq!((lo..=hi).contains(&a), (lo..=hi).contains(&b), "{text}");
                    }
                }
            }
        }
        // Letters apart from `o`, `n`, `a` and `t` share a class; digits share one.
        if text.contains("[a-z]") {
            assert_eq!(classes[b'b' as usize], classes[b'm' as usize]);
            assert_ne!(classes[b'b' as usize], classes[b'o' as usize]);
            assert_eq!(classes[b'0' as usize], classes[b'9' as usize]);
        }
    }
}

#[test]
fn long_chains_of_rules_are_checked_whatever_their_order() {
    // `root ::= r1`, `r1 ::= r2 "a"`, ..., the last ending the chain: each rule's text is
    // found only once the one after it is, the worst order for rule-by-rule passes.
    let chain = |n: usize, last: &str, back: &str| {
        let mut text = String::from("root ::= r1\n");
        for i in 1..n {
            text.push_str(&format!("r{i} ::= r{} \"a\"{back}\n", i + 1));
        }
        text.push_str(&format!("r{n} ::= {last}\n"));
        text
    };
    let n = 20_000;
    Grammar::new(&chain(n, "\"z\"", "")).expect("a chain that ends");
    let e = refused(&chain(n, "r1 \"b\"", ""));
    assert!(e.contains("never ends"), "{e}");
    // Every rule reaches the next before reading, and the last reaches the first: left
    // recursion across the whole chain.
    let e = refused(&chain(n, "r1 \"b\" | \"z\"", ""));
    assert!(e.contains("left-recursive"), "{e}");
    // The same cycle through tail references only reads no byte and stacks nothing: kept.
    let mut tail = String::from("root ::= r1 \"!\"\n");
    for i in 1..n {
        tail.push_str(&format!("r{i} ::= r{} | \"a\"\n", i + 1));
    }
    tail.push_str(&format!("r{n} ::= r1 | \"z\"\n"));
    Grammar::new(&tail).expect("a cycle of tail references");
}
