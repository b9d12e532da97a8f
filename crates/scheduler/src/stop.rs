//! Stop conditions, checked after each sampled token.
//!
//! Stop strings and stop patterns are looked for in the decoded output, and the text kept is cut
//! at the leftmost match. Decoding the whole output after every token would cost each step time
//! in proportion to the output's length (a millisecond a sequence at a few thousand tokens, on
//! the step's path); instead each step decodes a window of the last tokens, and the whole output
//! only when a stop string may have just completed.
//!
//! Why the window decides soundly: the output had no match after the previous token (searched
//! from `min_tokens` on), so a match now must end in the part of the text that changed, which is
//! the last token's text and a few bytes before it (a character it completed, a space a cleanup
//! rule removed). Decoding is local: a window's text equals the whole text's tail once past its
//! first characters (a character cut by the window's start, a leading space the decoder strips).
//! So when the window's text, those first characters left out, is long enough to hold any stop
//! string ending in the changed part and holds none, the whole text holds none. Otherwise the
//! whole output is decoded and searched as before, so the answer is always the whole text's.
//!
//! A stop pattern's match depends on its own bytes only (anchors and word boundaries are refused
//! where the pattern is given), so a pattern whose matches are at most so many bytes long is
//! judged by the window as a stop string of that length is. A pattern whose matches may be any
//! length makes every check decode the whole output.

use routed_types::{FinishReason, SamplingParams, StopMatch, TokenId};

/// Tokens decoded, at the least, to look for stop strings after a token.
const MIN_WINDOW_TOKENS: usize = 16;

/// Characters at the start of a window's text that may differ from the whole text's: replacement
/// characters for a character cut by the window's start are skipped first, then these.
const WINDOW_START_CHARS: usize = 2;

/// Bytes by which the text may change before the last token's own text: a character the token
/// completed (a replacement character of 3 bytes becoming up to 4) and a character a cleanup rule
/// removed or changed.
const CHANGED_BEFORE_LAST: usize = 8;

/// Whether a sequence with `output` (the token just sampled last) stops now. `text` decodes
/// tokens (with `skip_special_tokens` as the request asks) when stop strings or patterns need
/// it; it is only called when the request has some, on a window of the last tokens, and on the
/// whole output only when the window may hold a match (module docs). Returns the reason and, for
/// a stop string or pattern, the byte length of the text to keep: up to the leftmost match, or
/// through it with `include_stop_str_in_output`.
pub fn check_stop(
    output: &[TokenId],
    params: &SamplingParams,
    eos: &[TokenId],
    num_tokens: usize,
    max_model_len: usize,
    text: &mut dyn FnMut(&[TokenId], bool) -> String,
) -> Option<(FinishReason, Option<usize>)> {
    let last = *output.last()?;
    let n = output.len();
    if n >= params.min_tokens as usize {
        // A stop token is reported as the match; EOS is not (as vLLM and SGLang report it).
        if params.stop_token_ids.contains(&last) {
            return Some((FinishReason::Stop { matched: Some(StopMatch::Token(last)) }, None));
        }
        if !params.ignore_eos && eos.contains(&last) {
            return Some((FinishReason::Stop { matched: None }, None));
        }
        let has_stops = !params.stop.is_empty() || !params.stop_regex.is_empty();
        if has_stops && may_have_stopped(output, params, text) {
            let decoded = text(output, params.skip_special_tokens);
            if let Some((at, end, matched)) = leftmost_stop(&decoded, params) {
                let keep = if params.include_stop_str_in_output { end } else { at };
                return Some((FinishReason::Stop { matched: Some(matched) }, Some(keep)));
            }
        }
    }
    if n >= params.max_tokens as usize || num_tokens >= max_model_len {
        return Some((FinishReason::Length, None));
    }
    None
}

/// Whether a stop string of `params` may end in the text the last token of `output` changed:
/// false only when a window of the last tokens shows that none does (module docs).
fn may_have_stopped(
    output: &[TokenId],
    params: &SamplingParams,
    text: &mut dyn FnMut(&[TokenId], bool) -> String,
) -> bool {
    let skip = params.skip_special_tokens;
    let Some(longest) = longest_stop(params) else { return true };
    // Tokens of at least a byte each (special ones aside) cover the longest stop string twice.
    let num_window = 2 * longest + MIN_WINDOW_TOKENS;
    // The window stands for the whole text only when the output was searched after the token
    // before too: not at `min_tokens`, the first search.
    if output.len() <= num_window || output.len() <= params.min_tokens as usize {
        return true;
    }
    let window = text(&output[output.len() - num_window..], skip);
    // Alone, the last token decodes to at least as many bytes as it adds to the whole text,
    // but for a leading space a decoder strips (in the margin).
    let last = text(&output[output.len() - 1..], skip).len();
    let Some(tail) = trusted_tail(&window) else { return true };
    if tail.len() < longest + last + CHANGED_BEFORE_LAST {
        return true;
    }
    params.stop.iter().any(|s| tail.contains(s.as_str()))
        || params.stop_regex.iter().any(|r| r.find(tail).is_some())
}

/// The most bytes a match of a stop string or pattern of `params` takes; `None` when a pattern's
/// matches may be any length.
fn longest_stop(params: &SamplingParams) -> Option<usize> {
    let strings = params.stop.iter().map(String::len).max().unwrap_or(0);
    params
        .stop_regex
        .iter()
        .map(|r| r.max_len())
        .try_fold(strings, |most, len| Some(most.max(len?)))
}

/// The leftmost match in `text` of a stop string or pattern of `params` (the first one listed
/// where two start at one byte, strings first): its start, its end and what matched.
fn leftmost_stop(text: &str, params: &SamplingParams) -> Option<(usize, usize, StopMatch)> {
    let strings = params.stop.iter().filter_map(|s| {
        text.find(s.as_str()).map(|at| (at, at + s.len(), StopMatch::Text(s.clone())))
    });
    let patterns = params.stop_regex.iter().filter_map(|r| {
        r.find(text).map(|m| (m.start, m.end, StopMatch::Regex(r.as_str().to_owned())))
    });
    strings.chain(patterns).min_by_key(|&(at, _, _)| at)
}

/// The window's text past the characters that may differ from the whole text's (replacement
/// characters at its start, then `WINDOW_START_CHARS` more); `None` when nothing is left.
fn trusted_tail(window: &str) -> Option<&str> {
    let mut chars = window.char_indices().skip_while(|&(_, c)| c == char::REPLACEMENT_CHARACTER);
    let (at, _) = chars.nth(WINDOW_START_CHARS)?;
    Some(&window[at..])
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use routed_types::{Regex, StopRegex};

    use super::*;

    fn text(ids: &[TokenId], _skip_special_tokens: bool) -> String {
        ids.iter().map(|&i| char::from(b'a' + (i % 26) as u8)).collect()
    }

    #[test]
    fn eos_stops_unless_ignored_or_below_min_tokens() {
        let p = SamplingParams::greedy(10);
        let eos = check_stop(&[3, 2], &p, &[2], 5, 100, &mut text).unwrap();
        assert_eq!(eos.0, FinishReason::Stop { matched: None });
        let ignore = SamplingParams { ignore_eos: true, ..p.clone() };
        assert!(check_stop(&[3, 2], &ignore, &[2], 5, 100, &mut text).is_none());
        let min = SamplingParams { min_tokens: 3, ..p };
        assert!(check_stop(&[3, 2], &min, &[2], 5, 100, &mut text).is_none());
    }

    #[test]
    fn stop_strings_cut_the_text_and_length_stops_last() {
        let p = SamplingParams { stop: vec!["cd".into()], ..SamplingParams::greedy(10) };
        let (reason, keep) = check_stop(&[0, 1, 2, 3], &p, &[], 4, 100, &mut text).unwrap();
        assert_eq!(reason, FinishReason::Stop { matched: Some(StopMatch::Text("cd".into())) });
        assert_eq!(keep, Some(2));
        let include = SamplingParams { include_stop_str_in_output: true, ..p };
        let (_, keep) = check_stop(&[0, 1, 2, 3], &include, &[], 4, 100, &mut text).unwrap();
        assert_eq!(keep, Some(4), "through the match");
        let p = SamplingParams::greedy(2);
        assert_eq!(
            check_stop(&[5, 6], &p, &[], 4, 100, &mut text).unwrap().0,
            FinishReason::Length
        );
        assert_eq!(check_stop(&[5], &p, &[], 100, 100, &mut text).unwrap().0, FinishReason::Length);
    }

    #[test]
    fn a_window_without_a_stop_string_spares_the_whole_decode() {
        let p = SamplingParams { stop: vec!["zz".into()], ..SamplingParams::greedy(1000) };
        // 200 tokens, no "zz" anywhere: the whole output is never decoded.
        let output: Vec<TokenId> = (0..200).map(|i| i % 25).collect();
        let mut longest = 0;
        let mut count = |ids: &[TokenId], skip: bool| {
            longest = longest.max(ids.len());
            text(ids, skip)
        };
        assert!(check_stop(&output, &p, &[], 200, 10_000, &mut count).is_none());
        assert!(longest < output.len(), "decoded {longest} of {} tokens", output.len());
        // "zz" completed by the last token: found, at the whole text's offset.
        let mut stopped = output.clone();
        stopped.extend([25, 25]);
        let (reason, keep) = check_stop(&stopped, &p, &[], 202, 10_000, &mut text).unwrap();
        assert_eq!(reason, FinishReason::Stop { matched: Some(StopMatch::Text("zz".into())) });
        assert_eq!(keep, Some(200));
    }

    #[test]
    fn a_window_too_short_to_judge_falls_back_to_the_whole_output() {
        let p = SamplingParams { stop: vec!["zz".into()], ..SamplingParams::greedy(1000) };
        // Tokens that decode to nothing (special tokens skipped) leave the window empty.
        let mut empty = |ids: &[TokenId], _: bool| -> String {
            ids.iter().filter(|&&i| i != 99).map(|&i| char::from(b'a' + (i % 26) as u8)).collect()
        };
        let mut output = vec![25, 25];
        output.extend([99; 100]);
        let (reason, keep) = check_stop(&output, &p, &[], 102, 10_000, &mut empty).unwrap();
        assert_eq!(reason, FinishReason::Stop { matched: Some(StopMatch::Text("zz".into())) });
        assert_eq!(keep, Some(0));
    }

    fn patterns(patterns: &[&str]) -> Vec<Arc<StopRegex>> {
        let compile =
            |p: &&str| Arc::new(StopRegex::new(Arc::new(Regex::new(p).unwrap())).unwrap());
        patterns.iter().map(compile).collect()
    }

    #[test]
    fn a_stop_pattern_cuts_the_text_at_its_leftmost_match() {
        let p = SamplingParams {
            stop_regex: patterns(&["c+d", "x"]),
            stop: vec!["de".into()],
            ..SamplingParams::greedy(100)
        };
        // "abccd": the pattern's match starts at 2.
        let (reason, keep) = check_stop(&[0, 1, 2, 2, 3], &p, &[], 5, 100, &mut text).unwrap();
        assert_eq!(reason, FinishReason::Stop { matched: Some(StopMatch::Regex("c+d".into())) });
        assert_eq!(keep, Some(2));
        let include = SamplingParams { include_stop_str_in_output: true, ..p.clone() };
        let (_, keep) = check_stop(&[0, 1, 2, 2, 3], &include, &[], 5, 100, &mut text).unwrap();
        assert_eq!(keep, Some(5), "through the match");
        // A stop string that starts first wins.
        let (reason, keep) = check_stop(&[3, 4], &p, &[], 2, 100, &mut text).unwrap();
        assert_eq!(reason, FinishReason::Stop { matched: Some(StopMatch::Text("de".into())) });
        assert_eq!(keep, Some(0));
        assert!(check_stop(&[0, 1, 2], &p, &[], 3, 100, &mut text).is_none());
    }

    /// Tokens of zero to three letters from a small alphabet, so that matches cross tokens.
    fn uneven(ids: &[TokenId], _skip_special_tokens: bool) -> String {
        let letters = |i: TokenId| "abc".chars().cycle().skip(i as usize % 3).take(i as usize % 4);
        ids.iter().flat_map(|&i| letters(i)).collect()
    }

    #[test]
    fn windows_judge_stop_patterns_as_the_whole_text_does() {
        let mut rng = 0x2545_f491_4f6c_dd1du64;
        let mut next = move || {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            rng
        };
        for stops in [&["ab{2}ca", "c{4}"][..], &["(ab|ba){3}b"], &["a[bc]*a"]] {
            let p = SamplingParams {
                stop_regex: patterns(stops),
                min_tokens: 3,
                ..SamplingParams::greedy(10_000)
            };
            for _ in 0..40 {
                let output: Vec<TokenId> = (0..300).map(|_| (next() % 12) as TokenId).collect();
                // The first length whose whole text holds a match (from min_tokens on) stops,
                // where the whole text's leftmost match starts; no shorter one does.
                let first = (3..=output.len()).find(|&n| {
                    p.stop_regex.iter().any(|r| r.find(&uneven(&output[..n], true)).is_some())
                });
                for n in 1..=first.unwrap_or(output.len()) {
                    let got = check_stop(&output[..n], &p, &[], n, 1 << 20, &mut uneven);
                    if Some(n) != first {
                        assert!(got.is_none(), "{stops:?} stopped early at {n}");
                        continue;
                    }
                    let whole = uneven(&output[..n], true);
                    let at = p.stop_regex.iter().filter_map(|r| r.find(&whole)).map(|m| m.start);
                    assert_eq!(got.unwrap().1, at.min(), "{stops:?} at {n}");
                }
            }
        }
    }

    #[test]
    fn a_window_judges_bounded_patterns_and_unbounded_ones_decode_whole() {
        let output: Vec<TokenId> = (0..200).map(|i| i % 25).collect();
        for (stops, windowed) in [(&["zz", "q{2,5}"][..], true), (&["zz", "q+z"], false)] {
            let p = SamplingParams { stop_regex: patterns(stops), ..SamplingParams::greedy(1000) };
            let mut longest = 0;
            let mut count = |ids: &[TokenId], skip: bool| {
                longest = longest.max(ids.len());
                text(ids, skip)
            };
            assert!(check_stop(&output, &p, &[], 200, 10_000, &mut count).is_none());
            assert_eq!(longest < output.len(), windowed, "{stops:?} decoded {longest}");
        }
    }

    #[test]
    fn a_windows_first_characters_are_not_trusted() {
        assert_eq!(trusted_tail("\u{FFFD}\u{FFFD}abcdef"), Some("cdef"));
        assert_eq!(trusted_tail(" hello"), Some("ello"));
        assert_eq!(trusted_tail("ab"), None);
    }
}
