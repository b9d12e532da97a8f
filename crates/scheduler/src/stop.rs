//! Stop conditions, checked after each sampled token.

use routed_types::{FinishReason, SamplingParams, StopMatch, TokenId};

/// Whether a sequence with `output` (the token just sampled last) stops now. `text` decodes the
/// output (with `skip_special_tokens` as the request asks) when stop strings need it; it is only
/// called when the request has stop strings. Returns the reason and, for a stop string, the byte
/// length of the text to keep: up to the match, or through it with
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
        if !params.stop.is_empty() {
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
}
