//! Tool calls in a chat's generated text, read as the server's `--tool-call-parser` reads them
//! ([`ToolCallParser`]: vLLM's `hermes` and `mistral` formats, one module each), or made by a
//! forced `tool_choice` ([`ToolUse`]). A call's `arguments` keep the model's JSON text, keys in
//! its order, with vLLM's separators (`", "` and `": "`, as Python's `json.dumps` writes them).
//!
//! A parser reads a whole answer into content and calls ([`Extracted`]) as vLLM's does, and a
//! streamed one into the same content and calls ([`ToolStream`], [`CallDelta`]): a call goes out
//! whole once it is complete, or its name first and its arguments as they come, so clients that
//! accumulate deltas read the whole answer's calls.

use std::hash::{BuildHasher, RandomState};
use std::str::FromStr;
use std::sync::atomic::{AtomicU64, Ordering};

use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::{Value, json};

mod hermes;
mod mistral;

/// The tool-call formats `--tool-call-parser` can name.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ToolCallParser {
    /// `<tool_call>{"name": ..., "arguments": ...}</tool_call>` (vLLM's `hermes`: Qwen2.5,
    /// Qwen3, Granite 4.0, Hermes).
    Hermes,
    /// `[TOOL_CALLS] [{"name": ..., "arguments": ...}, ...]` (vLLM's `mistral`, as Mistral's
    /// tokenizers before v11 have it: Mixtral 8x22B).
    Mistral,
}

impl ToolCallParser {
    /// The name `--tool-call-parser` takes.
    pub fn name(self) -> &'static str {
        match self {
            Self::Hermes => "hermes",
            Self::Mistral => "mistral",
        }
    }

    /// A whole answer's `text` split into content and calls, as this format has them.
    pub(crate) fn extract(self, text: &str) -> Extracted {
        match self {
            Self::Hermes => hermes::extract(text),
            Self::Mistral => mistral::extract(text),
        }
    }

    /// A stream that reads a streamed answer as [`Self::extract`] reads it whole.
    pub(crate) fn stream(self) -> ToolStream {
        match self {
            Self::Hermes => ToolStream::Hermes(hermes::HermesStream::default()),
            Self::Mistral => ToolStream::Mistral(mistral::MistralStream::default()),
        }
    }
}

impl FromStr for ToolCallParser {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "hermes" => Ok(Self::Hermes),
            "mistral" => Ok(Self::Mistral),
            other => Err(format!("unknown tool call parser '{other}'; supported: hermes, mistral")),
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
    Parsed(ToolCallParser),
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
            Self::Parsed(_) => made_calls,
            Self::Required => made_calls && stopped,
            Self::None | Self::Named(_) => false,
        }
    }

    /// The calls a forced choice's whole answer makes; `None` for the other kinds, and for a
    /// required list that does not parse (the answer was cut short).
    pub(crate) fn forced_calls(&self, answer: &str) -> Option<Vec<ToolCall>> {
        match self {
            Self::Named(name) => Some(vec![ToolCall::new(name.clone(), answer.to_owned())]),
            Self::Required => {
                let listed: Vec<Listed<'_>> = serde_json::from_str(answer).ok()?;
                let call =
                    |l: Listed<'_>| ToolCall::new(l.name, python_separators(l.parameters.get()));
                Some(listed.into_iter().map(call).collect())
            }
            Self::None | Self::Parsed(_) => None,
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
                    false => json!({"index": 0, "id": CallId::Vllm.fresh(), "type": "function",
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
    /// How its id is written.
    pub id: CallId,
}

/// The form of a call's id: a fresh one is drawn whenever a call is written out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum CallId {
    /// `chatcmpl-tool-` and 32 hex digits, as vLLM names calls.
    Vllm,
    /// 9 ASCII letters and digits, as Mistral's tokenizers require (and vLLM's `mistral` parser
    /// writes them).
    Mistral,
}

impl CallId {
    /// A fresh id of this form.
    fn fresh(self) -> String {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let (a, b) = (RandomState::new().hash_one(n), RandomState::new().hash_one(!n));
        match self {
            Self::Vllm => format!("chatcmpl-tool-{a:016x}{b:016x}"),
            Self::Mistral => {
                const ALPHANUMERIC: &[u8] =
                    b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
                // 62^9 is below 2^64: nine base-62 digits of one hash.
                let mut x = a;
                (0..9)
                    .map(|_| {
                        let digit = ALPHANUMERIC[(x % 62) as usize] as char;
                        x /= 62;
                        digit
                    })
                    .collect()
            }
        }
    }
}

/// A call as the model writes it, `{"name": ..., "arguments": ...}`, borrowing the arguments'
/// text.
#[derive(Deserialize)]
struct RawCall<'a> {
    name: String,
    #[serde(borrow)]
    arguments: &'a RawValue,
}

impl ToolCall {
    /// A call with vLLM's ids.
    fn new(name: String, arguments: String) -> Self {
        Self { name, arguments, id: CallId::Vllm }
    }

    /// The call `body` is, if it is one (`{"name": ..., "arguments": ...}`, nothing around it).
    fn parse(body: &str, id: CallId) -> Option<Self> {
        let raw: RawCall<'_> = serde_json::from_str(body).ok()?;
        Some(Self { name: raw.name, arguments: python_separators(raw.arguments.get()), id })
    }

    /// The call as a message's `tool_calls` entry, with a fresh id.
    pub(crate) fn to_message_json(&self) -> Value {
        json!({
            "id": self.id.fresh(),
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

/// JSON text with the whitespace outside strings replaced by Python's default separators.
fn python_separators(json: &str) -> String {
    let mut out = String::with_capacity(json.len() + json.len() / 4);
    let mut separators = PySeparators::default();
    json.chars().for_each(|c| separators.push(c, &mut out));
    out
}

/// Rewrites JSON text with Python's default separators a character at a time, as it comes: the
/// whitespace outside strings dropped, `,` and `:` followed by a space. Any prefix of a text is
/// rewritten to a prefix of the whole text's rewriting.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct PySeparators {
    in_string: bool,
    escaped: bool,
}

impl PySeparators {
    /// Whether the text so far ends inside a string.
    pub(crate) fn in_string(&self) -> bool {
        self.in_string
    }

    /// Rewrites the next character into `out`.
    pub(crate) fn push(&mut self, c: char, out: &mut String) {
        if self.in_string {
            out.push(c);
            match c {
                _ if self.escaped => self.escaped = false,
                '\\' => self.escaped = true,
                '"' => self.in_string = false,
                _ => {}
            }
            return;
        }
        match c {
            '"' => {
                self.in_string = true;
                out.push(c);
            }
            ',' => out.push_str(", "),
            ':' => out.push_str(": "),
            ' ' | '\t' | '\n' | '\r' => {}
            c => out.push(c),
        }
    }
}

/// A whole answer's text split into content and calls.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Extracted {
    /// The text before the first call (all of it without calls); `None` when empty.
    pub content: Option<String>,
    /// The calls, in order.
    pub calls: Vec<ToolCall>,
}

/// What a stream sends for some text: content and pieces of calls.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct StreamDelta {
    /// Text to send as content (may be empty).
    pub content: String,
    /// Calls, or their pieces, in order.
    pub calls: Vec<CallDelta>,
}

/// A streamed call, or a piece of one, with its index among the answer's calls; a client that
/// accumulates the pieces by index (appending arguments) gets the whole call.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum CallDelta {
    /// A call, whole.
    Whole(usize, ToolCall),
    /// A call's first piece: its id and name, its arguments to follow.
    Named { index: usize, name: String, id: CallId },
    /// More of a call's arguments.
    Arguments { index: usize, text: String },
}

impl CallDelta {
    /// The piece as a streamed delta's `tool_calls` entry, as vLLM writes it: a call's first
    /// piece names it (`id`, `type`, `function.name`), the later ones add to its arguments.
    pub(crate) fn to_json(&self) -> Value {
        match self {
            Self::Whole(index, call) => call.to_delta_json(*index),
            Self::Named { index, name, id } => json!({"index": index, "id": id.fresh(),
                "type": "function", "function": {"name": name}}),
            Self::Arguments { index, text } => {
                json!({"index": index, "function": {"arguments": text}})
            }
        }
    }
}

/// A streamed answer read as its parser reads a whole one.
#[derive(Debug)]
pub(crate) enum ToolStream {
    /// `hermes` calls.
    Hermes(hermes::HermesStream),
    /// `mistral` calls.
    Mistral(mistral::MistralStream),
}

impl ToolStream {
    /// Takes the next text delta.
    pub(crate) fn push(&mut self, delta: &str) -> StreamDelta {
        match self {
            Self::Hermes(s) => s.push(delta),
            Self::Mistral(s) => s.push(delta),
        }
    }

    /// Takes the last text delta, at the end of the answer: what was held back is settled.
    pub(crate) fn finish(&mut self, rest: &str) -> StreamDelta {
        match self {
            Self::Hermes(s) => s.finish(rest),
            Self::Mistral(s) => s.finish(rest),
        }
    }

    /// Calls sent so far.
    pub(crate) fn num_calls(&self) -> usize {
        match self {
            Self::Hermes(s) => s.num_calls(),
            Self::Mistral(s) => s.num_calls(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use routed_test_support::SplitMix64;

    /// A call with vLLM's ids.
    pub(super) fn call(name: &str, arguments: &str) -> ToolCall {
        ToolCall::new(name.into(), arguments.into())
    }

    /// The content and calls `parser`'s stream sends for `text` fed in pieces at `cuts`.
    pub(super) fn streamed(
        parser: ToolCallParser,
        text: &str,
        cuts: &[usize],
    ) -> (String, Vec<ToolCall>) {
        let mut stream = parser.stream();
        let (mut content, mut calls) = (String::new(), Vec::new());
        let mut from = 0;
        for &cut in cuts.iter().chain([text.len()].iter()) {
            let piece = &text[from..cut];
            let delta = if cut == text.len() { stream.finish(piece) } else { stream.push(piece) };
            content.push_str(&delta.content);
            for piece in delta.calls {
                match piece {
                    CallDelta::Whole(index, call) => {
                        assert_eq!(index, calls.len(), "indices in order");
                        calls.push(call);
                    }
                    CallDelta::Named { index, name, id } => {
                        assert_eq!(index, calls.len(), "indices in order");
                        calls.push(ToolCall { name, arguments: String::new(), id });
                    }
                    CallDelta::Arguments { index, text } => {
                        assert_eq!(index + 1, calls.len(), "arguments of the last call named");
                        calls[index].arguments.push_str(&text);
                    }
                }
            }
            from = cut;
        }
        assert_eq!(stream.num_calls(), calls.len());
        (content, calls)
    }

    /// Each of `texts`, streamed in 200 random sets of pieces, sends the content and calls
    /// `parser` reads from it whole.
    pub(super) fn assert_streams_as_whole(parser: ToolCallParser, texts: &[&str]) {
        let mut rng = SplitMix64(7);
        for text in texts {
            let whole = parser.extract(text);
            for _ in 0..200 {
                let cuts = rng.cuts(text, 6);
                let (content, calls) = streamed(parser, text, &cuts);
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
    fn arguments_keep_their_order_and_strings_with_python_separators() {
        let raw = "{ \"b\" :1,\n\"a\": {\"x y\": [true, null]}, \"c\": \"\\u00e9 ,:\"}";
        assert_eq!(
            python_separators(raw),
            r#"{"b": 1, "a": {"x y": [true, null]}, "c": "\u00e9 ,:"}"#
        );
    }

    #[test]
    fn calls_have_their_parsers_ids_and_vllms_shapes() {
        let c = call("f", "{}");
        let (one, two) = (c.to_message_json(), c.to_delta_json(3));
        let id = one["id"].as_str().unwrap();
        assert!(id.starts_with("chatcmpl-tool-") && id.len() == 14 + 32, "{id}");
        assert_ne!(one["id"], two["id"]);
        assert_eq!(one["type"], "function");
        assert_eq!(one["function"], json!({"name": "f", "arguments": "{}"}));
        assert_eq!(two["index"], 3);
        let mistral = ToolCall { id: CallId::Mistral, ..c };
        let ids: Vec<String> = (0..100).map(|_| CallId::Mistral.fresh()).collect();
        for id in &ids {
            assert!(id.len() == 9 && id.bytes().all(|b| b.is_ascii_alphanumeric()), "{id}");
        }
        assert!(ids.iter().any(|id| id.bytes().any(|b| b.is_ascii_uppercase())));
        assert_ne!(ids[0], ids[1]);
        assert_eq!(mistral.to_message_json()["id"].as_str().unwrap().len(), 9);
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
