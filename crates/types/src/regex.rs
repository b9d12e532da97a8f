//! Regular expressions as output constraints (vLLM's and SGLang's `regex`, and a JSON schema
//! string's `pattern`): a pattern compiled where it is given (so a bad one is refused there, and
//! never reaches the engine) into a dense DFA over bytes that the scheduler's readers step one
//! byte at a time.
//!
//! The text must match the pattern whole: the DFA starts anchored, and a text matches when the
//! state after its last byte matches at the end of the input. The DFA reports every match
//! ([`MatchKind::All`]), so it never stops at a shorter match while a longer one is possible.
//! A byte may follow only where a match is still reachable after it: states from which none is
//! (the DFA's dead state, the states that only report a match that ended a byte earlier, and
//! any others the determinization left) are marked once, when the pattern is compiled.

use std::collections::{HashMap, HashSet};

use regex_automata::{
    Anchored, MatchKind,
    dfa::{Automaton, StartKind, dense},
    nfa::thompson,
    util::{start, syntax},
};

pub use regex_automata::util::primitives::StateID as RegexState;

/// The most memory a pattern's DFA may take, and its construction on the way: a pattern past
/// it (one whose DFA blows up, as `(a|b)*a(a|b){20}` does) is refused rather than compiled.
const MAX_DFA_BYTES: usize = 8 << 20;

/// The most memory a pattern's NFA may take (a counted repetition such as `a{1000000}` is
/// refused by it before determinization starts).
const MAX_NFA_BYTES: usize = 4 << 20;

/// Deepest nesting of a pattern's groups and repetitions.
const MAX_NESTING: u32 = 64;

/// Why a pattern cannot constrain an output: not a regular expression in the `regex` crate's
/// syntax, one with features a DFA cannot run (look-around, back-references, a Unicode `\b`),
/// or one too large.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct RegexError(pub(crate) String);

/// A pattern and its DFA, read-only once built. Two are equal when their patterns are, and it
/// is serialized as its pattern (and compiled again when read).
#[derive(Clone)]
pub struct Regex {
    pattern: Box<str>,
    dfa: dense::DFA<Vec<u32>>,
    start: RegexState,
    /// By state index: whether a match can still be reached from the state.
    live: Vec<bool>,
}

impl Regex {
    /// Compiles `pattern` (the `regex` crate's syntax, Unicode-aware, matching UTF-8 text only).
    pub fn new(pattern: &str) -> Result<Self, RegexError> {
        let dfa = dense::Builder::new()
            .syntax(syntax::Config::new().utf8(true).unicode(true).nest_limit(MAX_NESTING))
            .thompson(thompson::Config::new().nfa_size_limit(Some(MAX_NFA_BYTES)))
            .configure(
                dense::Config::new()
                    .match_kind(MatchKind::All)
                    .start_kind(StartKind::Anchored)
                    .dfa_size_limit(Some(MAX_DFA_BYTES))
                    .determinize_size_limit(Some(MAX_DFA_BYTES)),
            )
            .build(pattern)
            .map_err(|e| RegexError(describe(&e)))?;
        let start = dfa
            .start_state(&start::Config::new().anchored(Anchored::Yes))
            .map_err(|e| RegexError(e.to_string()))?;
        let live = live_states(&dfa, start);
        let regex = Self { pattern: pattern.into(), dfa, start, live };
        match regex.is_live(start) {
            true => Ok(regex),
            false => Err(RegexError("the pattern matches no text".into())),
        }
    }

    /// The pattern, as given.
    pub fn as_str(&self) -> &str {
        &self.pattern
    }

    /// Nothing read yet.
    pub fn start(&self) -> RegexState {
        self.start
    }

    /// The state after `b`, or `None` when no text that goes on with `b` can match.
    #[inline]
    pub fn next(&self, state: RegexState, b: u8) -> Option<RegexState> {
        let next = self.dfa.next_state(state, b);
        self.is_live(next).then_some(next)
    }

    fn is_live(&self, state: RegexState) -> bool {
        self.live.get(state.as_usize() >> self.dfa.stride2()).copied().unwrap_or(false)
    }

    /// Whether the text read up to `state` matches whole. (A DFA reports a match one byte late;
    /// the end of the input is that byte.)
    pub fn is_match(&self, state: RegexState) -> bool {
        self.dfa.is_match_state(self.dfa.next_eoi_state(state))
    }

    /// Each byte's class: bytes of one class move every state alike, so a reader may step by
    /// any one byte of a class for all of them.
    pub fn byte_classes(&self) -> [u8; 256] {
        let classes = self.dfa.byte_classes();
        std::array::from_fn(|b| classes.get(b as u8))
    }

    /// The heap bytes its tables take.
    pub fn heap_bytes(&self) -> usize {
        self.dfa.memory_usage() + self.live.len() + self.pattern.len()
    }

    /// Whether `text` matches whole.
    pub fn matches(&self, text: &[u8]) -> bool {
        let end = text.iter().try_fold(self.start, |s, &b| self.next(s, b));
        end.is_some_and(|s| self.is_match(s))
    }
}

impl PartialEq for Regex {
    fn eq(&self, other: &Self) -> bool {
        self.pattern == other.pattern
    }
}

impl Eq for Regex {}

impl std::hash::Hash for Regex {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.pattern.hash(state)
    }
}

impl std::fmt::Debug for Regex {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("Regex").field(&self.pattern).finish()
    }
}

impl serde::Serialize for Regex {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&self.pattern)
    }
}

impl<'de> serde::Deserialize<'de> for Regex {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let pattern = <std::borrow::Cow<'de, str>>::deserialize(deserializer)?;
        Self::new(&pattern).map_err(serde::de::Error::custom)
    }
}

/// By state index, whether a match is reachable from the state: the states reachable from
/// `start` (one byte of each class tried), then, backwards along the transitions, those that
/// reach a state that matches at the end of the input.
fn live_states(dfa: &dense::DFA<Vec<u32>>, start: RegexState) -> Vec<bool> {
    let bytes: Vec<u8> =
        dfa.byte_classes().representatives(..).filter_map(|unit| unit.as_u8()).collect();
    let (mut order, mut seen) = (vec![start], HashSet::from([start]));
    let mut before: HashMap<RegexState, Vec<RegexState>> = HashMap::new();
    let mut at = 0;
    while let Some(&state) = order.get(at) {
        at += 1;
        for &b in &bytes {
            let next = dfa.next_state(state, b);
            if dfa.is_dead_state(next) {
                continue;
            }
            before.entry(next).or_default().push(state);
            if seen.insert(next) {
                order.push(next);
            }
        }
    }
    let index = |state: RegexState| state.as_usize() >> dfa.stride2();
    let mut live = vec![false; order.iter().map(|&s| index(s)).max().unwrap_or(0) + 1];
    let mut stack: Vec<RegexState> =
        order.into_iter().filter(|&s| dfa.is_match_state(dfa.next_eoi_state(s))).collect();
    stack.iter().for_each(|&s| live[index(s)] = true);
    while let Some(state) = stack.pop() {
        for &earlier in before.get(&state).into_iter().flatten() {
            if !live[index(earlier)] {
                live[index(earlier)] = true;
                stack.push(earlier);
            }
        }
    }
    live
}

/// A build error's message with its causes: the syntax error's own text says where in the
/// pattern it is.
fn describe(e: &dense::BuildError) -> String {
    let mut message = e.to_string();
    let mut source = std::error::Error::source(e);
    while let Some(cause) = source {
        message.push_str(": ");
        message.push_str(&cause.to_string());
        source = cause.source();
    }
    message
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_text_matches_only_whole() {
        let dfa = Regex::new(r"[0-9]{3}-[a-z]+").unwrap();
        assert!(dfa.matches(b"123-abc"));
        assert!(!dfa.matches(b"123-"), "a prefix of a match is not one");
        assert!(!dfa.matches(b"x123-abc"), "nothing may stand before the match");
        assert!(!dfa.matches(b"123-abc!"), "nor after it");
        let mut state = dfa.start();
        for &b in b"12" {
            state = dfa.next(state, b).unwrap();
        }
        assert!(dfa.next(state, b'-').is_none(), "a byte no match goes on with is refused");
        assert!(dfa.next(state, b'3').is_some());
        // After a whole match that cannot go on, nothing may follow (the DFA's state after one
        // more byte only reports the match that ended before it).
        let word = Regex::new("true|false").unwrap();
        let end = b"true".iter().try_fold(word.start(), |s, &b| word.next(s, b)).unwrap();
        assert!(word.is_match(end));
        assert!((0..=255).all(|b| word.next(end, b).is_none()));
    }

    #[test]
    fn bytes_of_one_class_move_every_reachable_state_alike() {
        for pattern in [r"[a-z]+ ([a-z]+ ){2,8}(on|at)", r"\w{1,3}", r"[0-9]{3}-[\x{e9}\x{3b1}]"] {
            let regex = Regex::new(pattern).unwrap();
            let classes = regex.byte_classes();
            assert!(classes.iter().any(|&c| c != classes[0]), "{pattern}: one class for all");
            let (mut seen, mut todo) = (HashSet::from([regex.start()]), vec![regex.start()]);
            while let Some(state) = todo.pop() {
                let mut by_class: HashMap<u8, Option<RegexState>> = HashMap::new();
                for b in 0..=255u8 {
                    let next = regex.next(state, b);
                    let first = *by_class.entry(classes[b as usize]).or_insert(next);
                    assert_eq!(first, next, "{pattern}: byte {b:#x} leaves its class");
                    if let Some(next) = next
                        && seen.insert(next)
                    {
                        todo.push(next);
                    }
                }
            }
            assert!(seen.len() > 3, "{pattern}: {} states", seen.len());
        }
    }

    #[test]
    fn a_longer_match_stays_open_after_a_shorter_one() {
        let dfa = Regex::new("a|ab|abc").unwrap();
        let a = dfa.next(dfa.start(), b'a').unwrap();
        assert!(dfa.is_match(a));
        let ab = dfa.next(a, b'b').unwrap();
        assert!(dfa.is_match(ab));
        assert!(dfa.next(ab, b'c').is_some_and(|abc| dfa.is_match(abc)));
    }

    #[test]
    fn anchors_and_unicode_classes_read_as_in_the_regex_crate() {
        let dfa = Regex::new(r"^\w+ é$").unwrap();
        assert!(dfa.matches("naïve é".as_bytes()));
        assert!(!dfa.matches(b"na ive e"));
        // `.` is one character, never half of one.
        let dot = Regex::new("(?s).").unwrap();
        assert!(dot.matches("é".as_bytes()));
        assert!(!dot.matches(&"é".as_bytes()[..1]));
        assert!(!dot.matches(b"\xff"));
    }

    #[test]
    fn what_a_dfa_cannot_run_is_refused_with_the_reason() {
        let syntax = Regex::new("(a").unwrap_err().to_string();
        assert!(syntax.contains("unclosed group"), "{syntax}");
        let look = Regex::new("a(?=b)").unwrap_err().to_string();
        assert!(look.contains("look-around"), "{look}");
        let huge = Regex::new("(a|b)*a(a|b){24}").unwrap_err().to_string();
        assert!(huge.contains("exceeded"), "{huge}");
        assert!(Regex::new("a{1000000}").is_err(), "a counted repetition past the NFA's limit");
        assert!(Regex::new(r"\bword\b").is_err(), "a Unicode word boundary");
        assert!(Regex::new(r"(?-u:\b)word(?-u:\b)").is_ok());
        let none = Regex::new(r"a(?-u:\b)b").unwrap_err().to_string();
        assert!(none.contains("matches no text"), "{none}");
    }
}
