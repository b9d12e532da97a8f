//! `response_format: {"type": "json_object"}`: the output is kept a prefix of one JSON object.
//!
//! A request's [`JsonState`] reads its output byte by byte, as a pushdown automaton over RFC 8259
//! JSON whose top-level value must be an object (strings checked as UTF-8, escapes included). After
//! each sampled token the scheduler advances the state by the token's bytes and asks
//! [`JsonMasks`] for the tokens that may come next: a walk of the vocabulary's byte trie from the
//! state, pruned at the first byte the automaton refuses, so a token is allowed exactly when all of
//! its bytes are. EOS is allowed only once the object has closed, and then nothing else is.
//! With a reasoning model's thinking tags in the request, the constraint waits for the end tag
//! (unless the prompt closed the thinking) and leaves the thinking free.
//!
//! The state is a small `Copy` value (the container stack is a bit per level), so the walk copies
//! it at each trie edge instead of undoing moves, and masks are memoised by state: the long runs
//! of identical states (every token inside one string) cost one walk. Between a string's
//! characters, where almost every token fits, the tokens that fit in any string are a mask made
//! once and only the rest of the vocabulary is walked (`docs/performance.md`, "JSON output").

use crate::json_lex::{Num, StrPos, StrStep, is_whitespace};
use routed_types::{TokenId, TokenMask};

/// Deepest nesting of objects and arrays (one bit each in [`JsonState`]'s stack).
pub const MAX_JSON_DEPTH: u8 = 127;

/// States whose masks are kept.
const MASK_CACHE_CAPACITY: usize = 256;

/// The JSON literals, in the order [`Lex::Literal`] numbers them.
const LITERALS: [&[u8]; 3] = [b"true", b"false", b"null"];

/// What the reader expects next.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Lex {
    /// Before the top-level object: whitespace or `{`.
    Start,
    /// After `{`: a key or `}`.
    ObjectOpen,
    /// After `,` in an object: a key.
    Key,
    /// After a key: `:`.
    Colon,
    /// After `:`, or `,` in an array: a value.
    Value,
    /// After `[`: a value or `]`.
    ArrayOpen,
    /// After a value in a container: `,` or the container's closer.
    AfterValue,
    /// The top-level object has closed: only EOS.
    Done,
    /// Inside a string (a key or a value).
    Str { key: bool, pos: StrPos },
    /// Inside a number.
    Number(Num),
    /// Inside `LITERALS[word]`, `at` bytes of it read.
    Literal { word: u8, at: u8 },
}

/// A JSON object's reader: how much of the output has been read and what may follow.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct JsonState {
    lex: Lex,
    /// No whitespace outside strings.
    compact: bool,
    /// Open containers.
    depth: u8,
    /// Bit `i` set: the container at depth `i` is an object (else an array).
    kinds: u128,
}

impl Default for JsonState {
    fn default() -> Self {
        Self::start()
    }
}

impl JsonState {
    /// Nothing read yet.
    pub fn start() -> Self {
        Self { lex: Lex::Start, compact: false, depth: 0, kinds: 0 }
    }

    /// Nothing read yet, and no whitespace to come outside strings.
    pub fn start_compact() -> Self {
        Self { compact: true, ..Self::start() }
    }

    /// Whether a whole object has been read (only EOS may follow).
    pub fn is_complete(&self) -> bool {
        self.lex == Lex::Done
    }

    /// Reads `bytes`; `false` (the state then unspecified) as soon as one cannot follow.
    pub fn feed_all(&mut self, bytes: &[u8]) -> bool {
        bytes.iter().all(|&b| self.feed(b))
    }

    /// Reads one byte; `false`, with the state unspecified, when it cannot follow.
    pub fn feed(&mut self, b: u8) -> bool {
        match self.lex {
            // Printable ASCII between a string's characters leaves the state as it is: the bulk
            // of a mask walk inside a string.
            Lex::Str { pos: StrPos::Chars, .. }
                if (0x20..0x80).contains(&b) && b != b'"' && b != b'\\' =>
            {
                true
            }
            Lex::Str { key, pos } => match pos.next(b) {
                Some(StrStep::In(pos)) => self.to(true, Lex::Str { key, pos }),
                Some(StrStep::Closed) => {
                    self.to(true, if key { Lex::Colon } else { Lex::AfterValue })
                }
                None => false,
            },
            Lex::Number(num) => match num.next(b) {
                Some(next) => self.to(true, Lex::Number(next)),
                // The byte after a number is read as what follows the value.
                None => {
                    num.may_end() && {
                        self.lex = Lex::AfterValue;
                        self.feed(b)
                    }
                }
            },
            Lex::Literal { word, at } => {
                let literal = LITERALS[word as usize];
                let at = at + 1;
                let next = match at as usize == literal.len() {
                    true => Lex::AfterValue,
                    false => Lex::Literal { word, at },
                };
                self.to(literal[at as usize - 1] == b, next)
            }
            // Whitespace may stand between any two tokens of JSON, not after the object.
            Lex::Done => false,
            _ if is_whitespace(b) => !self.compact,
            _ => self.structural_byte(b),
        }
    }

    /// A byte between JSON's tokens: a value's start, a key's quote, or punctuation.
    fn structural_byte(&mut self, b: u8) -> bool {
        match self.lex {
            Lex::Start => b == b'{' && self.open(true),
            Lex::ObjectOpen if b == b'}' => self.close(true),
            Lex::ObjectOpen | Lex::Key => {
                self.to(b == b'"', Lex::Str { key: true, pos: StrPos::Chars })
            }
            Lex::Colon => self.to(b == b':', Lex::Value),
            Lex::ArrayOpen if b == b']' => self.close(false),
            Lex::Value | Lex::ArrayOpen => self.begin_value(b),
            Lex::AfterValue => match b {
                b',' => {
                    self.lex = if self.in_object() { Lex::Key } else { Lex::Value };
                    true
                }
                b'}' => self.in_object() && self.close(true),
                b']' => !self.in_object() && self.close(false),
                _ => false,
            },
            _ => false,
        }
    }

    fn to(&mut self, ok: bool, lex: Lex) -> bool {
        if ok {
            self.lex = lex;
        }
        ok
    }

    fn in_object(&self) -> bool {
        self.depth > 0 && self.kinds >> (self.depth - 1) & 1 == 1
    }

    fn open(&mut self, object: bool) -> bool {
        if self.depth == MAX_JSON_DEPTH {
            return false;
        }
        self.kinds = self.kinds & !(1 << self.depth) | (u128::from(object) << self.depth);
        self.depth += 1;
        self.lex = if object { Lex::ObjectOpen } else { Lex::ArrayOpen };
        true
    }

    fn close(&mut self, object: bool) -> bool {
        debug_assert_eq!(self.in_object(), object);
        self.depth -= 1;
        self.lex = if self.depth == 0 { Lex::Done } else { Lex::AfterValue };
        true
    }

    fn begin_value(&mut self, b: u8) -> bool {
        match b {
            b'{' => self.open(true),
            b'[' => self.open(false),
            b'"' => self.to(true, Lex::Str { key: false, pos: StrPos::Chars }),
            b'-' => self.to(true, Lex::Number(Num::Minus)),
            b'0' => self.to(true, Lex::Number(Num::Zero)),
            b'1'..=b'9' => self.to(true, Lex::Number(Num::Int)),
            b't' => self.to(true, Lex::Literal { word: 0, at: 1 }),
            b'f' => self.to(true, Lex::Literal { word: 1, at: 1 }),
            b'n' => self.to(true, Lex::Literal { word: 2, at: 1 }),
            _ => false,
        }
    }
}

/// A byte trie over some of the vocabulary's tokens.
#[derive(Debug)]
struct Trie {
    /// Node `n`'s children are `edges[first_edge[n]..first_edge[n + 1]]`: `(byte, node)`.
    first_edge: Vec<u32>,
    edges: Vec<(u8, u32)>,
    /// Node `n` ends the tokens `node_tokens[first_token[n]..first_token[n + 1]]`.
    first_token: Vec<u32>,
    node_tokens: Vec<TokenId>,
}

impl Trie {
    /// Nodes, the root's included.
    fn num_nodes(&self) -> usize {
        self.first_edge.len() - 1
    }

    /// Bytes its tables hold on the heap.
    fn heap_bytes(&self) -> usize {
        self.first_edge.capacity() * size_of::<u32>()
            + self.edges.capacity() * size_of::<(u8, u32)>()
            + self.first_token.capacity() * size_of::<u32>()
            + self.node_tokens.capacity() * size_of::<TokenId>()
    }

    /// The trie of the tokens `keep` selects (with bytes), built over them in byte order so each
    /// node's children come sorted and contiguous.
    fn new(tokens: &[Option<Vec<u8>>], keep: impl Fn(TokenId) -> bool) -> Self {
        let bytes = |t: TokenId| tokens[t as usize].as_deref().unwrap_or_default();
        let mut order: Vec<TokenId> =
            (0..tokens.len() as TokenId).filter(|&t| !bytes(t).is_empty() && keep(t)).collect();
        order.sort_by(|&a, &b| bytes(a).cmp(bytes(b)).then(a.cmp(&b)));
        let mut children: Vec<Vec<(u8, u32)>> = vec![Vec::new()];
        let mut ends: Vec<Vec<TokenId>> = vec![Vec::new()];
        for &t in &order {
            let mut node = 0usize;
            for &b in bytes(t) {
                node = match children[node].last() {
                    Some(&(last, child)) if last == b => child as usize,
                    _ => {
                        let child = children.len();
                        children.push(Vec::new());
                        ends.push(Vec::new());
                        children[node].push((b, child as u32));
                        child
                    }
                };
            }
            ends[node].push(t);
        }
        let mut trie = Self {
            first_edge: vec![0],
            edges: Vec::new(),
            first_token: vec![0],
            node_tokens: Vec::new(),
        };
        for (c, e) in children.iter().zip(&ends) {
            trie.edges.extend_from_slice(c);
            trie.node_tokens.extend_from_slice(e);
            trie.first_edge.push(trie.edges.len() as u32);
            trie.first_token.push(trie.node_tokens.len() as u32);
        }
        trie
    }

    /// Allows in `mask` every token below `node` whose bytes a reader in `state` reads (`feed`
    /// moves a state by a byte, `false` when it cannot follow), pruning a subtree at the first
    /// byte refused.
    fn walk<S: Copy>(
        &self,
        node: usize,
        state: S,
        feed: &mut impl FnMut(&mut S, u8) -> bool,
        mask: &mut TokenMask,
    ) {
        let edges = &self.edges[self.first_edge[node] as usize..self.first_edge[node + 1] as usize];
        for &(b, child) in edges {
            let mut next = state;
            if feed(&mut next, b) {
                let child = child as usize;
                let ends = self.first_token[child] as usize..self.first_token[child + 1] as usize;
                self.node_tokens[ends].iter().for_each(|&t| mask.allow(t));
                self.walk(child, next, feed, mask);
            }
        }
    }
}

/// Whether a string could hold `bytes` anywhere: read from between a string's characters, they
/// end between characters again (whole UTF-8 characters and whole escapes, no closing quote, no
/// control byte). Such a token is allowed inside every string, key or value, whatever the nesting
/// around it.
fn fits_any_string(bytes: &[u8]) -> bool {
    let between = Lex::Str { key: false, pos: StrPos::Chars };
    let mut state = JsonState { lex: between, compact: false, depth: 1, kinds: 1 };
    state.feed_all(bytes) && state.lex == between
}

/// The vocabulary as bytes: each token's text (none for special tokens, which only EOS may be
/// among the allowed), and byte tries over them for the walks.
#[derive(Debug)]
pub struct JsonVocabulary {
    num_tokens: usize,
    eos: Vec<TokenId>,
    /// Token `t`'s bytes are `bytes[starts[t]..starts[t + 1]]`.
    starts: Vec<u32>,
    bytes: Vec<u8>,
    /// Every token with bytes.
    all: Trie,
    /// The tokens every string takes ([`fits_any_string`]): most of a vocabulary.
    in_any_string: TokenMask,
    /// The others, walked from a state between a string's characters, so that such a state's
    /// mask costs a walk over a small part of the vocabulary.
    not_in_any_string: Trie,
}

impl JsonVocabulary {
    /// From each token's bytes (`None` for a special token) and the EOS ids.
    pub fn new(tokens: &[Option<Vec<u8>>], eos: &[TokenId]) -> Self {
        let mut starts = Vec::with_capacity(tokens.len() + 1);
        let mut bytes = Vec::new();
        starts.push(0);
        for t in tokens {
            bytes.extend_from_slice(t.as_deref().unwrap_or_default());
            starts.push(bytes.len() as u32);
        }
        let mut in_any_string = TokenMask::none(tokens.len());
        for (t, b) in tokens.iter().enumerate() {
            if b.as_deref().is_some_and(|b| !b.is_empty() && fits_any_string(b)) {
                in_any_string.allow(t as TokenId);
            }
        }
        Self {
            num_tokens: tokens.len(),
            eos: eos.to_vec(),
            starts,
            bytes,
            all: Trie::new(tokens, |_| true),
            not_in_any_string: Trie::new(tokens, |t| !in_any_string.allows(t)),
            in_any_string,
        }
    }

    /// Tokens in the vocabulary.
    pub fn num_tokens(&self) -> usize {
        self.num_tokens
    }

    /// Tokens every string takes, so that a mask between a string's characters walks only the
    /// others.
    pub fn num_in_any_string(&self) -> usize {
        self.in_any_string.num_allowed()
    }

    /// Bytes the vocabulary holds on the heap: the tokens' bytes, both tries and the mask of the
    /// tokens every string takes (what an engine keeps for JSON output).
    pub fn heap_bytes(&self) -> usize {
        self.eos.capacity() * size_of::<TokenId>()
            + self.starts.capacity() * size_of::<u32>()
            + self.bytes.capacity()
            + self.all.heap_bytes()
            + self.not_in_any_string.heap_bytes()
            + size_of_val(self.in_any_string.words())
    }

    /// Token `t`'s bytes (empty for a special token or one outside the vocabulary).
    pub fn token_bytes(&self, t: TokenId) -> &[u8] {
        let t = t as usize;
        if t >= self.num_tokens {
            return &[];
        }
        &self.bytes[self.starts[t] as usize..self.starts[t + 1] as usize]
    }

    /// The state after `token`: `None` when the token cannot follow `state` (a mask allowed it
    /// only because nothing else could be).
    pub fn advance(&self, state: JsonState, token: TokenId) -> Option<JsonState> {
        if self.eos.contains(&token) {
            return state.is_complete().then_some(state);
        }
        let bytes = self.token_bytes(token);
        let mut next = state;
        (!bytes.is_empty() && next.feed_all(bytes)).then_some(next)
    }

    /// The state a reader reaches from `state` by `token`, read by `step` a byte at a time
    /// (`Some(byte)`; `None` for EOS, which leaves the state as it is where the output may end):
    /// `None` when the token cannot follow. Nothing follows EOS, and a special token that is not
    /// EOS never follows.
    pub(crate) fn read_token<S: Copy>(
        &self,
        state: S,
        token: TokenId,
        mut step: impl FnMut(S, Option<u8>) -> Option<S>,
    ) -> Option<S> {
        if self.eos.contains(&token) {
            return step(state, None);
        }
        let bytes = self.token_bytes(token);
        if bytes.is_empty() {
            return None;
        }
        bytes.iter().try_fold(state, |s, &b| step(s, Some(b)))
    }

    /// The tokens that may follow `state`: those whose every byte the automaton reads, or EOS
    /// once the object is complete. Never empty: with nothing allowed (a vocabulary that cannot
    /// write what the state needs) EOS is, or, without an EOS, every token.
    pub fn mask(&self, state: JsonState) -> TokenMask {
        let in_string = matches!(state.lex, Lex::Str { pos: StrPos::Chars, .. });
        self.mask_with(state, in_string, state.is_complete(), &mut JsonState::feed)
    }

    /// The tokens a reader in `state` reads whole (`feed` moves a state by a byte, `false` when
    /// it cannot follow), and EOS when `complete`. `in_string`: the reader is between a string's characters in every way it
    /// may be, so the tokens that fit any string are allowed without a walk. Never empty: with
    /// nothing allowed, EOS is, or, without an EOS, every token.
    pub(crate) fn mask_with<S: Copy>(
        &self,
        state: S,
        in_string: bool,
        complete: bool,
        feed: &mut impl FnMut(&mut S, u8) -> bool,
    ) -> TokenMask {
        let mask = match in_string {
            true => {
                let mut mask = self.in_any_string.clone();
                self.not_in_any_string.walk(0, state, feed, &mut mask);
                mask
            }
            false => {
                let mut mask = TokenMask::none(self.num_tokens);
                self.all.walk(0, state, feed, &mut mask);
                mask
            }
        };
        self.finish(mask, complete)
    }

    /// [`Self::mask_with`] outside any string, walking `classes` (this vocabulary's trie merged
    /// by the byte classes of the automaton `feed` steps) rather than the bytes. Where `classes`
    /// gives up at its node limit it is dropped, and this walk and every later one go over the
    /// bytes.
    fn mask_by_classes<S: Copy>(
        &self,
        classes: &mut Option<ClassTrie>,
        state: S,
        complete: bool,
        feed: &mut impl FnMut(&mut S, u8) -> bool,
    ) -> TokenMask {
        if let Some(merged) = classes {
            let mut mask = TokenMask::none(self.num_tokens);
            if merged.walk(&self.all, state, feed, &mut mask) {
                return self.finish(mask, complete);
            }
            *classes = None;
        }
        self.mask_with(state, false, complete, feed)
    }

    /// The most nodes a trie merged by byte classes may take: a 32nd of the byte trie's.
    fn max_class_nodes(&self) -> usize {
        self.all.num_nodes() / 32
    }

    /// `mask` with EOS when `complete`, and never empty.
    fn finish(&self, mut mask: TokenMask, complete: bool) -> TokenMask {
        if complete {
            self.eos.iter().for_each(|&t| mask.allow(t));
        }
        if mask.num_allowed() == 0 {
            self.eos.iter().for_each(|&t| mask.allow(t));
        }
        if mask.num_allowed() == 0 {
            mask = TokenMask::all(self.num_tokens);
        }
        mask
    }
}

mod class_trie;
mod constraint;

use class_trie::ClassTrie;
pub(crate) use constraint::MaskMemo;
pub use constraint::{JsonConstraint, JsonMasks};

#[cfg(test)]
pub(crate) mod tests;
