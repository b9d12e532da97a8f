//! A reasoning model's thinking, split off its answer as vLLM's reasoning parsers split it: the
//! text between `<think>` and `</think>` is the message's reasoning (`reasoning`, and
//! `reasoning_content` for SGLang's clients), the text after it its `content`.
//!
//! * `qwen3`: only an output with both tags has reasoning (the text before `<think>`, if any, is
//!   dropped); otherwise all of it is content. With `enable_thinking: false` Qwen3's template
//!   closes the thinking in the prompt, and the output is all content.
//! * `deepseek_r1`: the template opens the thinking in the prompt, so the output starts in it: a
//!   leading `<think>` is dropped, the text up to `</think>` is reasoning, and an output that
//!   never closes it is all reasoning.
//!
//! A whole answer is split by [`ReasoningParser::split`]; a stream by [`ReasoningStream`], which
//! sends each delta's text as reasoning or content as it goes (holding back what may be the start
//! of a tag), as vLLM's streaming parsers do: a `qwen3` stream whose `<think>` is never closed has
//! sent its text as reasoning, where the whole answer would be all content, and text before a
//! `<think>` sent in an earlier delta went out as content, where the whole answer drops it.

use std::str::FromStr;

use crate::detok::held_back;
use routed_model::Tokenizer;
use routed_types::ThinkingTags;

const THINK_START: &str = "<think>";
const THINK_END: &str = "</think>";

/// The reasoning formats `--reasoning-parser` can name.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReasoningParser {
    /// Qwen3's: reasoning only between both tags.
    Qwen3,
    /// DeepSeek-R1's: the output starts in the reasoning.
    DeepseekR1,
}

impl ReasoningParser {
    /// The name `--reasoning-parser` takes.
    pub fn name(self) -> &'static str {
        match self {
            Self::Qwen3 => "qwen3",
            Self::DeepseekR1 => "deepseek_r1",
        }
    }
}

impl ReasoningParser {
    /// The tags as single tokens of `tokenizer`, for a response format that constrains only the
    /// answer after the thinking; `None` when the vocabulary does not hold both.
    pub(crate) fn thinking_tags(self, tokenizer: &Tokenizer) -> Option<ThinkingTags> {
        // Both formats think between the same tags.
        let (start, end) = (tokenizer.token_id(THINK_START)?, tokenizer.token_id(THINK_END)?);
        Some(ThinkingTags { start, end })
    }
}

impl FromStr for ReasoningParser {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "qwen3" => Ok(Self::Qwen3),
            "deepseek_r1" => Ok(Self::DeepseekR1),
            other => {
                Err(format!("unknown reasoning parser '{other}'; supported: qwen3, deepseek_r1"))
            }
        }
    }
}

/// A whole answer split: its reasoning and its content, each `None` when absent or empty.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Split {
    /// The thinking.
    pub reasoning: Option<String>,
    /// The answer after it.
    pub content: Option<String>,
}

impl ReasoningParser {
    /// Splits a whole answer's text (the module's rules).
    pub(crate) fn split(self, text: &str) -> Split {
        let nonempty = |s: &str| (!s.is_empty()).then(|| s.to_owned());
        let after_start = match text.split_once(THINK_START) {
            Some((_, rest)) => rest,
            None => text,
        };
        match self {
            Self::Qwen3 if !(text.contains(THINK_START) && text.contains(THINK_END)) => {
                Split { reasoning: None, content: Some(text.to_owned()) }
            }
            Self::Qwen3 | Self::DeepseekR1 => match after_start.split_once(THINK_END) {
                Some((reasoning, content)) => {
                    Split { reasoning: Some(reasoning.to_owned()), content: nonempty(content) }
                }
                // Both tags, the closing one only before the opening one: what follows the
                // opening one is the content, as vLLM has it.
                None if self == Self::Qwen3 => {
                    Split { reasoning: None, content: Some(after_start.to_owned()) }
                }
                None => Split { reasoning: Some(after_start.to_owned()), content: None },
            },
        }
    }
}

/// Where a stream is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    /// Before any thinking (`qwen3`): content, unless a `<think>` begins.
    Answer,
    /// The start of a `deepseek_r1` output: a `<think>` here is dropped.
    Opening,
    /// Thinking, until `</think>`.
    Thinking,
    /// After the thinking: content.
    After,
}

/// What a stream sends for some text.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct ReasoningDelta {
    /// Text to send as reasoning.
    pub reasoning: String,
    /// Text to send as content.
    pub content: String,
}

/// Splits a streamed answer's text deltas into reasoning and content (the module's rules).
#[derive(Debug)]
pub(crate) struct ReasoningStream {
    phase: Phase,
    /// Text received and not sent yet (at most the start of a tag, between deltas).
    pending: String,
}

impl ReasoningStream {
    /// A stream read with `parser`.
    pub(crate) fn new(parser: ReasoningParser) -> Self {
        let phase = match parser {
            ReasoningParser::Qwen3 => Phase::Answer,
            ReasoningParser::DeepseekR1 => Phase::Opening,
        };
        Self { phase, pending: String::new() }
    }

    /// Takes the next text delta.
    pub(crate) fn push(&mut self, delta: &str) -> ReasoningDelta {
        self.pending.push_str(delta);
        let mut out = ReasoningDelta::default();
        loop {
            let (tag, phase_after) = match self.phase {
                Phase::Answer | Phase::Opening => (THINK_START, Phase::Thinking),
                Phase::Thinking => (THINK_END, Phase::After),
                Phase::After => {
                    out.content.push_str(&std::mem::take(&mut self.pending));
                    return out;
                }
            };
            if self.phase == Phase::Opening {
                // Only a leading `<think>` is the tag; anything else means the thinking began
                // without one.
                if self.pending.starts_with(THINK_START) {
                    self.pending.drain(..THINK_START.len());
                    self.phase = Phase::Thinking;
                } else if !THINK_START.starts_with(self.pending.as_str()) {
                    self.phase = Phase::Thinking;
                } else {
                    return out;
                }
                continue;
            }
            let sink = match self.phase {
                Phase::Answer => &mut out.content,
                _ => &mut out.reasoning,
            };
            match self.pending.find(tag) {
                Some(at) => {
                    // Text before a `qwen3` `<think>` is dropped, as the whole answer drops it.
                    if self.phase != Phase::Answer {
                        sink.push_str(&self.pending[..at]);
                    }
                    self.pending.drain(..at + tag.len());
                    self.phase = phase_after;
                }
                None => {
                    let keep = held_back(&self.pending, tag);
                    let send = self.pending.len() - keep;
                    sink.push_str(&self.pending[..send]);
                    self.pending.drain(..send);
                    return out;
                }
            }
        }
    }

    /// Takes the last text delta at the end of the answer: held-back text goes out as what it
    /// was part of.
    pub(crate) fn finish(&mut self, rest: &str) -> ReasoningDelta {
        let mut out = self.push(rest);
        let held = std::mem::take(&mut self.pending);
        match self.phase {
            Phase::Answer | Phase::After => out.content.push_str(&held),
            Phase::Opening | Phase::Thinking => out.reasoning.push_str(&held),
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use routed_test_support::SplitMix64;

    fn split(reasoning: Option<&str>, content: Option<&str>) -> Split {
        Split { reasoning: reasoning.map(str::to_owned), content: content.map(str::to_owned) }
    }

    #[test]
    fn qwen3_reads_reasoning_only_between_both_tags() {
        let p = ReasoningParser::Qwen3;
        assert_eq!(
            p.split("<think>\nhmm\n</think>\n\nYes."),
            split(Some("\nhmm\n"), Some("\n\nYes."))
        );
        assert_eq!(p.split("<think>all</think>"), split(Some("all"), None));
        assert_eq!(p.split("x<think>a</think>b"), split(Some("a"), Some("b")));
        assert_eq!(p.split("no tags"), split(None, Some("no tags")));
        assert_eq!(p.split("<think>never closed"), split(None, Some("<think>never closed")));
        assert_eq!(p.split("closed only</think> b"), split(None, Some("closed only</think> b")));
        assert_eq!(p.split("a</think>b<think>c"), split(None, Some("c")));
    }

    #[test]
    fn deepseek_r1_starts_in_the_reasoning() {
        let p = ReasoningParser::DeepseekR1;
        assert_eq!(p.split("hmm</think>Yes."), split(Some("hmm"), Some("Yes.")));
        assert_eq!(p.split("<think>hmm</think>"), split(Some("hmm"), None));
        assert_eq!(p.split("still thinking"), split(Some("still thinking"), None));
        assert_eq!(p.split(""), split(Some(""), None));
    }

    /// A stream's reasoning and content, fed `text` in pieces at `cuts`.
    fn streamed(parser: ReasoningParser, text: &str, cuts: &[usize]) -> (String, String) {
        let mut stream = ReasoningStream::new(parser);
        let (mut reasoning, mut content) = (String::new(), String::new());
        let mut from = 0;
        for &cut in cuts.iter().chain([text.len()].iter()) {
            let piece = &text[from..cut];
            let d = if cut == text.len() { stream.finish(piece) } else { stream.push(piece) };
            reasoning.push_str(&d.reasoning);
            content.push_str(&d.content);
            from = cut;
        }
        (reasoning, content)
    }

    #[test]
    fn a_stream_in_any_pieces_sends_the_whole_answers_reasoning_and_content() {
        let cases = [
            (ReasoningParser::Qwen3, "<think>\nlet me see é\n</think>\n\nYes <think> ü."),
            (ReasoningParser::Qwen3, "plain < answer <thin with no tags"),
            (ReasoningParser::DeepseekR1, "<think>hmm </thi</think>ok"),
            (ReasoningParser::DeepseekR1, "no opening tag</think>answer"),
            (ReasoningParser::DeepseekR1, "<thi never closed"),
            (ReasoningParser::DeepseekR1, "<think>"),
        ];
        let mut rng = SplitMix64(11);
        for (parser, text) in cases {
            let whole = parser.split(text);
            for _ in 0..200 {
                let cuts = rng.cuts(text, 6);
                let (reasoning, content) = streamed(parser, text, &cuts);
                assert_eq!(
                    reasoning,
                    whole.reasoning.clone().unwrap_or_default(),
                    "{text} {cuts:?}"
                );
                assert_eq!(content, whole.content.clone().unwrap_or_default(), "{text} {cuts:?}");
            }
        }
    }

    #[test]
    fn a_qwen3_stream_sends_text_as_it_comes() {
        // As vLLM's streaming parser sends it: an unclosed thinking as reasoning (the whole answer
        // is all content), text before a `<think>` that came in an earlier delta as content (the
        // whole answer drops it).
        let (reasoning, content) = streamed(ReasoningParser::Qwen3, "<think>still going", &[9]);
        assert_eq!((reasoning.as_str(), content.as_str()), ("still going", ""));
        let (reasoning, content) = streamed(ReasoningParser::Qwen3, "pre<think>a</think>b", &[3]);
        assert_eq!((reasoning.as_str(), content.as_str()), ("a", "preb"));
        let (reasoning, content) = streamed(ReasoningParser::Qwen3, "pre<think>a</think>b", &[]);
        assert_eq!((reasoning.as_str(), content.as_str()), ("a", "b"));
    }

    #[test]
    fn parsers_are_named_as_vllm_names_them() {
        for parser in [ReasoningParser::Qwen3, ReasoningParser::DeepseekR1] {
            assert_eq!(parser.name().parse(), Ok(parser));
        }
        assert!("granite".parse::<ReasoningParser>().unwrap_err().contains("supported"));
    }
}
