//! Stop conditions, checked after each sampled token.
//!
//! A stop string is looked for in the decoded output, and the text kept is cut at the first
//! match. Decoding the whole output after every token would cost each step time in proportion to
//! the output's length (a millisecond a sequence at a few thousand tokens, on the step's path);
//! instead each step decodes a window of the last tokens, and the whole output only when a stop
//! string may have just completed.
//!
//! Why the window decides soundly: the output had no match after the previous token (searched
//! from `min_tokens` on), so a match now must end in the part of the text that changed, which is
//! the last token's text and a few bytes before it (a character it completed, a space a cleanup
//! rule removed). Decoding is local: a window's text equals the whole text's tail once past its
//! first characters (a character cut by the window's start, a leading space the decoder strips).
//! So when the window's text, those first characters left out, is long enough to hold any stop
//! string ending in the changed part and holds none, the whole text holds none. Otherwise the
//! whole output is decoded and searched as before, so the answer is always the whole text's.

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
/// tokens (with `skip_special_tokens` as the request asks) when stop strings need it; it is only
/// called when the request has stop strings, on a window of the last tokens, and on the whole
/// output only when the window may hold a match (module docs). Returns the reason and, for a
/// stop string, the byte length of the text to keep: up to the match, or through it with
/// `include_stop_str_in_output`.
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
        if !params.stop.is_empty() && may_have_stopped(output, params, text) {
            let decoded = text(output, params.skip_special_tokens);
            let found =
                params.stop.iter().filter_map(|s| decoded.find(s.as_str()).map(|at| (at, s))).min();
            if let Some((at, s)) = found {
                let keep = if params.include_stop_str_in_output { at + s.len() } else { at };
                return Some((
                    FinishReason::Stop { matched: Some(StopMatch::Text(s.clone())) },
                    Some(keep),
                ));
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
    let longest = params.stop.iter().map(String::len).max().unwrap_or(0);
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

    #[test]
    fn a_windows_first_characters_are_not_trusted() {
        assert_eq!(trusted_tail("\u{FFFD}\u{FFFD}abcdef"), Some("cdef"));
        assert_eq!(trusted_tail(" hello"), Some("ello"));
        assert_eq!(trusted_tail("ab"), None);
    }
}
