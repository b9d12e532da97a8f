//! Grammars as output constraints (vLLM's `guided_grammar` and `structured_outputs.grammar`,
//! SGLang's `ebnf`): GBNF text, read where it is given (so a bad one is refused there) into
//! rules over bytes that the scheduler's grammar reader follows as a pushdown automaton.
//!
//! GBNF, as llama.cpp and xgrammar read it: `name ::= alternatives`, the output one text of the
//! rule `root`; string literals (`"..."` with `\n`, `\t`, `\xHH`, `\uHHHH`, ... escapes),
//! character classes (`[a-z]`, `[^"\\]`), `.` for any character, rule names, groups, and the
//! repetitions `*`, `+`, `?`, `{m}`, `{m,}`, `{m,n}`. Characters are Unicode code points and
//! the text UTF-8: a class is lowered into alternatives of byte ranges, one for each run of
//! code points with encodings of one length and shape, so the reader only ever compares bytes.
//!
//! Refused, each with where and why: a rule named twice or never defined, no `root`, a rule
//! that reaches itself before reading a byte with something of its alternative still to read
//! (left recursion, which a pushdown reader cannot follow: its stack would grow without
//! reading), and a rule no finite text satisfies. A rule reaching itself last in its
//! alternative through rules that read nothing (`("a"?)*`) is kept: the reader finds the same
//! stack again and skips it.

mod check;
mod parse;

use parse::{Alternatives, Atom, Item, RuleDef};
use regex_syntax::utf8::Utf8Sequences;
use std::collections::HashMap;

/// The most elements a grammar may lower into (a counted repetition copies what it counts).
const MAX_ELEMENTS: usize = 1 << 20;

/// Why a text is not a grammar the reader can follow.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct GrammarError(String);

/// What one position of a rule's alternative reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GrammarElement {
    /// One byte in `lo..=hi`.
    Byte {
        /// The lowest byte.
        lo: u8,
        /// The highest byte.
        hi: u8,
    },
    /// A text of the rule.
    Rule(u32),
    /// The alternative has ended.
    End,
}

/// A grammar lowered into rules over bytes, read-only once built. Two are equal when their
/// texts are, and it is serialized as its text (and read again when deserialized).
#[derive(Clone)]
pub struct Grammar {
    text: Box<str>,
    /// Every alternative of every rule, each a run of elements ended by [`GrammarElement::End`].
    elements: Vec<GrammarElement>,
    /// By rule: where each of its alternatives starts in `elements`.
    rules: Vec<Vec<u32>>,
    root: u32,
}

impl Grammar {
    /// Reads GBNF `text`; its output is a text of the rule `root`.
    pub fn new(text: &str) -> Result<Self, GrammarError> {
        let defs = parse::rules(text)?;
        let mut lower = Lower::new(text, &defs)?;
        for (id, def) in defs.iter().enumerate() {
            lower.current = id as u32;
            let alternatives = lower.alternatives(&def.body)?;
            lower.rules[id] = alternatives;
        }
        let Some(&root) = lower.ids.get("root") else {
            return Err(GrammarError("the grammar has no rule named root".into()));
        };
        let Lower { elements, rules, names, .. } = lower;
        let grammar = Self { text: text.into(), elements, rules, root };
        grammar.check(&names)?;
        Ok(grammar)
    }

    /// The text, as given.
    pub fn as_str(&self) -> &str {
        &self.text
    }

    /// The rule the whole output is a text of.
    pub fn root(&self) -> u32 {
        self.root
    }

    /// What position `at` reads.
    #[inline]
    pub fn element(&self, at: u32) -> GrammarElement {
        self.elements[at as usize]
    }

    /// Where each alternative of `rule` starts.
    #[inline]
    pub fn alternatives(&self, rule: u32) -> &[u32] {
        &self.rules[rule as usize]
    }

    /// Each byte's class: every element reads all bytes of a class or none of them, so a
    /// reader may step by any one byte of a class for all of them.
    pub fn byte_classes(&self) -> [u8; 256] {
        // A class starts at each range's first byte and after its last.
        let mut starts = [false; 257];
        for e in &self.elements {
            if let GrammarElement::Byte { lo, hi } = *e {
                starts[lo as usize] = true;
                starts[hi as usize + 1] = true;
            }
        }
        let mut classes = [0u8; 256];
        let mut class = 0u8;
        for b in 1..256 {
            // At most 255 starts past byte 0, so the count fits.
            class += u8::from(starts[b]);
            classes[b] = class;
        }
        classes
    }

    /// The rules' elements from `start` up to the alternative's end.
    fn run(&self, start: u32) -> impl Iterator<Item = GrammarElement> + '_ {
        self.elements[start as usize..].iter().copied().take_while(|e| *e != GrammarElement::End)
    }
}

/// The lowering of parsed rules into elements: groups, repetitions and classes become rules
/// of their own, named after the rule they stand in for the messages.
struct Lower<'a> {
    text: &'a str,
    ids: HashMap<&'a str, u32>,
    elements: Vec<GrammarElement>,
    rules: Vec<Vec<u32>>,
    names: Vec<String>,
    /// The written rule being lowered, for new rules' names.
    current: u32,
}

impl<'a> Lower<'a> {
    /// The written rules numbered in order (a name written twice refused).
    fn new(text: &'a str, defs: &'a [RuleDef]) -> Result<Self, GrammarError> {
        let mut ids = HashMap::new();
        for (id, def) in defs.iter().enumerate() {
            if ids.insert(def.name.as_str(), id as u32).is_some() {
                let (line, column) = parse::line_column(text, def.at);
                return Err(GrammarError(format!(
                    "line {line}, column {column}: rule {} is defined twice",
                    def.name
                )));
            }
        }
        Ok(Self {
            text,
            ids,
            elements: Vec::new(),
            rules: vec![Vec::new(); defs.len()],
            names: defs.iter().map(|d| d.name.clone()).collect(),
            current: 0,
        })
    }

    /// Lays out each alternative of `body` and returns where they start.
    fn alternatives(&mut self, body: &Alternatives) -> Result<Vec<u32>, GrammarError> {
        let runs = self.runs(body)?;
        runs.into_iter().map(|run| self.lay_out(run)).collect()
    }

    /// The elements of each alternative of `body`.
    fn runs(&mut self, body: &Alternatives) -> Result<Vec<Vec<GrammarElement>>, GrammarError> {
        let mut runs = Vec::with_capacity(body.0.len());
        for sequence in &body.0 {
            let mut run = Vec::new();
            for item in sequence {
                self.item(item, &mut run)?;
            }
            runs.push(run);
        }
        Ok(runs)
    }

    /// Appends `run` and its end to the elements; where it starts.
    fn lay_out(&mut self, run: Vec<GrammarElement>) -> Result<u32, GrammarError> {
        if self.elements.len() + run.len() + 1 > MAX_ELEMENTS {
            return Err(too_large());
        }
        let start = self.elements.len() as u32;
        self.elements.extend(run);
        self.elements.push(GrammarElement::End);
        Ok(start)
    }

    /// A new rule of these alternatives (each a run of elements), standing for a part of the
    /// written rule being lowered (its name, for the messages).
    fn new_rule(&mut self, runs: Vec<Vec<GrammarElement>>) -> Result<u32, GrammarError> {
        let id = self.rules.len() as u32;
        self.names.push(format!("{} (a part of it)", self.names[self.current as usize]));
        self.rules.push(Vec::new());
        let starts = runs.into_iter().map(|run| self.lay_out(run)).collect::<Result<_, _>>()?;
        self.rules[id as usize] = starts;
        Ok(id)
    }

    /// Appends what `item` reads to `run`: its atom `min` times, then up to `max` optionally.
    fn item(&mut self, item: &Item, run: &mut Vec<GrammarElement>) -> Result<(), GrammarError> {
        let once = self.atom(&item.atom)?;
        for _ in 0..item.min {
            run.extend_from_slice(&once);
            if run.len() > MAX_ELEMENTS {
                return Err(too_large());
            }
        }
        match item.max {
            // x*: a rule reading x then itself, or nothing (it recurses at its tail, so the
            // reader's stack does not grow with the count). Its id is the next one.
            None => {
                let star = self.rules.len() as u32;
                let mut more = once;
                more.push(GrammarElement::Rule(star));
                self.new_rule(vec![more, Vec::new()])?;
                run.push(GrammarElement::Rule(star));
            }
            // Up to n more: x (x (x)?)? nested, each optional level a rule.
            Some(max) if max > item.min => {
                let mut inner = self.new_rule(vec![once.clone(), Vec::new()])?;
                for _ in item.min + 1..max {
                    let mut more = once.clone();
                    more.push(GrammarElement::Rule(inner));
                    inner = self.new_rule(vec![more, Vec::new()])?;
                }
                run.push(GrammarElement::Rule(inner));
            }
            Some(_) => {}
        }
        Ok(())
    }

    /// The elements that read `atom` once.
    fn atom(&mut self, atom: &Atom) -> Result<Vec<GrammarElement>, GrammarError> {
        Ok(match atom {
            Atom::Text(bytes) => {
                bytes.iter().map(|&b| GrammarElement::Byte { lo: b, hi: b }).collect()
            }
            Atom::Ref { name, at } => match self.ids.get(name.as_str()) {
                Some(&id) => vec![GrammarElement::Rule(id)],
                None => {
                    let (line, column) = parse::line_column(self.text, *at);
                    return Err(GrammarError(format!(
                        "line {line}, column {column}: no rule is named {name}"
                    )));
                }
            },
            Atom::Group(body) => match body.0.as_slice() {
                // One alternative reads in place.
                [sequence] => {
                    let mut run = Vec::new();
                    for item in sequence {
                        self.item(item, &mut run)?;
                    }
                    run
                }
                _ => {
                    let runs = self.runs(body)?;
                    vec![GrammarElement::Rule(self.new_rule(runs)?)]
                }
            },
            Atom::Any => self.class(&[(0, char::MAX as u32)])?,
            Atom::Class { negated: false, ranges } => self.class(ranges)?,
            Atom::Class { negated: true, ranges } => self.class(&complement(ranges))?,
        })
    }

    /// The elements that read one character of `ranges` (code points; surrogates never
    /// match): one byte range in place where that is all it takes, else a rule with an
    /// alternative per run of encodings.
    fn class(&mut self, ranges: &[(u32, u32)]) -> Result<Vec<GrammarElement>, GrammarError> {
        let mut runs: Vec<Vec<GrammarElement>> = Vec::new();
        for &(lo, hi) in ranges {
            let (Some(lo), Some(hi)) = (char_at_or_after(lo), char_at_or_before(hi)) else {
                continue;
            };
            if lo > hi {
                continue;
            }
            for sequence in Utf8Sequences::new(lo, hi) {
                let run = sequence
                    .as_slice()
                    .iter()
                    .map(|r| GrammarElement::Byte { lo: r.start, hi: r.end })
                    .collect();
                runs.push(run);
            }
        }
        match runs.len() {
            0 => Err(GrammarError(format!(
                "a character class in rule {} matches no character",
                self.names[self.current as usize]
            ))),
            1 => Ok(runs.pop().expect("one run")),
            _ => Ok(vec![GrammarElement::Rule(self.new_rule(runs)?)]),
        }
    }
}

/// The error of a grammar past [`MAX_ELEMENTS`].
fn too_large() -> GrammarError {
    GrammarError(format!(
        "the grammar is too large (over {MAX_ELEMENTS} elements once repetitions are counted out)"
    ))
}

/// The code point ranges `ranges` leave out.
fn complement(ranges: &[(u32, u32)]) -> Vec<(u32, u32)> {
    let mut sorted = ranges.to_vec();
    sorted.sort_unstable();
    let mut out = Vec::new();
    let mut next = 0u32;
    for (lo, hi) in sorted {
        if lo > next {
            out.push((next, lo - 1));
        }
        next = next.max(hi.saturating_add(1));
    }
    if next <= char::MAX as u32 {
        out.push((next, char::MAX as u32));
    }
    out
}

/// The first character at or after code point `c` (past the surrogates).
fn char_at_or_after(c: u32) -> Option<char> {
    char::from_u32(c).or_else(|| char::from_u32(c.max(0xE000)))
}

/// The last character at or before code point `c` (before the surrogates).
fn char_at_or_before(c: u32) -> Option<char> {
    char::from_u32(c.min(char::MAX as u32)).or_else(|| char::from_u32(c.min(0xD7FF)))
}

impl PartialEq for Grammar {
    fn eq(&self, other: &Self) -> bool {
        self.text == other.text
    }
}

impl Eq for Grammar {}

impl std::hash::Hash for Grammar {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.text.hash(state)
    }
}

impl std::fmt::Debug for Grammar {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("Grammar").field(&self.text).finish()
    }
}

impl serde::Serialize for Grammar {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&self.text)
    }
}

impl<'de> serde::Deserialize<'de> for Grammar {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = <std::borrow::Cow<'de, str>>::deserialize(deserializer)?;
        Self::new(&text).map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests;
