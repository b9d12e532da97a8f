//! vLLM's `hermes` format (Qwen2.5, Qwen3, Granite 4.0, Hermes 2 Pro and most ChatML tool
//! templates): each call is a JSON object `{"name": ..., "arguments": ...}` between `<tool_call>`
//! and `</tool_call>`, the last one possibly without its closing tag (the output ended there).
//!
//! A whole answer ([`extract`]) is what vLLM makes of it: the text before the first call is the
//! message's content (none when empty), every call is parsed, and if any of them is not such an
//! object the answer has no calls and the whole text is its content.
//!
//! A stream ([`HermesStream`]) sends text as content until a `<tool_call>` begins (holding back
//! what may be the start of one). A call that begins as models write one, `{"name": "...",
//! "arguments": ` and an object or a list, goes out as vLLM streams it: its name once that much
//! has come, then its arguments' text as it comes (rewritten with vLLM's separators as it goes,
//! so the pieces add up to the whole answer's arguments). Any other call goes out whole once its
//! closing tag (or the end of the output) arrives, or as text if it does not parse; a call whose
//! name went out stays a call with the arguments sent, even if its text turns out broken. Text
//! between and after calls is dropped, as the whole answer drops it.

use super::{CallDelta, CallId, Extracted, PySeparators, StreamDelta, ToolCall};
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
    /// How the open call goes out.
    lead: Lead,
    /// Calls sent, or begun.
    num_calls: usize,
}

/// How an open call goes out: its name and its arguments as they come when it begins as models
/// write calls (`{"name": "...", "arguments": ` then an object or a list), else whole once
/// closed.
#[derive(Debug, Default)]
enum Lead {
    /// Not known yet: the body so far may still begin so.
    #[default]
    Undecided,
    /// Named; its arguments go out as they come.
    Streaming(Arguments),
    /// Whole once closed (or as text, if it is no call).
    Whole,
}

/// An open call's arguments as they go out.
#[derive(Debug)]
struct Arguments {
    /// Where they are scanned up to in `pending`.
    scanned: usize,
    /// Brackets and braces open.
    depth: usize,
    /// The value closed: the rest of the body is not arguments.
    closed: bool,
    /// The value's text rewritten as it goes (`PySeparators`).
    separators: PySeparators,
    /// The rewritten text sent.
    sent: String,
}

/// How a call's body begins, so far.
enum Begins {
    /// `{"name": <string>, "arguments": ` and the value's first byte, at `at`.
    Named { name: String, at: usize },
    /// Not known yet.
    Maybe,
    /// Some other way.
    Otherwise,
}

/// How `body` begins: a name, then the arguments (the order models write a call in).
fn begins(body: &str) -> Begins {
    let bytes = body.as_bytes();
    let Ok(i) = literals(body, 0, &["{", "\"name\"", ":"]) else { return Begins::Maybe };
    let Some(name_from) = i else { return Begins::Otherwise };
    match bytes.get(name_from) {
        None => return Begins::Maybe,
        Some(b'"') => {}
        Some(_) => return Begins::Otherwise,
    }
    let (mut at, mut escaped) = (name_from, false);
    let name_end = loop {
        at += 1;
        match bytes.get(at) {
            None => return Begins::Maybe,
            Some(_) if escaped => escaped = false,
            Some(b'\\') => escaped = true,
            Some(b'"') => break at + 1,
            Some(_) => {}
        }
    };
    let Ok(name) = serde_json::from_str::<String>(&body[name_from..name_end]) else {
        return Begins::Otherwise;
    };
    match literals(body, name_end, &[",", "\"arguments\"", ":"]) {
        Err(()) => Begins::Maybe,
        Ok(None) => Begins::Otherwise,
        Ok(Some(at)) => match bytes.get(at) {
            None => Begins::Maybe,
            Some(b'{' | b'[') => Begins::Named { name, at },
            Some(_) => Begins::Otherwise,
        },
    }
}

/// Reads `expected` in turn from `at` in `body`, JSON whitespace around each: where the text
/// after them (and its leading whitespace) starts, `None` where the body says something else,
/// `Err` where it ends before saying.
fn literals(body: &str, mut at: usize, expected: &[&str]) -> Result<Option<usize>, ()> {
    let skip = |mut i: usize| {
        while body.as_bytes().get(i).is_some_and(|b| matches!(b, b' ' | b'\t' | b'\n' | b'\r')) {
            i += 1;
        }
        i
    };
    for literal in expected {
        at = skip(at);
        match &body[at..] {
            rest if rest.starts_with(literal) => at += literal.len(),
            rest if literal.starts_with(rest) => return Err(()),
            _ => return Ok(None),
        }
    }
    Ok(Some(skip(at)))
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

    /// Calls sent (or begun) so far.
    pub(crate) fn num_calls(&self) -> usize {
        self.num_calls
    }

    /// Moves every complete call in `pending` into `out` (at the end, `ended`, also one that
    /// lacks its closing tag), and what can go out of the open one, dropping the text between
    /// calls; a call that does not parse goes out as content, unless its name already went out.
    fn take_calls(&mut self, out: &mut StreamDelta, ended: bool) {
        loop {
            let Some(body) = self.open else {
                match self.pending.find(CALL_START) {
                    Some(start) => {
                        self.pending.drain(..start);
                        (self.open, self.searched) = (Some(CALL_START.len()), CALL_START.len());
                        self.lead = Lead::Undecided;
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
                    self.stream_arguments(body, self.searched, out);
                    return;
                }
            };
            self.stream_arguments(body, taken, out);
            let block_end = (taken + CALL_END.len()).min(self.pending.len());
            let call = ToolCall::parse(&self.pending[body..taken], CallId::Vllm);
            match (std::mem::take(&mut self.lead), call) {
                (Lead::Streaming(args), Some(call)) => {
                    // What the scan has not sent (a value cut short): the rest of the whole.
                    if let Some(rest) = call.arguments.strip_prefix(args.sent.as_str())
                        && !rest.is_empty()
                    {
                        let text = rest.to_owned();
                        out.calls.push(CallDelta::Arguments { index: self.num_calls - 1, text });
                    }
                }
                // Its name went out: it stays a call, with the arguments sent.
                (Lead::Streaming(_), None) => {}
                (_, Some(call)) => {
                    out.calls.push(CallDelta::Whole(self.num_calls, call));
                    self.num_calls += 1;
                }
                (_, None) => out.content.push_str(&self.pending[..block_end]),
            }
            self.pending.drain(..block_end);
            self.open = None;
        }
    }

    /// Sends what can go out of the open call whose body starts at `body`, reading `pending` up
    /// to `limit`: its name once its body has begun as a call does, then its arguments' text.
    fn stream_arguments(&mut self, body: usize, limit: usize, out: &mut StreamDelta) {
        if let Lead::Undecided = self.lead {
            match begins(&self.pending[body..limit]) {
                Begins::Named { name, at } => {
                    let id = CallId::Vllm;
                    out.calls.push(CallDelta::Named { index: self.num_calls, name, id });
                    self.num_calls += 1;
                    self.lead = Lead::Streaming(Arguments {
                        scanned: body + at,
                        depth: 0,
                        closed: false,
                        separators: PySeparators::default(),
                        sent: String::new(),
                    });
                }
                Begins::Maybe => return,
                Begins::Otherwise => self.lead = Lead::Whole,
            }
        }
        let Lead::Streaming(args) = &mut self.lead else { return };
        let mut text = String::new();
        let from = args.scanned;
        // The value starts with its bracket (`begins`), so it closes where the depth is 0 again.
        for (at, c) in self.pending[from..limit].char_indices() {
            if args.closed {
                break;
            }
            if !args.separators.in_string() {
                match c {
                    '{' | '[' => args.depth += 1,
                    '}' | ']' => {
                        args.depth -= 1;
                        args.closed = args.depth == 0;
                    }
                    _ => {}
                }
            }
            args.separators.push(c, &mut text);
            args.scanned = from + at + c.len_utf8();
        }
        if !text.is_empty() {
            args.sent.push_str(&text);
            out.calls.push(CallDelta::Arguments { index: self.num_calls - 1, text });
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

    /// The pieces `text` streams into, fed a character at a time.
    fn pieces(text: &str) -> Vec<CallDelta> {
        let mut stream = HermesStream::default();
        let mut pieces: Vec<CallDelta> = Vec::new();
        for (at, c) in text.char_indices() {
            let piece = &text[at..at + c.len_utf8()];
            let last = at + c.len_utf8() == text.len();
            let delta = if last { stream.finish(piece) } else { stream.push(piece) };
            pieces.extend(delta.calls);
        }
        pieces
    }

    #[test]
    fn a_call_streams_its_name_then_its_arguments_as_they_come() {
        let text = "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\":1,\"b\":[2, \"}\"]}}\n\
                    </tool_call>";
        let pieces = pieces(text);
        let CallDelta::Named { index: 0, name, .. } = &pieces[0] else { panic!("{pieces:?}") };
        assert_eq!(name, "f");
        let arguments: Vec<&str> = pieces[1..]
            .iter()
            .map(|p| match p {
                CallDelta::Arguments { index: 0, text } => text.as_str(),
                other => panic!("{other:?}"),
            })
            .collect();
        assert!(arguments.len() > 5, "{arguments:?}");
        assert_eq!(arguments.concat(), extract(text).calls[0].arguments);
        assert_eq!(arguments.concat(), "{\"a\": 1, \"b\": [2, \"}\"]}");
    }

    #[test]
    fn a_call_that_begins_otherwise_goes_out_whole_and_a_named_one_stays_a_call() {
        // Arguments first, or a scalar: whole once closed.
        for text in [
            "<tool_call>{\"arguments\": {\"a\": 1}, \"name\": \"f\"}</tool_call>",
            "<tool_call>{\"name\": \"f\", \"arguments\": \"x\"}</tool_call>",
        ] {
            let whole = extract(text).calls;
            assert_eq!(pieces(text), [CallDelta::Whole(0, whole[0].clone())], "{text}");
        }
        // Named, then broken: a call with the arguments sent, as vLLM streams it.
        let (content, calls) =
            streamed(Hermes, "<tool_call>{\"name\": \"f\", \"arguments\": {\"a\" 1}", &[]);
        assert_eq!((content.as_str(), calls.len()), ("", 1));
        assert_eq!((calls[0].name.as_str(), calls[0].arguments.as_str()), ("f", "{\"a\"1}"));
    }

    #[test]
    fn a_streamed_call_that_does_not_parse_is_sent_as_text() {
        let text = "<tool_call>{\"name\": \"a\", \"arguments\": {}}</tool_call><tool_call>oops</tool_call>";
        let (content, calls) = streamed(Hermes, text, &[20, 60]);
        assert_eq!(content, "<tool_call>oops</tool_call>");
        assert_eq!(calls, [call("a", "{}")]);
    }
}
