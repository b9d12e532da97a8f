//! vLLM's `mistral` format, as Mistral's tokenizers before v11 have it (Mixtral 8x22B Instruct):
//! the calls are one JSON list after a `[TOOL_CALLS]` token, `[TOOL_CALLS] [{"name": ...,
//! "arguments": {...}}, ...]`.
//!
//! A whole answer ([`extract`]) is what vLLM makes of it: the text before `[TOOL_CALLS]` is the
//! content (none when empty); the first JSON value after it is the list (text after the value is
//! ignored), or, where no JSON value starts there, the text from the first `[{` to the last `}]`
//! is; each entry is a call, its `arguments` `{}` when it has none. An answer without the token,
//! or whose list is not one of calls, has no calls and the whole text is its content. Calls take
//! Mistral's 9-character ids.
//!
//! A stream ([`MistralStream`]) sends text as content until `[TOOL_CALLS]` (holding back what may
//! be its start), then holds the rest: the calls go out whole as soon as the list after the token
//! closes and parses, and otherwise the answer's end settles it as the whole answer would be.

use std::collections::HashMap;

use serde_json::value::RawValue;

use super::{CallDelta, CallId, Extracted, StreamDelta, ToolCall, python_separators};
use crate::detok::held_back;

/// What opens the calls (a special token in Mistral's tokenizers: the server keeps special
/// tokens in the text of a chat that reads calls, as vLLM does).
const BOT: &str = "[TOOL_CALLS]";

/// Splits a whole answer's `text` into its content and its calls (the module's rules).
pub(crate) fn extract(text: &str) -> Extracted {
    let no_calls = || Extracted { content: Some(text.to_owned()), calls: Vec::new() };
    let Some(at) = text.find(BOT) else { return no_calls() };
    match calls_in(&text[at + BOT.len()..]) {
        Some(calls) => {
            let content = &text[..at];
            Extracted { content: (!content.is_empty()).then(|| content.to_owned()), calls }
        }
        None => no_calls(),
    }
}

/// The calls the text after `[TOOL_CALLS]` makes: its first JSON value, or where none starts
/// there, the text from the first `[{` to the last `}]`; `None` if that is not a list of calls.
fn calls_in(after: &str) -> Option<Vec<ToolCall>> {
    let after = after.trim();
    let mut values = serde_json::Deserializer::from_str(after).into_iter::<&RawValue>();
    match values.next() {
        Some(Ok(first)) => listed_calls(first.get()),
        _ => {
            let start = after.find("[{")?;
            let end = after.rfind("}]").filter(|&end| end >= start + 2)?;
            listed_calls(&after[start..end + 2])
        }
    }
}

/// The calls `list` (JSON text) makes if it is a list of `{"name": <string>, "arguments"?: ...}`.
fn listed_calls(list: &str) -> Option<Vec<ToolCall>> {
    let entries: Vec<HashMap<String, &RawValue>> = serde_json::from_str(list).ok()?;
    entries
        .into_iter()
        .map(|entry| {
            let name: String = serde_json::from_str(entry.get("name")?.get()).ok()?;
            let arguments = entry.get("arguments").map_or("{}", |a| a.get());
            Some(ToolCall { name, arguments: python_separators(arguments), id: CallId::Mistral })
        })
        .collect()
}

/// Splits a streamed answer's text deltas into content and calls (the module's rules). Each
/// byte after `[TOOL_CALLS]` is scanned once for the end of the list.
#[derive(Debug, Default)]
pub(crate) struct MistralStream {
    /// Text received and not sent yet: what may start `[TOOL_CALLS]`, or, once it came, the
    /// token and everything after it.
    pending: String,
    /// The list after the token, once `[TOOL_CALLS]` came.
    list: Option<ListScan>,
    /// The calls went out: the rest of the answer is dropped, as the whole answer drops it.
    done: bool,
    /// Calls sent.
    num_calls: usize,
}

/// Where the first JSON value after `[TOOL_CALLS]` ends, found a byte at a time.
#[derive(Debug, Default)]
struct ListScan {
    /// Bytes of `pending` scanned.
    scanned: usize,
    /// Brackets and braces open.
    depth: usize,
    /// Inside a string, and just after a backslash there.
    in_string: bool,
    escaped: bool,
    /// The value does not start with `[`, or its end did not parse as calls: only the answer's
    /// end settles it.
    undecided: bool,
}

impl ListScan {
    /// Scans `text` on from where it stopped; the end of the first value once it is found.
    fn end_in(&mut self, text: &str) -> Option<usize> {
        let bytes = text.as_bytes();
        while self.scanned < bytes.len() && !self.undecided {
            let (at, b) = (self.scanned, bytes[self.scanned]);
            self.scanned += 1;
            if self.in_string {
                match b {
                    _ if self.escaped => self.escaped = false,
                    b'\\' => self.escaped = true,
                    b'"' => self.in_string = false,
                    _ => {}
                }
                continue;
            }
            match b {
                b' ' | b'\t' | b'\n' | b'\r' if self.depth == 0 => {}
                b'[' | b'{' => self.depth += 1,
                _ if self.depth == 0 => self.undecided = true,
                b'"' => self.in_string = true,
                b']' | b'}' => {
                    self.depth -= 1;
                    if self.depth == 0 {
                        return Some(at + 1);
                    }
                }
                _ => {}
            }
        }
        None
    }
}

impl MistralStream {
    /// Takes the next text delta.
    pub(crate) fn push(&mut self, delta: &str) -> StreamDelta {
        let mut out = StreamDelta::default();
        if self.done {
            return out;
        }
        self.pending.push_str(delta);
        if self.list.is_none() {
            let Some(at) = self.pending.find(BOT) else {
                // What may be the start of `[TOOL_CALLS]` waits for the next delta.
                let send = self.pending.len() - held_back(&self.pending, BOT);
                out.content.extend(self.pending.drain(..send));
                return out;
            };
            out.content.extend(self.pending.drain(..at));
            self.list = Some(ListScan { scanned: BOT.len(), ..ListScan::default() });
        }
        let scan = self.list.as_mut().expect("the list began");
        if let Some(end) = scan.end_in(&self.pending) {
            match listed_calls(&self.pending[BOT.len()..end]) {
                Some(calls) => self.send(calls, &mut out),
                None => scan.undecided = true,
            }
        }
        out
    }

    /// Takes the last text delta, at the end of the answer: held-back text is content, and a
    /// list not settled yet is read as the whole answer's.
    pub(crate) fn finish(&mut self, rest: &str) -> StreamDelta {
        let mut out = self.push(rest);
        if self.done {
            return out;
        }
        match self.list.is_some().then(|| calls_in(&self.pending[BOT.len()..])).flatten() {
            Some(calls) => self.send(calls, &mut out),
            None => out.content.push_str(&self.pending),
        }
        self.pending.clear();
        out
    }

    /// Calls sent so far.
    pub(crate) fn num_calls(&self) -> usize {
        self.num_calls
    }

    fn send(&mut self, calls: Vec<ToolCall>, out: &mut StreamDelta) {
        let first = self.num_calls;
        self.num_calls += calls.len();
        out.calls.extend((first..).zip(calls).map(|(index, call)| CallDelta::Whole(index, call)));
        self.pending.clear();
        self.done = true;
    }
}

#[cfg(test)]
mod tests {
    use super::super::ToolCallParser::Mistral;
    use super::super::tests::{assert_streams_as_whole, streamed};
    use super::*;

    fn call(name: &str, arguments: &str) -> ToolCall {
        ToolCall { name: name.into(), arguments: arguments.into(), id: CallId::Mistral }
    }

    #[test]
    fn a_whole_answer_splits_into_the_text_before_and_the_list_of_calls() {
        let text = "Let me look. [TOOL_CALLS] [{\"name\": \"weather\", \"arguments\": \
                    {\"city\":\"Paris\",\"days\":[1, 2]}}, {\"name\": \"time\"}]";
        let got = extract(text);
        assert_eq!(got.content.as_deref(), Some("Let me look. "));
        let want = [call("weather", r#"{"city": "Paris", "days": [1, 2]}"#), call("time", "{}")];
        assert_eq!(got.calls, want);
        // Text after the list is ignored; without text before there is no content.
        let got = extract("[TOOL_CALLS][{\"name\": \"f\", \"arguments\": null}] and more");
        assert_eq!(got, Extracted { content: None, calls: vec![call("f", "null")] });
    }

    #[test]
    fn where_no_json_value_follows_the_token_the_outermost_list_of_objects_is_read() {
        let got =
            extract("[TOOL_CALLS] calls: [{\"name\": \"f\", \"arguments\": {\"a\": [{}]}}] ok");
        assert_eq!(got, Extracted { content: None, calls: vec![call("f", "{\"a\": [{}]}")] });
    }

    #[test]
    fn text_without_the_token_or_with_a_list_that_is_not_calls_is_all_content() {
        for text in [
            "no calls here",
            "[TOOL_CALLS]",
            "[TOOL_CALLS] {\"name\": \"f\", \"arguments\": {}}",
            "a [TOOL_CALLS] [{\"name\": 3}]",
            "a [TOOL_CALLS] [{\"arguments\": {}}]",
            "a [TOOL_CALLS] [{\"name\": \"f\"}, 1]",
            "a [TOOL_CALLS] [{\"name\": \"f\"",
            "a [TOOL_CALLS] not json [{\"name\": \"f\"",
        ] {
            let got = extract(text);
            assert_eq!(got, Extracted { content: Some(text.into()), calls: vec![] }, "{text}");
        }
    }

    #[test]
    fn a_stream_in_any_pieces_sends_the_whole_answers_content_and_calls() {
        assert_streams_as_whole(
            Mistral,
            &[
                "plain text with [ and [TOOL and [TOOL_CALL but no call",
                "Sure.[TOOL_CALLS] [{\"name\": \"a\", \"arguments\": {\"k\": \"]}[TOOL_CALLS]\"}}]",
                "[TOOL_CALLS]\n[{\"name\": \"a\", \"arguments\": {}}, {\"name\": \"b\", \
                 \"arguments\": [1,\"\\\"]\"]}] tail [TOOL_CALLS] [{\"name\": \"c\"}]",
                "é ü [TOOL_CALLS] [{\"name\": \"ñ\", \"arguments\": {\"v\": \"日本\"}}",
                "x[TOOL_CALLS] [{\"name\": \"a\"} {\"name\": \"b\"}] [{\"name\": \"c\"}]",
                "x[TOOL_CALLS] [{\"name\": \"a\"}, 2] y",
                "x[TOOL_CALLS] see [{\"name\": \"a\"}] and [{\"name\": \"b\"}]",
            ],
        );
    }

    #[test]
    fn a_stream_sends_the_calls_when_the_list_closes() {
        let mut stream = MistralStream::default();
        let first = stream.push("Hi [TOOL_CALLS] [{\"name\": \"f\", \"arguments\": {\"x\": ");
        assert_eq!((first.content.as_str(), first.calls.len()), ("Hi ", 0));
        assert_eq!(stream.push("\"]\"}}").calls.len(), 0);
        let closed = stream.push("]");
        assert_eq!(closed.calls, [CallDelta::Whole(0, call("f", "{\"x\": \"]\"}"))]);
        assert_eq!(stream.finish(" and after").content, "");
        let text = "[TOOL_CALLS] [{\"name\": \"f\"}]";
        let cuts: Vec<usize> = (1..text.len()).collect();
        assert_eq!(streamed(Mistral, text, &cuts), (String::new(), vec![call("f", "{}")]));
    }
}
