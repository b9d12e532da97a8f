//! Incremental detokenization for streaming: text deltas as tokens arrive.
//!
//! Decoding token by token breaks multi-byte characters and merges, so each step decodes a short
//! window (as TGI and vLLM do) and emits only the text past what the window already produced,
//! holding back a trailing U+FFFD (an incomplete character). The text a client has been sent must
//! never contain a stop string or a stop pattern's match, which the engine cuts from its final
//! text, so the tail that could still grow into one is held back too, and so is the text of a
//! token that may end the request (EOS, a stop token), which the final text leaves out unless
//! the request keeps its stop. The engine's final text is authoritative: the last delta is
//! whatever of it has not been sent.

use std::sync::Arc;

use routed_model::Tokenizer;
use routed_types::{SamplingParams, StopPrefix, StopRegex, TokenId};

/// The decoding state of one streamed continuation.
#[derive(Debug, Default)]
pub(crate) struct Detokenizer {
    tokens: Vec<TokenId>,
    prefix_offset: usize,
    read_offset: usize,
    /// Text decoded so far (may run past `sent` by a held-back tail).
    decoded: String,
    /// Bytes of `decoded` already sent to the client.
    sent: usize,
    /// The stop strings' and patterns' hold on `decoded`.
    hold: StopHold,
}

impl Detokenizer {
    /// Adds a token of a request sampled with `params` (its stop strings, whether special tokens
    /// are skipped) and returns the text that is now safe to send, if any.
    pub(crate) fn push(
        &mut self,
        tokenizer: &Tokenizer,
        token: TokenId,
        params: &SamplingParams,
    ) -> String {
        self.tokens.push(token);
        let before = self.decoded.len();
        let skip = params.skip_special_tokens;
        let prefix =
            tokenizer.decode_with(&self.tokens[self.prefix_offset..self.read_offset], skip);
        let full = tokenizer.decode_with(&self.tokens[self.prefix_offset..], skip);
        if let (Ok(prefix), Ok(full)) = (prefix, full)
            && full.len() > prefix.len()
            && !full.ends_with('\u{FFFD}')
            && let Some(new) = full.get(prefix.len()..)
        {
            self.decoded.push_str(new);
            self.prefix_offset = self.read_offset;
            self.read_offset = self.tokens.len();
        }
        let mut safe = self.hold.safe_len(&self.decoded, before, self.sent, &params.stop);
        safe = safe.min(self.hold.pattern_safe_len(&self.decoded, self.sent, &params.stop_regex));
        let may_end = params.stop_token_ids.contains(&token)
            || (!params.ignore_eos && tokenizer.eos_token_ids().contains(&token));
        if may_end && !params.include_stop_str_in_output {
            // Held until the next token shows the request went on.
            safe = safe.min(before);
        }
        if safe <= self.sent {
            return String::new();
        }
        let delta = self.decoded[self.sent..safe].to_owned();
        self.sent = safe;
        delta
    }

    /// The rest of the engine's final `text` that has not been sent.
    pub(crate) fn finish(&mut self, text: &str) -> String {
        // `sent` is a prefix of the engine's text unless the two decodings disagree; then send
        // nothing rather than a garbled tail.
        let rest = text.get(self.sent..).unwrap_or_default().to_owned();
        self.sent = text.len().max(self.sent);
        rest
    }
}

/// What the stop strings hold back of a text that only grows.
///
/// A stop string completes when its last byte arrives, so after text was appended at `before`
/// only the new text and the `longest - 1` bytes before it can hold a stop string not seen yet;
/// none starts before the bytes already sent either, since the tail that could still become one
/// was never sent. The first complete one is remembered, which gives what searching the whole
/// text after every token gave, at a cost per token bounded by the new text and the longest stop
/// string rather than growing with the output.
///
/// A stop pattern holds back from the first byte where a match starts or may still start: the
/// pattern's DFA read from each byte in turn says, and a byte it reads as dead (no match starts
/// there, whatever follows) stays so as the text grows, so each pattern goes on from the first
/// byte it has not found dead.
#[derive(Debug, Default)]
struct StopHold {
    /// Where the earliest complete stop string or pattern match starts, once one has.
    first_stop: Option<usize>,
    /// By stop pattern: every match start before this byte reads as dead.
    dead_below: Vec<usize>,
}

impl StopHold {
    /// How many bytes of `text` may be sent: up to the first complete stop string, and short of
    /// any suffix that is a proper prefix of a stop string. `text[..before]` is what the last
    /// call saw, `text[..sent]` what has been sent.
    fn safe_len(&mut self, text: &str, before: usize, sent: usize, stop: &[String]) -> usize {
        let longest = stop.iter().map(String::len).max().unwrap_or(0);
        let mut from = sent.max(before.saturating_sub(longest.saturating_sub(1)));
        while !text.is_char_boundary(from) {
            from -= 1;
        }
        let mut safe = text.len();
        for s in stop.iter().filter(|s| !s.is_empty()) {
            if let Some(at) = text[from..].find(s.as_str()) {
                let at = from + at;
                self.first_stop = Some(self.first_stop.map_or(at, |first| first.min(at)));
            }
            // Longest suffix of `text` that is a proper prefix of `s`.
            let mut prefix = s.char_indices().rev().map(|(i, _)| i).filter(|&i| i > 0);
            if let Some(i) = prefix.find(|&i| text.ends_with(&s[..i])) {
                safe = safe.min(text.len() - i);
            }
        }
        self.first_stop.map_or(safe, |first| safe.min(first))
    }

    /// How many bytes of `text` the stop patterns let be sent: up to the first byte where a match
    /// starts or may still start. `text[..sent]` is what has been sent.
    fn pattern_safe_len(&mut self, text: &str, sent: usize, patterns: &[Arc<StopRegex>]) -> usize {
        self.dead_below.resize(patterns.len(), 0);
        let mut safe = text.len();
        for (pattern, dead_below) in patterns.iter().zip(&mut self.dead_below) {
            let mut at = sent.max(*dead_below);
            while at < text.len() {
                // A match is text: it starts on a character.
                if text.is_char_boundary(at) {
                    match pattern.read(&text.as_bytes()[at..]) {
                        StopPrefix::Dead => {}
                        StopPrefix::Open => break,
                        StopPrefix::Matched(_) => {
                            self.first_stop = Some(self.first_stop.map_or(at, |f| f.min(at)));
                            break;
                        }
                    }
                }
                at += 1;
            }
            *dead_below = at;
            safe = safe.min(at);
        }
        self.first_stop.map_or(safe, |first| safe.min(first))
    }
}

/// How many bytes at the end of `text` could be the start of `tag` (an ASCII tag): what a
/// stream that looks for the tag holds back until the next delta.
pub(crate) fn held_back(text: &str, tag: &str) -> usize {
    (1..tag.len()).rev().find(|&n| text.ends_with(&tag[..n])).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use routed_types::StopRegex;

    use super::StopHold;

    /// The hold of `text` seen whole at once.
    fn whole(text: &str, stop: &[String]) -> usize {
        StopHold::default().safe_len(text, 0, 0, stop)
    }

    #[test]
    fn holds_back_a_possible_stop_prefix() {
        let stop = vec!["STOP".to_owned()];
        assert_eq!(whole("hello ST", &stop), 6);
        assert_eq!(whole("hello", &stop), 5);
        assert_eq!(whole("a STOP b", &stop), 2);
        assert_eq!(whole("abc", &[]), 3);
        assert_eq!(whole("xaa", &["aab".to_owned()]), 1);
    }

    fn pattern(p: &str) -> Arc<StopRegex> {
        let anchored = Arc::new(routed_types::Regex::new(p).unwrap());
        Arc::new(StopRegex::new(anchored).unwrap())
    }

    #[test]
    fn holds_back_what_may_grow_into_a_pattern_match() {
        let whole =
            |text: &str, p: &str| StopHold::default().pattern_safe_len(text, 0, &[pattern(p)]);
        assert_eq!(whole("total: 12", "[0-9]+ apples"), 7, "the digits may begin a match");
        assert_eq!(whole("total: 12 pears", "[0-9]+ apples"), 15);
        assert_eq!(whole("ate 3 apples, 4 apples", "[0-9]+ apples"), 4, "cut at the first match");
        assert_eq!(whole("ab", "é+x"), 2);
        assert_eq!(whole("aé", "é+x"), 1, "a multi-byte character may begin a match");
    }

    #[test]
    fn text_seen_as_it_grows_is_held_by_patterns_as_when_seen_whole() {
        let alphabet = ["a", "b", "é", "ab", "ba", "€a", "b€", ""];
        let patterns = ["a(b|é)+a", "€a?b", "b{3}", "(ab|ba)é"];
        let mut rng = routed_test_support::SplitMix64(5);
        let mut below = |n: usize| rng.below(n);
        for trial in 0..300 {
            let stops: Vec<_> =
                patterns.iter().filter(|_| below(2) == 0).map(|p| pattern(p)).collect();
            let (mut text, mut hold, mut sent) = (String::new(), StopHold::default(), 0);
            for _ in 0..40 {
                let before = text.len();
                text.push_str(alphabet[below(alphabet.len())]);
                let safe = hold.pattern_safe_len(&text, sent, &stops);
                let seen_whole = StopHold::default().pattern_safe_len(&text, 0, &stops);
                assert_eq!(safe, seen_whole, "trial {trial}: {text:?} {stops:?}");
                // Never past a match the engine would cut at.
                let cut = stops.iter().filter_map(|p| p.find(&text)).map(|m| m.start).min();
                assert!(safe <= cut.unwrap_or(usize::MAX), "trial {trial}: {text:?}");
                sent = sent.max(if below(4) == 0 { safe.min(before) } else { safe });
            }
        }
    }

    #[test]
    fn text_seen_as_it_grows_is_held_as_when_seen_whole() {
        // Short pieces over a small alphabet with multi-byte characters, so stop strings occur,
        // overlap and straddle pieces.
        let alphabet = ["a", "b", "é", "ab", "ba", "€a", "b€", ""];
        let mut rng = routed_test_support::SplitMix64(11);
        let mut below = |n: usize| rng.below(n);
        for trial in 0..500 {
            let num_stop = 1 + below(3);
            let stop: Vec<String> = (0..num_stop)
                .map(|_| (0..1 + below(4)).map(|_| alphabet[below(6)]).collect())
                .collect();
            let (mut text, mut hold, mut sent) = (String::new(), StopHold::default(), 0);
            for _ in 0..40 {
                let before = text.len();
                text.push_str(alphabet[below(alphabet.len())]);
                let safe = hold.safe_len(&text, before, sent, &stop);
                assert_eq!(safe, whole(&text, &stop), "trial {trial}: {text:?} {stop:?}");
                // Sometimes a token that may end the request holds its text back.
                sent = sent.max(if below(4) == 0 { safe.min(before) } else { safe });
            }
        }
    }
}
