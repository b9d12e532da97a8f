//! Incremental detokenization for streaming: text deltas as tokens arrive.
//!
//! Decoding token by token breaks multi-byte characters and merges, so each step decodes a short
//! window (as TGI and vLLM do) and emits only the text past what the window already produced,
//! holding back a trailing U+FFFD (an incomplete character). The text a client has been sent must
//! never contain a stop string, which the engine cuts from its final text, so the tail that could
//! still grow into a stop string is held back too, and so is the text of a token that may end the
//! request (EOS, a stop token), which the final text leaves out unless the request keeps its
//! stop. The engine's final text is authoritative: the last delta is whatever of it has not been
//! sent.

use routed_model::Tokenizer;
use routed_types::{SamplingParams, TokenId};

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
        let mut safe = safe_len(&self.decoded, &params.stop);
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

/// How many bytes of `text` may be sent: up to the first complete stop string, and short of any
/// suffix that is a proper prefix of a stop string.
fn safe_len(text: &str, stop: &[String]) -> usize {
    let mut safe = text.len();
    for s in stop.iter().filter(|s| !s.is_empty()) {
        if let Some(at) = text.find(s.as_str()) {
            safe = safe.min(at);
        }
        // Longest suffix of `text` that is a proper prefix of `s`.
        for (i, _) in s.char_indices().skip(1).collect::<Vec<_>>().into_iter().rev() {
            if text.ends_with(&s[..i]) {
                safe = safe.min(text.len() - i);
                break;
            }
        }
    }
    safe
}

#[cfg(test)]
mod tests {
    use super::safe_len;

    #[test]
    fn holds_back_a_possible_stop_prefix() {
        let stop = vec!["STOP".to_owned()];
        assert_eq!(safe_len("hello ST", &stop), 6);
        assert_eq!(safe_len("hello", &stop), 5);
        assert_eq!(safe_len("a STOP b", &stop), 2);
        assert_eq!(safe_len("abc", &[]), 3);
        assert_eq!(safe_len("xaa", &["aab".to_owned()]), 1);
    }
}
