//! `response_format: {"type": "json_schema"}`: the output is kept a prefix of one JSON value of a
//! schema ([`JsonSchema`], reduced by the gateway to the shape it gives the value).
//!
//! The reader is a pushdown automaton run as a set of configurations (an NFA): a configuration
//! is a stack of [`Frame`]s, and where the schema leaves a choice open (`anyOf`, an `enum`'s
//! literals sharing a first byte, the optional properties a key may name) each alternative is a
//! configuration of its own until the bytes rule it out. Sets are interned as the states of a
//! lazily built DFA ([`LazyDfa`]): a state's successor on each byte is computed once and kept
//! in a 256-entry row, so the vocabulary walk that makes a state's mask costs one table read per
//! trie edge, and the masks themselves are memoised by state.
//!
//! Properties come in the schema's order; an optional one may be left out; keys the schema does
//! not list are not written (an object without listed properties is a map of any keys).
//! Whitespace may stand between JSON's tokens as in `json_object` (none with `compact`).

use crate::{
    json_lex::{Num, StrPos, StrStep, is_whitespace},
    lazy_dfa::{DfaPos, LazyDfa, Nfa},
};
use decimal::{Bounds, DecPos};
use range::{IntPos, Range};
use routed_types::{JsonSchema, RegexState, SchemaNode, SchemaNodeId as Node};
use std::sync::Arc;

/// Deepest nesting of a configuration's stack; deeper values are not read.
const MAX_DEPTH: usize = 64;

/// `anyOf` alternatives followed before a byte is read (a schema whose `anyOf` refers to itself
/// without reading a byte stops here).
const MAX_ALTERNATIVE_DEPTH: usize = 16;

/// The literals a value of any type may be.
const ANY_LITERALS: [&str; 3] = ["true", "false", "null"];

/// Where a container is between its tokens.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
enum Phase {
    /// After the opening bracket.
    Open,
    /// After a comma.
    Comma,
    /// After a key (of property `prop` in an object): a colon.
    Colon { prop: u16 },
    /// After a value: a comma or the closing bracket.
    After,
}

/// One level of a configuration's stack: what is being read there.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
enum Frame {
    /// A value of `node` comes next.
    Value(Node),
    /// Inside a string: a value, or a map's key (the map then waits for its colon).
    Str(StrPos),
    /// Inside a string of the bounded `node`, `len` characters read (counted up to its bound).
    BoundedStr { node: Node, pos: StrPos, len: u16 },
    /// Inside a string of the patterned `node`, its characters read up to `state` of the
    /// pattern, `len` of them (counted up to its bound); `escape`: after a backslash.
    PatternStr { node: Node, state: RegexState, escape: bool, len: u16 },
    /// Inside a number.
    Num { integer: bool, pos: Num },
    /// Inside an integer of the bounded `node`.
    BoundedInt { node: Node, pos: IntPos },
    /// Inside a number of the bounded `node`.
    BoundedNum { node: Node, pos: DecPos },
    /// `at` bytes into literal `index` of `node`.
    Lit { node: Node, index: u16, at: u16 },
    /// Inside an object of `node`; properties before `next` are behind.
    Obj { node: Node, next: u16, phase: Phase },
    /// `at` bytes into property `prop`'s key of the object of `node` (quotes included).
    Key { node: Node, prop: u16, at: u16 },
    /// Inside a map of `node`.
    Map { node: Node, phase: Phase },
    /// Inside an array of `node`, `count` items read (counted up to the node's bound).
    Arr { node: Node, count: u16, phase: Phase },
}

/// A configuration: the stack, outermost first. Empty once the whole value is read.
type Config = Vec<Frame>;

/// A set of configurations, sorted and without repeats: a DFA state.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) struct Configs(Vec<Config>);

/// The DFA over a schema's reader.
pub(crate) type SchemaDfa = LazyDfa<SchemaReader>;

/// Where a schema's reader is.
pub(crate) type SchemaPos = DfaPos<Configs>;

/// A DFA over `schema`'s reader (`compact`: no whitespace outside strings); `generation` tells
/// its state ids from another DFA's.
pub(crate) fn schema_dfa(schema: Arc<JsonSchema>, compact: bool, generation: u64) -> SchemaDfa {
    LazyDfa::new(SchemaReader::new(schema, compact), generation)
}

/// The NFA over one schema: what a byte does to a configuration.
#[derive(Debug)]
pub(crate) struct SchemaReader {
    schema: Arc<JsonSchema>,
    compact: bool,
}

impl Nfa for SchemaReader {
    type Configs = Configs;

    fn start(&self) -> Configs {
        Configs(vec![vec![Frame::Value(JsonSchema::ROOT)]])
    }

    fn step(&self, from: &Configs, b: u8) -> Option<Configs> {
        let mut out = Vec::new();
        for config in &from.0 {
            self.feed(config.clone(), b, 0, &mut out);
        }
        out.sort_unstable();
        out.dedup();
        (!out.is_empty()).then_some(Configs(out))
    }

    fn is_complete(&self, configs: &Configs) -> bool {
        configs.0.iter().any(|c| self.is_whole(c))
    }

    fn is_in_string(&self, configs: &Configs) -> bool {
        configs.0.iter().all(|c| c.last() == Some(&Frame::Str(StrPos::Chars)))
    }

    fn heap_bytes(&self, configs: &Configs) -> usize {
        let stacks = configs.0.iter().map(|c| c.capacity() * size_of::<Frame>()).sum::<usize>();
        stacks + configs.0.capacity() * size_of::<Config>()
    }
}

impl SchemaReader {
    /// The reader of `schema`'s values (`compact`: no whitespace outside strings).
    pub(crate) fn new(schema: Arc<JsonSchema>, compact: bool) -> Self {
        Self { schema, compact }
    }

    /// The schema and whether it is compact.
    pub(crate) fn key(&self) -> (&Arc<JsonSchema>, bool) {
        (&self.schema, self.compact)
    }

    /// Whether `config` has read a whole value: nothing left, or a number at the top level
    /// that may end here.
    fn is_whole(&self, config: &[Frame]) -> bool {
        match config {
            [] => true,
            [Frame::Num { pos, .. }] => pos.may_end(),
            [Frame::BoundedInt { node, pos }] => pos.may_end(self.range(*node)),
            [Frame::BoundedNum { node, pos }] => pos.may_end(self.bounds(*node)),
            _ => false,
        }
    }

    /// A bounded integer node's range.
    fn range(&self, node: Node) -> Range {
        match self.schema.node(node) {
            SchemaNode::BoundedInteger { minimum, maximum } => (*minimum, *maximum),
            _ => (None, None),
        }
    }

    /// A bounded number node's bounds.
    fn bounds(&self, node: Node) -> Bounds {
        match self.schema.node(node) {
            SchemaNode::BoundedNumber { minimum, maximum } => (*minimum, *maximum),
            _ => (None, None),
        }
    }

    /// Reads `b` in `config`, pushing the configurations it leads to onto `out`.
    fn feed(&self, mut config: Config, b: u8, depth: usize, out: &mut Vec<Config>) {
        let Some(&top) = config.last() else { return };
        let whitespace = is_whitespace(b);
        match top {
            Frame::Value(node) => {
                if whitespace {
                    return self.keep_if(!self.compact, config, out);
                }
                config.pop();
                self.begin_value(config, node, b, depth, out);
            }
            Frame::Str(pos) => match pos.next(b) {
                Some(StrStep::In(pos)) => self.replace(config, Frame::Str(pos), out),
                Some(StrStep::Closed) => self.pop(config, out),
                None => {}
            },
            Frame::BoundedStr { node, pos, len } => {
                self.bounded_string_byte(config, node, pos, len, b, out)
            }
            Frame::PatternStr { node, state, escape, len } => {
                self.pattern_string_byte(config, (node, state, escape, len), b, out)
            }
            Frame::Num { integer, pos } => {
                let next =
                    pos.next(b).filter(|next| !integer || matches!(next, Num::Int | Num::Zero));
                match next {
                    Some(pos) => self.replace(config, Frame::Num { integer, pos }, out),
                    None => self.end_number(config, pos.may_end(), b, depth, out),
                }
            }
            Frame::BoundedInt { node, pos } => match pos.next(b, self.range(node)) {
                Some(pos) => self.replace(config, Frame::BoundedInt { node, pos }, out),
                None => self.end_number(config, pos.may_end(self.range(node)), b, depth, out),
            },
            Frame::BoundedNum { node, pos } => match pos.next(b, self.bounds(node)) {
                Some(pos) => self.replace(config, Frame::BoundedNum { node, pos }, out),
                None => self.end_number(config, pos.may_end(self.bounds(node)), b, depth, out),
            },
            Frame::Lit { node, index, at } => {
                let text = self.literal(node, index);
                let frame = |at| Frame::Lit { node, index, at };
                self.text_byte(config, text, at, b, frame, out)
            }
            Frame::Key { node, prop, at } => {
                let key = self.properties(node)[prop as usize].key.as_bytes();
                self.text_byte(config, key, at, b, |at| Frame::Key { node, prop, at }, out)
            }
            _ if whitespace => self.keep_if(!self.compact, config, out),
            Frame::Obj { .. } => self.object_byte(config, b, out),
            Frame::Map { .. } => self.map_byte(config, b, out),
            Frame::Arr { .. } => self.array_byte(config, b, depth, out),
        }
    }

    /// The first byte of a value of `node`, read with `config` below it.
    fn begin_value(&self, config: Config, node: Node, b: u8, depth: usize, out: &mut Vec<Config>) {
        match self.schema.node(node) {
            SchemaNode::AnyOf(alternatives) => {
                if depth == MAX_ALTERNATIVE_DEPTH {
                    return;
                }
                for &alternative in alternatives {
                    self.begin_value(config.clone(), alternative, b, depth + 1, out);
                }
            }
            SchemaNode::Any => match b {
                b'{' => self.push(config, Frame::Map { node, phase: Phase::Open }, out),
                b'[' => self.push(config, Frame::Arr { node, count: 0, phase: Phase::Open }, out),
                b'"' => self.push(config, Frame::Str(StrPos::Chars), out),
                b't' | b'f' | b'n' => self.begin_literals(config, node, b, out),
                _ => self.begin_number(config, false, b, out),
            },
            SchemaNode::Literals(_) => self.begin_literals(config, node, b, out),
            SchemaNode::String if b == b'"' => self.push(config, Frame::Str(StrPos::Chars), out),
            SchemaNode::BoundedString { .. } if b == b'"' => {
                let frame = Frame::BoundedStr { node, pos: StrPos::Chars, len: 0 };
                self.push(config, frame, out)
            }
            SchemaNode::PatternString { pattern, .. } if b == b'"' => {
                let frame =
                    Frame::PatternStr { node, state: pattern.start(), escape: false, len: 0 };
                self.push(config, frame, out)
            }
            SchemaNode::Number { integer } => self.begin_number(config, *integer, b, out),
            SchemaNode::BoundedInteger { .. } => {
                if let Some(pos) = IntPos::start(b, self.range(node)) {
                    self.push(config, Frame::BoundedInt { node, pos }, out)
                }
            }
            SchemaNode::BoundedNumber { .. } => {
                if let Some(pos) = DecPos::start(b, self.bounds(node)) {
                    self.push(config, Frame::BoundedNum { node, pos }, out)
                }
            }
            SchemaNode::Array { .. } if b == b'[' => {
                self.push(config, Frame::Arr { node, count: 0, phase: Phase::Open }, out)
            }
            SchemaNode::Object { .. } if b == b'{' => {
                self.push(config, Frame::Obj { node, next: 0, phase: Phase::Open }, out)
            }
            SchemaNode::Map { .. } if b == b'{' => {
                self.push(config, Frame::Map { node, phase: Phase::Open }, out)
            }
            _ => {}
        }
    }

    /// A byte inside a bounded string: the closing quote once there are enough characters, a
    /// new character only while there are fewer than the most.
    fn bounded_string_byte(
        &self,
        config: Config,
        node: Node,
        pos: StrPos,
        len: u16,
        b: u8,
        out: &mut Vec<Config>,
    ) {
        let SchemaNode::BoundedString { min_length, max_length } = *self.schema.node(node) else {
            return;
        };
        match pos.next(b) {
            Some(StrStep::Closed) if u32::from(len) >= min_length => self.pop(config, out),
            Some(StrStep::In(_))
                if pos == StrPos::Chars && max_length.is_some_and(|max| u32::from(len) >= max) => {}
            Some(StrStep::In(next)) => {
                // A character is whole when the string is between characters again.
                let whole = next == StrPos::Chars;
                let len = if whole { count_char(len, min_length, max_length) } else { len };
                self.replace(config, Frame::BoundedStr { node, pos: next, len }, out)
            }
            _ => {}
        }
    }

    /// A byte inside a patterned string: the closing quote once the pattern matches and there
    /// are enough characters; a character (raw, or the one an escape writes) only while the
    /// pattern can go on with it and there are fewer than the most. A `\u` escape is not
    /// written (the pattern reads raw characters), nor a backslash no escape could follow.
    fn pattern_string_byte(
        &self,
        config: Config,
        (node, state, escape, len): (Node, RegexState, bool, u16),
        b: u8,
        out: &mut Vec<Config>,
    ) {
        let SchemaNode::PatternString { pattern, min_length, max_length } = self.schema.node(node)
        else {
            return;
        };
        let room = max_length.is_none_or(|max| u32::from(len) < max);
        let frame = |state, escape, len| Frame::PatternStr { node, state, escape, len };
        if escape {
            if let Some(next) = unescape(b).and_then(|c| pattern.next(state, c)) {
                let len = count_char(len, *min_length, *max_length);
                self.replace(config, frame(next, false, len), out);
            }
            return;
        }
        match b {
            b'"' if pattern.is_match(state) && u32::from(len) >= *min_length => {
                self.pop(config, out)
            }
            b'\\' if room && ESCAPED.iter().any(|&e| pattern.next(state, e).is_some()) => {
                self.replace(config, frame(state, true, len), out)
            }
            b'"' | b'\\' | 0x00..=0x1F => {}
            // A continuation byte goes on with the character its lead byte began (the pattern
            // reads UTF-8 only, so it never follows anything else).
            0x80..=0xBF => {
                if let Some(next) = pattern.next(state, b) {
                    self.replace(config, frame(next, false, len), out)
                }
            }
            _ if room => {
                if let Some(next) = pattern.next(state, b) {
                    let len = count_char(len, *min_length, *max_length);
                    self.replace(config, frame(next, false, len), out)
                }
            }
            _ => {}
        }
    }

    fn begin_number(&self, config: Config, integer: bool, b: u8, out: &mut Vec<Config>) {
        let pos = match b {
            b'-' => Num::Minus,
            b'0' => Num::Zero,
            b'1'..=b'9' => Num::Int,
            _ => return,
        };
        self.push(config, Frame::Num { integer, pos }, out);
    }

    /// Every literal of `node` that starts with `b`, one configuration each.
    fn begin_literals(&self, config: Config, node: Node, b: u8, out: &mut Vec<Config>) {
        for index in 0..self.num_literals(node) {
            let text = self.literal(node, index as u16);
            if text[0] != b {
                continue;
            }
            let mut config = config.clone();
            if text.len() > 1 {
                config.push(Frame::Lit { node, index: index as u16, at: 1 });
            }
            self.keep_if(config.len() <= MAX_DEPTH, config, out);
        }
    }

    /// A byte between an object's tokens (`config`'s top is the object).
    fn object_byte(&self, mut config: Config, b: u8, out: &mut Vec<Config>) {
        let Some(&Frame::Obj { node, next, phase }) = config.last() else { return };
        let properties = self.properties(node);
        // The properties a key may name now: each optional one up to the first required.
        let next_keys = || {
            let from = next as usize;
            let last = properties[from..].iter().position(|p| p.required).map(|i| from + i);
            from..last.map_or(properties.len(), |i| i + 1)
        };
        let may_close = || properties[next as usize..].iter().all(|p| !p.required);
        match (phase, b) {
            (Phase::Open | Phase::Comma, b'"') => {
                for prop in next_keys() {
                    let mut config = config.clone();
                    let phase = Phase::Colon { prop: prop as u16 };
                    *config.last_mut().expect("the object") = Frame::Obj { node, next, phase };
                    self.push(config, Frame::Key { node, prop: prop as u16, at: 1 }, out);
                }
            }
            (Phase::Open, b'}') | (Phase::After, b'}') if may_close() => self.pop(config, out),
            (Phase::After, b',') if !next_keys().is_empty() => {
                self.replace(config, Frame::Obj { node, next, phase: Phase::Comma }, out)
            }
            (Phase::Colon { prop }, b':') => {
                let value = properties[prop as usize].value;
                let next = prop + 1;
                *config.last_mut().expect("the object") =
                    Frame::Obj { node, next, phase: Phase::After };
                self.push(config, Frame::Value(value), out);
            }
            _ => {}
        }
    }

    /// A byte between a map's tokens (`config`'s top is the map).
    fn map_byte(&self, mut config: Config, b: u8, out: &mut Vec<Config>) {
        let Some(&Frame::Map { node, phase }) = config.last() else { return };
        let values = match self.schema.node(node) {
            SchemaNode::Map { values } => *values,
            _ => node,
        };
        let set = |config: &mut Config, phase| {
            *config.last_mut().expect("the map") = Frame::Map { node, phase };
        };
        match (phase, b) {
            (Phase::Open | Phase::Comma, b'"') => {
                set(&mut config, Phase::Colon { prop: 0 });
                self.push(config, Frame::Str(StrPos::Chars), out);
            }
            (Phase::Open | Phase::After, b'}') => self.pop(config, out),
            (Phase::After, b',') => {
                set(&mut config, Phase::Comma);
                out.push(config);
            }
            (Phase::Colon { .. }, b':') => {
                set(&mut config, Phase::After);
                self.push(config, Frame::Value(values), out);
            }
            _ => {}
        }
    }

    /// A byte between an array's tokens (`config`'s top is the array): an item's first byte
    /// too.
    fn array_byte(&self, mut config: Config, b: u8, depth: usize, out: &mut Vec<Config>) {
        let Some(&Frame::Arr { node, count, phase }) = config.last() else { return };
        let (prefix, items, min, max) = match self.schema.node(node) {
            SchemaNode::Array { prefix_items, items, min_items, max_items } => {
                (&prefix_items[..], *items, *min_items, *max_items)
            }
            _ => (&[][..], node, 0, None),
        };
        // Counted up to the larger bound and past the tuple's items: past both, more items
        // change nothing.
        let bound = max.unwrap_or(min).max(prefix.len() as u32).min(u32::from(u16::MAX)) as u16;
        match (phase, b) {
            (Phase::Open | Phase::After, b']') if u32::from(count) >= min => self.pop(config, out),
            (Phase::After, b',') if max.is_none_or(|max| u32::from(count) < max) => {
                *config.last_mut().expect("the array") =
                    Frame::Arr { node, count, phase: Phase::Comma };
                out.push(config);
            }
            (Phase::Open | Phase::Comma, _) if max.is_none_or(|max| u32::from(count) < max) => {
                let item = prefix.get(usize::from(count)).copied().unwrap_or(items);
                let count = count.saturating_add(1).min(bound.max(1));
                *config.last_mut().expect("the array") =
                    Frame::Arr { node, count, phase: Phase::After };
                if config.len() < MAX_DEPTH {
                    self.begin_value(config, item, b, depth, out);
                }
            }
            _ => {}
        }
    }

    /// A byte after a number (`config`'s top) that does not continue it: read as what follows
    /// the value, if the number may end there and is not the whole output.
    fn end_number(
        &self,
        mut config: Config,
        may_end: bool,
        b: u8,
        depth: usize,
        out: &mut Vec<Config>,
    ) {
        if may_end && config.len() > 1 {
            config.pop();
            self.feed(config, b, depth, out);
        }
    }

    /// A byte of a fixed `text` (a literal or a key) `at` bytes in: the next of its bytes, the
    /// frame moving on (`frame` makes it from the new offset), or its last, the text read.
    fn text_byte(
        &self,
        config: Config,
        text: &[u8],
        at: u16,
        b: u8,
        frame: impl FnOnce(u16) -> Frame,
        out: &mut Vec<Config>,
    ) {
        if text[at as usize] != b {
            return;
        }
        match at as usize + 1 == text.len() {
            true => self.pop(config, out),
            false => self.replace(config, frame(at + 1), out),
        }
    }

    /// `config` with `frame` on top, if the stack has room.
    fn push(&self, mut config: Config, frame: Frame, out: &mut Vec<Config>) {
        if config.len() < MAX_DEPTH {
            config.push(frame);
            out.push(config);
        }
    }

    /// `config` with its top replaced by `frame`.
    fn replace(&self, mut config: Config, frame: Frame, out: &mut Vec<Config>) {
        *config.last_mut().expect("a frame to replace") = frame;
        out.push(config);
    }

    /// `config` with its top value read: the container below is already where it goes next.
    fn pop(&self, mut config: Config, out: &mut Vec<Config>) {
        config.pop();
        out.push(config);
    }

    fn keep_if(&self, keep: bool, config: Config, out: &mut Vec<Config>) {
        if keep {
            out.push(config);
        }
    }

    fn properties(&self, node: Node) -> &[routed_types::Property] {
        match self.schema.node(node) {
            SchemaNode::Object { properties } => properties,
            _ => &[],
        }
    }

    fn num_literals(&self, node: Node) -> usize {
        match self.schema.node(node) {
            SchemaNode::Literals(texts) => texts.len(),
            _ => ANY_LITERALS.len(),
        }
    }

    fn literal(&self, node: Node, index: u16) -> &[u8] {
        match self.schema.node(node) {
            SchemaNode::Literals(texts) => texts[index as usize].as_bytes(),
            _ => ANY_LITERALS[index as usize].as_bytes(),
        }
    }
}

/// The characters JSON's one-letter escapes write (`\u` aside), as the pattern reads them.
const ESCAPED: [u8; 8] = [b'"', b'\\', b'/', 0x08, 0x0C, b'\n', b'\r', b'\t'];

/// The character a backslash and then `b` write, if they are one of JSON's one-letter escapes.
fn unescape(b: u8) -> Option<u8> {
    Some(match b {
        b'"' | b'\\' | b'/' => b,
        b'b' => 0x08,
        b'f' => 0x0C,
        b'n' => b'\n',
        b'r' => b'\r',
        b't' => b'\t',
        _ => return None,
    })
}

/// `len` characters and one more, counted up to the larger of the bounds, past which more
/// change nothing.
fn count_char(len: u16, min_length: u32, max_length: Option<u32>) -> u16 {
    let bound = max_length.unwrap_or(min_length).min(u32::from(u16::MAX)) as u16;
    len.saturating_add(1).min(bound)
}

mod decimal;
mod range;

#[cfg(test)]
mod tests;
