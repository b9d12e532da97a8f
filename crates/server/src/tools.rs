//! Tool calls in a chat's generated text, read as vLLM's `hermes` parser reads them (the format
//! of Qwen2.5, Qwen3, Hermes 2 Pro and most ChatML tool templates): each call is a JSON object
//! `{"name": ..., "arguments": ...}` between `<tool_call>` and `</tool_call>`, the last one
//! possibly without its closing tag (the output ended there).
//!
//! A whole answer ([`extract`]) is what vLLM makes of it: the text before the first call is the
//! message's content (none when empty), every call is parsed, and if any of them is not such an
//! object the answer has no calls and the whole text is its content. A call's `arguments` keep
//! the model's JSON text, keys in its order, with vLLM's separators (`", "` and `": "`, as
//! Python's `json.dumps` writes them).
//!
//! A stream ([`ToolStream`]) sends text as content until a `<tool_call>` begins (holding back
//! what may be the start of one), then each call whole, as one delta, once its closing tag (or
//! the end of the output) arrives; clients that accumulate deltas read the same calls. A call
//! that does not parse is sent as text. Text between and after calls is dropped, as the whole
//! answer drops it.

use std::hash::{BuildHasher, RandomState};
use std::str::FromStr;
use std::sync::atomic::{AtomicU64, Ordering};

use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::{Value, json};

use crate::detok::held_back;

const CALL_START: &str = "<tool_call>";
const CALL_END: &str = "</tool_call>";

/// The tool-call formats `--tool-call-parser` can name.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ToolCallParser {
    /// `<tool_call>{"name": ..., "arguments": ...}</tool_call>` (vLLM's `hermes`).
    Hermes,
}

impl ToolCallParser {
    /// The name `--tool-call-parser` takes.
    pub fn name(self) -> &'static str {
        match self {
            Self::Hermes => "hermes",
        }
    }
}

impl FromStr for ToolCallParser {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "hermes" => Ok(Self::Hermes),
            other => Err(format!("unknown tool call parser '{other}'; supported: hermes")),
        }
    }
}

/// How a chat's tool calls come out of its answer (`tool_choice`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) enum ToolUse {
    /// None are read: no tools, or `tool_choice: "none"`.
    #[default]
    None,
    /// Read from the text by the server's parser (`tool_choice: "auto"`).
    Parsed,
    /// The answer, constrained to the function's parameters, is one call to it (`tool_choice`
    /// naming a function); its `arguments` are the answer as written, as vLLM's are.
    Named(String),
    /// The answer, constrained to a list of `{"name": ..., "parameters": ...}` naming the tools
    /// (`tool_choice: "required"`), is the calls.
    Required,
}

/// One entry of a required choice's list, borrowing its parameters' text.
#[derive(Deserialize)]
struct Listed<'a> {
    name: String,
    #[serde(borrow)]
    parameters: &'a RawValue,
}

impl ToolUse {
    /// Whether the answer is constrained to calls.
    pub(crate) fn is_forced(&self) -> bool {
        matches!(self, Self::Named(_) | Self::Required)
    }

    /// Whether an answer that `made_calls` (parsed, or a required list whole) and `stopped`
    /// finishes with `tool_calls`, as vLLM answers: parsed calls always, a required list when
    /// the answer stopped, a named call never (it keeps the answer's own reason).
    pub(crate) fn finishes_with_calls(&self, made_calls: bool, stopped: bool) -> bool {
        match self {
            Self::Parsed => made_calls,
            Self::Required => made_calls && stopped,
            Self::None | Self::Named(_) => false,
        }
    }

    /// The calls a forced choice's whole answer makes; `None` for the other kinds, and for a
    /// required list that does not parse (the answer was cut short).
    pub(crate) fn forced_calls(&self, answer: &str) -> Option<Vec<ToolCall>> {
        match self {
            Self::Named(name) => {
                Some(vec![ToolCall { name: name.clone(), arguments: answer.to_owned() }])
            }
            Self::Required => {
                let listed: Vec<Listed<'_>> = serde_json::from_str(answer).ok()?;
                let call = |l: Listed<'_>| ToolCall {
                    name: l.name,
                    arguments: python_separators(l.parameters.get()),
                };
                Some(listed.into_iter().map(call).collect())
            }
            Self::None | Self::Parsed => None,
        }
    }
}

/// A forced choice's streamed answer: a named call's arguments go out as they come, the first
/// delta naming the call (as vLLM streams it); a required list's calls go out whole at its end
/// (cut short, its text as content).
#[derive(Debug)]
pub(crate) struct ForcedStream {
    tools: ToolUse,
    /// A required list's text so far.
    answer: String,
    /// A named call's first delta was sent.
    started: bool,
}

impl ForcedStream {
    /// Nothing streamed yet of a `tools` answer (a forced kind).
    pub(crate) fn new(tools: ToolUse) -> Self {
        Self { tools, answer: String::new(), started: false }
    }

    /// The answer's next `text` (`end`: its last): the content to send, and the calls' deltas.
    pub(crate) fn push(&mut self, text: &str, end: bool) -> (String, Vec<Value>) {
        match &self.tools {
            ToolUse::Named(name) => {
                if text.is_empty() && (self.started || !end) {
                    return (String::new(), Vec::new());
                }
                let delta = match std::mem::replace(&mut self.started, true) {
                    true => json!({"index": 0, "function": {"arguments": text}}),
                    false => json!({"index": 0, "id": call_id(), "type": "function",
                                    "function": {"name": name, "arguments": text}}),
                };
                (String::new(), vec![delta])
            }
            tools => {
                self.answer.push_str(text);
                if !end {
                    return (String::new(), Vec::new());
                }
                match tools.forced_calls(&self.answer) {
                    Some(calls) => {
                        let deltas = calls.iter().enumerate().map(|(i, c)| c.to_delta_json(i));
                        (String::new(), deltas.collect())
                    }
                    None => (std::mem::take(&mut self.answer), Vec::new()),
                }
            }
        }
    }
}

/// One call the model made.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct ToolCall {
    /// The function's name.
    pub name: String,
    /// Its arguments as JSON text.
    pub arguments: String,
}

/// The JSON object between the tags, borrowing the arguments' text.
#[derive(Deserialize)]
struct RawCall<'a> {
    name: String,
    #[serde(borrow)]
    arguments: &'a RawValue,
}

impl ToolCall {
    /// The call written between the tags, if it is one.
    fn parse(body: &str) -> Option<Self> {
        let raw: RawCall<'_> = serde_json::from_str(body).ok()?;
        Some(Self { name: raw.name, arguments: python_separators(raw.arguments.get()) })
    }

    /// The call as a message's `tool_calls` entry, with a fresh id.
    pub(crate) fn to_message_json(&self) -> Value {
        json!({
            "id": call_id(),
            "type": "function",
            "function": {"name": self.name, "arguments": self.arguments},
        })
    }

    /// The call as a streamed delta's `tool_calls` entry: the whole call at once.
    pub(crate) fn to_delta_json(&self, index: usize) -> Value {
        let mut call = self.to_message_json();
        call["index"] = json!(index);
        call
    }
}

/// `chatcmpl-tool-` and 32 hex digits, as vLLM names calls.
fn call_id() -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let (a, b) = (RandomState::new().hash_one(n), RandomState::new().hash_one(!n));
    format!("chatcmpl-tool-{a:016x}{b:016x}")
}

/// JSON text with the whitespace outside strings replaced by Python's default separators.
fn python_separators(json: &str) -> String {
    let mut out = String::with_capacity(json.len() + json.len() / 4);
    let (mut in_string, mut escaped) = (false, false);
    for c in json.chars() {
        if in_string {
            out.push(c);
            match c {
                _ if escaped => escaped = false,
                '\\' => escaped = true,
                '"' => in_string = false,
                _ => {}
            }
            continue;
        }
        match c {
            '"' => {
                in_string = true;
                out.push(c);
            }
            ',' => out.push_str(", "),
            ':' => out.push_str(": "),
            ' ' | '\t' | '\n' | '\r' => {}
            c => out.push(c),
        }
    }
    out
}

/// A whole answer's text split into content and calls.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Extracted {
    /// The text before the first call (all of it without calls); `None` when empty.
    pub content: Option<String>,
    /// The calls, in order.
    pub calls: Vec<ToolCall>,
}

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
        match ToolCall::parse(body) {
            Some(call) => calls.push(call),
            None => return no_calls(),
        }
        rest = next;
    }
    let content = &text[..first];
    Extracted { content: (!content.is_empty()).then(|| content.to_owned()), calls }
}

/// What a stream sends for some text: content and the calls completed.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct StreamDelta {
    /// Text to send as content (may be empty).
    pub content: String,
    /// Calls completed, each with its index among the answer's calls.
    pub calls: Vec<(usize, ToolCall)>,
}

/// Splits a streamed answer's text deltas into content and calls (the module's rules). Each
/// byte is searched for a tag about once, however the answer is cut: a long call is not searched
/// again from its start at every delta.
#[derive(Debug, Default)]
pub(crate) struct ToolStream {
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

impl ToolStream {
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
            match ToolCall::parse(&self.pending[body..taken]) {
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
    use super::*;
    use routed_test_support::SplitMix64;

    fn call(name: &str, arguments: &str) -> ToolCall {
        ToolCall { name: name.into(), arguments: arguments.into() }
    }

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
    fn arguments_keep_their_order_and_strings_with_python_separators() {
        let raw = "{ \"b\" :1,\n\"a\": {\"x y\": [true, null]}, \"c\": \"\\u00e9 ,:\"}";
        assert_eq!(
            python_separators(raw),
            r#"{"b": 1, "a": {"x y": [true, null]}, "c": "\u00e9 ,:"}"#
        );
    }

    /// The stream's content and calls, fed `text` in pieces at `cuts`.
    fn streamed(text: &str, cuts: &[usize]) -> (String, Vec<ToolCall>) {
        let mut stream = ToolStream::default();
        let (mut content, mut calls) = (String::new(), Vec::new());
        let mut from = 0;
        for &cut in cuts.iter().chain([text.len()].iter()) {
            let piece = &text[from..cut];
            let delta = if cut == text.len() { stream.finish(piece) } else { stream.push(piece) };
            content.push_str(&delta.content);
            for (index, call) in delta.calls {
                assert_eq!(index, calls.len(), "indices in order");
                calls.push(call);
            }
            from = cut;
        }
        assert_eq!(stream.num_calls(), calls.len());
        (content, calls)
    }

    #[test]
    fn a_stream_in_any_pieces_sends_the_whole_answers_content_and_calls() {
        let texts = [
            "plain text with < and <tool and <tool_cal but no call",
            "Sure.<tool_call>{\"name\": \"a\", \"arguments\": {\"k\": \"<tool_call>\"}}</tool_call>",
            "<tool_call>\n{\"name\": \"a\", \"arguments\": {}}\n</tool_call>\n\n<tool_call>\n\
             {\"name\": \"b\", \"arguments\": [1,2]}",
            "é ü <tool_call>{\"name\": \"ñ\", \"arguments\": {\"v\": \"日本\"}}</tool_call> tail",
        ];
        let mut rng = SplitMix64(7);
        for text in texts {
            let whole = extract(text);
            let boundaries: Vec<usize> =
                (1..text.len()).filter(|&i| text.is_char_boundary(i)).collect();
            for _ in 0..200 {
                let mut cuts: Vec<usize> =
                    (0..rng.below(6)).map(|_| boundaries[rng.below(boundaries.len())]).collect();
                cuts.sort_unstable();
                cuts.dedup();
                let (content, calls) = streamed(text, &cuts);
                assert_eq!(
                    content,
                    whole.content.clone().unwrap_or_default(),
                    "{text} at {cuts:?}"
                );
                assert_eq!(calls, whole.calls, "{text} at {cuts:?}");
            }
        }
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
        assert_eq!(streamed(&text, &cuts), (whole.content.unwrap(), whole.calls));
    }

    #[test]
    fn a_streamed_call_that_does_not_parse_is_sent_as_text() {
        let text = "<tool_call>{\"name\": \"a\", \"arguments\": {}}</tool_call><tool_call>oops</tool_call>";
        let (content, calls) = streamed(text, &[20, 60]);
        assert_eq!(content, "<tool_call>oops</tool_call>");
        assert_eq!(calls, [call("a", "{}")]);
    }

    #[test]
    fn calls_have_vllm_ids_and_shapes() {
        let c = call("f", "{}");
        let (one, two) = (c.to_message_json(), c.to_delta_json(3));
        let id = one["id"].as_str().unwrap();
        assert!(id.starts_with("chatcmpl-tool-") && id.len() == 14 + 32, "{id}");
        assert_ne!(one["id"], two["id"]);
        assert_eq!(one["type"], "function");
        assert_eq!(one["function"], json!({"name": "f", "arguments": "{}"}));
        assert_eq!(two["index"], 3);
    }

    #[test]
    fn a_forced_stream_sends_a_named_calls_arguments_as_they_come_and_a_list_whole() {
        let mut named = ForcedStream::new(ToolUse::Named("f".into()));
        let (content, first) = named.push("{\"a\"", false);
        assert_eq!(content, "");
        assert_eq!(first[0]["function"], json!({"name": "f", "arguments": "{\"a\""}));
        assert!(first[0]["id"].as_str().unwrap().starts_with("chatcmpl-tool-"));
        let (_, next) = named.push(": 1}", false);
        assert_eq!(next, [json!({"index": 0, "function": {"arguments": ": 1}"}})]);
        assert_eq!(named.push("", true), (String::new(), Vec::new()));
        // A named answer with no text still names its call.
        let (_, only) = ForcedStream::new(ToolUse::Named("f".into())).push("", true);
        assert_eq!(only[0]["function"], json!({"name": "f", "arguments": ""}));

        let mut required = ForcedStream::new(ToolUse::Required);
        assert_eq!(required.push("[{\"name\": \"f\", ", false), (String::new(), Vec::new()));
        let (content, calls) = required.push("\"parameters\": {\"x\":1}}]", true);
        assert_eq!(content, "");
        assert_eq!(calls[0]["index"], 0);
        assert_eq!(calls[0]["function"], json!({"name": "f", "arguments": "{\"x\": 1}"}));
        let mut cut = ForcedStream::new(ToolUse::Required);
        cut.push("[{\"na", false);
        assert_eq!(cut.push("me", true), ("[{\"name".to_owned(), Vec::new()));
    }
}
