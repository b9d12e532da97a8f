//! vLLM's `hermes` format (Qwen2.5, Qwen3, Granite 4.0, Hermes 2 Pro and most ChatML tool
//! templates): each call is a JSON object `{"name": ..., "arguments": ...}` between `<tool_call>`
//! and `</tool_call>`, the last one possibly without its closing tag (the output ended there).
//!
//! A whole answer ([`extract`]) is what vLLM makes of it: the text before the first call is the
//! message's content (none when empty), every call is parsed, and if any of them is not such an
//! object the answer has no calls and the whole text is its content.
//!
//! A stream ([`HermesStream`]) sends text as content until a `<tool_call>` begins (holding back
//! what may be the start of one), then each call whole, as one delta, once its closing tag (or
//! the end of the output) arrives; clients that accumulate deltas read the same calls. A call
//! that does not parse is sent as text. Text between and after calls is dropped, as the whole
//! answer drops it.

use super::{CallId, Extracted, StreamDelta, ToolCall};
use crate::detok::held_back;

const CALL_START: &str = "<tool_call>";
const CALL_END: &str = "</tool_call>";

/// Splits a whole answer's `text` into its content and its calls (the module's rules).
pub(crate) fn extract(text: &str) -> Extracted {
    let no_calls = || Extracted { content: Some(text.to_owned()), calls: Vec::new() };
    let Some(first) = text.find(CALL_START) else { return no_calls() };
    let mut calls = Vec::new();
    let mut rest = &text[first..];
    while let Some(start) = rest.find(CALL_START) {
        let body = &rest[start + CALL_START.len()..];
        let (body, next) = match body.find(CALL_END) {
            Some(end) => (&body[..end], &body[end + CALL_END.len()..]),
            None => (body, ""),
        };
        match ToolCall::parse(body, CallId::Vllm) {
            Some(call) => calls.push(call),
            None => return no_calls(),
        }
        rest = next;
    }
    let content = &text[..first];
    Extracted { content: (!content.is_empty()).then(|| content.to_owned()), calls }
}

/// Splits a streamed answer's text deltas into content and calls (the module's rules). Each
/// byte is searched for a tag about once, however the answer is cut: a long call is not searched
/// again from its start at every delta.
#[derive(Debug, Default)]
pub(crate) struct HermesStream {
    /// Text received and not sent or dropped yet: what may start a tag, or the call being read.
    pending: String,
    /// A `<tool_call>` has begun: nothing after it is content any more.
    in_calls: bool,
    /// Where the open call's body starts in `pending` (`pending` then starts with its tag).
    open: Option<usize>,
    /// How far the open call's body has been searched for its closing tag without finding it.
    searched: usize,
    /// Calls sent.
    num_calls: usize,
}

impl HermesStream {
    /// Takes the next text delta.
    pub(crate) fn push(&mut self, delta: &str) -> StreamDelta {
        self.pending.push_str(delta);
        let mut out = StreamDelta::default();
        if !self.in_calls {
            match self.pending.find(CALL_START) {
                Some(at) => {
                    out.content.extend(self.pending.drain(..at));
                    self.in_calls = true;
                }
                None => {
                    // What may be the start of a `<tool_call>` waits for the next delta.
                    let send = self.pending.len() - held_back(&self.pending, CALL_START);
                    out.content.extend(self.pending.drain(..send));
                    return out;
                }
            }
        }
        self.take_calls(&mut out, false);
        out
    }

    /// Takes the last text delta at the end of the answer: a call without its closing tag ends
    /// there, and held-back text is content after all.
    pub(crate) fn finish(&mut self, rest: &str) -> StreamDelta {
        let mut out = self.push(rest);
        if self.in_calls {
            self.take_calls(&mut out, true);
        } else {
            out.content.push_str(&self.pending);
        }
        self.pending.clear();
        out
    }

    /// Calls sent so far.
    pub(crate) fn num_calls(&self) -> usize {
        self.num_calls
    }

    /// Moves every complete call in `pending` into `out` (at the end, `ended`, also one that
    /// lacks its closing tag), dropping the text between calls; a call that does not parse goes
    /// out as content.
    fn take_calls(&mut self, out: &mut StreamDelta, ended: bool) {
        loop {
            let Some(body) = self.open else {
                match self.pending.find(CALL_START) {
                    Some(start) => {
                        self.pending.drain(..start);
                        (self.open, self.searched) = (Some(CALL_START.len()), CALL_START.len());
                        continue;
                    }
                    None => {
                        // Text between or after calls is dropped; a tag's start may wait.
                        let keep = if ended { 0 } else { held_back(&self.pending, CALL_START) };
                        self.pending.drain(..self.pending.len() - keep);
                        return;
                    }
                }
            };
            let taken = match self.pending[self.searched..].find(CALL_END) {
                Some(end) => self.searched + end,
                None if ended => self.pending.len(),
                None => {
                    // The closing tag may straddle this delta and the next.
                    let mut from = self.pending.len().saturating_sub(CALL_END.len() - 1);
                    while !self.pending.is_char_boundary(from) {
                        from -= 1;
                    }
                    self.searched = from.max(body);
                    return;
                }
            };
            let block_end = (taken + CALL_END.len()).min(self.pending.len());
            match ToolCall::parse(&self.pending[body..taken], CallId::Vllm) {
                Some(call) => {
                    out.calls.push((self.num_calls, call));
                    self.num_calls += 1;
                }
                None => out.content.push_str(&self.pending[..block_end]),
            }
            self.pending.drain(..block_end);
            self.open = None;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::{assert_streams_as_whole, call, streamed};
    use super::*;
    use crate::tools::ToolCallParser::Hermes;

    #[test]
    fn a_whole_answer_splits_into_the_text_before_and_the_calls() {
        let text = "Let me look.\n<tool_call>\n{\"name\": \"weather\", \"arguments\": \
                    {\"city\":\"Paris\",\"days\":[1, 2]}}\n</tool_call>\n<tool_call>\n{\"name\": \
                    \"time\", \"arguments\": {}}\n</tool_call>";
        let got = extract(text);
        assert_eq!(got.content.as_deref(), Some("Let me look.\n"));
        let want = [call("weather", r#"{"city": "Paris", "days": [1, 2]}"#), call("time", "{}")];
        assert_eq!(got.calls, want);
    }

    #[test]
    fn text_without_calls_or_with_a_broken_one_is_all_content() {
        for text in [
            "no calls here",
            "<tool_call>{\"name\": \"f\"}</tool_call>",
            "<tool_call>{\"name\": 3, \"arguments\": {}}</tool_call>",
            "<tool_call>not json</tool_call>",
            "a <tool_call>{\"name\": \"f\", \"arguments\": {}}</tool_call><tool_call>[1]",
        ] {
            let got = extract(text);
            assert_eq!(got, Extracted { content: Some(text.into()), calls: vec![] }, "{text}");
        }
    }

    #[test]
    fn an_unclosed_last_call_ends_with_the_text_and_no_text_before_is_no_content() {
        let got = extract("<tool_call>{\"name\": \"f\", \"arguments\": {\"s\": \"a, b: c\\\"\"}}");
        assert_eq!(got.content, None);
        assert_eq!(got.calls, [call("f", r#"{"s": "a, b: c\""}"#)]);
    }

    #[test]
    fn a_stream_in_any_pieces_sends_the_whole_answers_content_and_calls() {
        assert_streams_as_whole(
            Hermes,
            &[
                "plain text with < and <tool and <tool_cal but no call",
                "Sure.<tool_call>{\"name\": \"a\", \"arguments\": {\"k\": \"<tool_call>\"}}</tool_call>",
                "<tool_call>\n{\"name\": \"a\", \"arguments\": {}}\n</tool_call>\n\n<tool_call>\n\
                 {\"name\": \"b\", \"arguments\": [1,2]}",
                "é ü <tool_call>{\"name\": \"ñ\", \"arguments\": {\"v\": \"日本\"}}</tool_call> tail",
            ],
        );
    }

    #[test]
    fn a_long_call_streamed_a_character_at_a_time_is_the_whole_answers() {
        let long = "ü, x: ".repeat(400);
        let text = format!(
            "a<tool_call>{{\"name\": \"write\", \"arguments\": {{\"s\": \"{long}\"}}}}</tool_call> b"
        );
        let cuts: Vec<usize> = (1..text.len()).filter(|&i| text.is_char_boundary(i)).collect();
        let whole = extract(&text);
        assert_eq!(whole.calls.len(), 1);
        assert_eq!(streamed(Hermes, &text, &cuts), (whole.content.unwrap(), whole.calls));
    }

    #[test]
    fn a_streamed_call_that_does_not_parse_is_sent_as_text() {
        let text = "<tool_call>{\"name\": \"a\", \"arguments\": {}}</tool_call><tool_call>oops</tool_call>";
        let (content, calls) = streamed(Hermes, text, &[20, 60]);
        assert_eq!(content, "<tool_call>oops</tool_call>");
        assert_eq!(calls, [call("a", "{}")]);
    }
}
