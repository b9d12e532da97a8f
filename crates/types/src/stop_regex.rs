//! Patterns that end a request when its text matches one anywhere (SGLang's `stop_regex`),
//! compiled where they are given.
//!
//! Two automata serve one pattern. The scheduler searches the decoded output with a leftmost-first
//! searcher, and the text is cut where the leftmost match starts, as at a stop string. A stream
//! holds back what may still grow into a match, which the anchored DFA of [`Regex`] tells: read
//! from a position, the text is either dead (no match starts there), open (a longer text could
//! match) or through a match.
//!
//! A pattern must match text only by its own bytes: anchors and word boundaries, whose answer
//! depends on the text around the match, are refused, so a window of the output's end finds every
//! match that lies in it. A pattern that matches the empty text is refused too: it would stop
//! every request before its first token.

use std::sync::Arc;

use regex_automata::{meta, util::syntax};
use regex_syntax::ParserBuilder;

use crate::{Regex, RegexError};

/// A stop pattern: its anchored DFA, its searcher and the most bytes a match takes.
#[derive(Clone)]
pub struct StopRegex {
    anchored: Arc<Regex>,
    search: meta::Regex,
    max_len: Option<usize>,
}

/// How a text reads from its first byte under a stop pattern.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StopPrefix {
    /// No match starts at the first byte, whatever follows.
    Dead,
    /// The text is a proper prefix of a match: more text may complete one.
    Open,
    /// The text begins with a match; its shortest one has this many bytes.
    Matched(usize),
}

impl StopRegex {
    /// A stop pattern from its compiled anchored DFA; refused when it matches the empty text or
    /// asks for an anchor or a word boundary.
    pub fn new(anchored: Arc<Regex>) -> Result<Self, RegexError> {
        let pattern = anchored.as_str();
        let hir = ParserBuilder::new()
            .utf8(true)
            .unicode(true)
            .build()
            .parse(pattern)
            .map_err(|e| RegexError(e.to_string()))?;
        let props = hir.properties();
        if !props.look_set().is_empty() {
            return Err(RegexError(
                "a stop pattern cannot use anchors or word boundaries (^, $, \\b, \\A, \\z): a \
                 match must depend on its own text only"
                    .into(),
            ));
        }
        if props.minimum_len() == Some(0) {
            return Err(RegexError(
                "a stop pattern must not match the empty text (it would stop before the first \
                 token)"
                    .into(),
            ));
        }
        let search = meta::Builder::new()
            .syntax(syntax::Config::new().utf8(true).unicode(true))
            .build(pattern)
            .map_err(|e| RegexError(e.to_string()))?;
        Ok(Self { max_len: props.maximum_len(), anchored, search })
    }

    /// The pattern, as given.
    pub fn as_str(&self) -> &str {
        self.anchored.as_str()
    }

    /// The most bytes a match takes; `None` when a match may be any length.
    pub fn max_len(&self) -> Option<usize> {
        self.max_len
    }

    /// The leftmost match in `text` (the first of the longest by the pattern's alternation
    /// order, as Python's `re.search` and the `regex` crate find it), as a byte range.
    pub fn find(&self, text: &str) -> Option<std::ops::Range<usize>> {
        self.search.find(text).map(|m| m.range())
    }

    /// How `text` reads from its first byte: dead, open, or through a match.
    pub fn read(&self, text: &[u8]) -> StopPrefix {
        let dfa = &self.anchored;
        let mut state = dfa.start();
        for (at, &b) in text.iter().enumerate() {
            if dfa.is_match(state) {
                return StopPrefix::Matched(at);
            }
            match dfa.next(state, b) {
                Some(next) => state = next,
                None => return StopPrefix::Dead,
            }
        }
        match dfa.is_match(state) {
            true => StopPrefix::Matched(text.len()),
            false => StopPrefix::Open,
        }
    }
}

impl PartialEq for StopRegex {
    fn eq(&self, other: &Self) -> bool {
        self.as_str() == other.as_str()
    }
}

impl std::fmt::Debug for StopRegex {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("StopRegex").field(&self.as_str()).finish()
    }
}

impl serde::Serialize for StopRegex {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.as_str())
    }
}

impl<'de> serde::Deserialize<'de> for StopRegex {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let pattern = <std::borrow::Cow<'de, str>>::deserialize(deserializer)?;
        let anchored = Regex::new(&pattern).map_err(serde::de::Error::custom)?;
        Self::new(Arc::new(anchored)).map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stop(pattern: &str) -> Result<StopRegex, RegexError> {
        StopRegex::new(Arc::new(Regex::new(pattern)?))
    }

    #[test]
    fn finds_the_leftmost_match_and_knows_its_longest() {
        let s = stop(r"[0-9]+ apples?").unwrap();
        assert_eq!(s.find("I ate 12 apples and 3 apple"), Some(6..15));
        assert_eq!(s.find("no fruit"), None);
        assert_eq!(s.max_len(), None);
        assert_eq!(stop("</?answer>").unwrap().max_len(), Some(9));
        assert_eq!(stop("é{2}").unwrap().max_len(), Some(4));
    }

    #[test]
    fn reads_a_text_as_dead_open_or_through_a_match() {
        let s = stop("ab+c").unwrap();
        assert_eq!(s.read(b"xab"), StopPrefix::Dead);
        assert_eq!(s.read(b"abbb"), StopPrefix::Open);
        assert_eq!(s.read(b""), StopPrefix::Open);
        assert_eq!(s.read(b"abcde"), StopPrefix::Matched(3));
        assert_eq!(s.read(b"abbc"), StopPrefix::Matched(4));
    }

    #[test]
    fn refuses_empty_matches_and_context_assertions() {
        for (pattern, says) in [
            ("a*", "empty text"),
            ("x?", "empty text"),
            ("^done", "anchors"),
            (r"\bend\b", "word boundaries"),
            (r"(?-u:\b)end", "anchors"),
            ("end$", "anchors"),
            ("(a", "unclosed group"),
        ] {
            let e = stop(pattern).unwrap_err().to_string();
            assert!(e.contains(says), "{pattern}: {e}");
        }
    }

    #[test]
    fn is_serialized_as_its_pattern() {
        let s = stop("[A-Z]{3}").unwrap();
        let json = serde_json::to_string(&s).unwrap();
        assert_eq!(json, r#""[A-Z]{3}""#);
        let back: StopRegex = serde_json::from_str(&json).unwrap();
        assert_eq!(back, s);
        assert_eq!(back.find("abcDEFg"), Some(3..6));
    }
}
