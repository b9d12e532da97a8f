//! A constrained sequence's reader ([`JsonConstraint`]) and the masks it takes, memoised by
//! state for the scheduler's thread ([`JsonMasks`]): a `json_object` reader's from the vocabulary
//! walk, a schema's or a grammar's reader's from its lazy DFA (a grammar's walked over the
//! vocabulary merged by its byte classes, as a regex's), a regex reader's from the regex's DFA,
//! a structural tag's from its lazy DFA.

use super::{ClassTrie, JsonState, JsonVocabulary, MASK_CACHE_CAPACITY};
use crate::{
    grammar::{GrammarPos, GrammarReader, grammar_dfa},
    json_schema::{SchemaPos, SchemaReader, schema_dfa},
    lazy_dfa::{DfaPos, LazyDfa, Nfa},
    structural_tag::{TagPos, TagReader, tag_dfa},
};
use routed_types::{
    Grammar, JsonSchema, Regex, RegexState, ResponseFormat, StructuralTag, ThinkingTags, TokenId,
    TokenMask,
};
use std::{
    collections::{HashMap, VecDeque},
    sync::Arc,
};

/// Schemas whose DFAs are kept at once, and regexes whose masks are.
const MAX_KEPT: usize = 8;

/// Up to [`MAX_KEPT`] values, least recently used first.
#[derive(Debug)]
struct Recent<T>(Vec<T>);

impl<T> Recent<T> {
    /// The kept value `kept` picks, tried first by `quick` (a pointer comparison, say), made by
    /// `make` (the least recently used dropped) if none is; now the most recently used.
    fn get_or_make(
        &mut self,
        quick: impl Fn(&T) -> bool,
        kept: impl Fn(&T) -> bool,
        make: impl FnOnce() -> T,
    ) -> &mut T {
        let found = self.0.iter().position(quick).or_else(|| self.0.iter().position(kept));
        let at = match found {
            Some(at) => at,
            None => {
                if self.0.len() == MAX_KEPT {
                    self.0.remove(0);
                }
                self.0.push(make());
                self.0.len() - 1
            }
        };
        self.0[at..].rotate_left(1);
        self.0.last_mut().expect("at least the one found")
    }
}

/// A regex kept with the masks of its states.
#[derive(Debug)]
struct RegexMasks {
    regex: Arc<Regex>,
    masks: MaskMemo<RegexState>,
    /// The vocabulary merged by the regex's byte classes, for the masks' walks (`None` once
    /// it saves too little: [`JsonVocabulary::mask_by_classes`]).
    classes: Option<ClassTrie>,
}

/// A lazy DFA kept with the vocabulary merged by its reader's byte classes, for its masks'
/// walks outside strings (`None` where the reader has no classes, or once they save too little).
#[derive(Debug)]
struct DfaMasks<N: Nfa> {
    dfa: LazyDfa<N>,
    classes: Option<ClassTrie>,
}

/// Masks memoised by state, the oldest dropped past [`MASK_CACHE_CAPACITY`].
#[derive(Debug)]
pub(crate) struct MaskMemo<K> {
    masks: HashMap<K, Arc<TokenMask>>,
    /// Oldest first, for eviction.
    order: VecDeque<K>,
}

impl<K: Copy + Eq + std::hash::Hash> MaskMemo<K> {
    /// Nothing kept.
    pub(crate) fn new() -> Self {
        Self { masks: HashMap::new(), order: VecDeque::new() }
    }

    /// The mask kept for `key`.
    pub(crate) fn get(&self, key: &K) -> Option<Arc<TokenMask>> {
        self.masks.get(key).cloned()
    }

    /// Keeps `mask` for `key`, dropping the oldest if full, and returns it shared.
    pub(crate) fn insert(&mut self, key: K, mask: TokenMask) -> Arc<TokenMask> {
        if self.order.len() == MASK_CACHE_CAPACITY
            && let Some(oldest) = self.order.pop_front()
        {
            self.masks.remove(&oldest);
        }
        let mask = Arc::new(mask);
        self.order.push_back(key);
        self.masks.insert(key, Arc::clone(&mask));
        mask
    }

    /// Drops every mask.
    pub(crate) fn clear(&mut self) {
        self.masks.clear();
        self.order.clear();
    }
}

/// [`JsonVocabulary::mask`] memoised by state, and the DFAs of the schemas in use with their own
/// memoised masks, for the scheduler's thread.
#[derive(Debug)]
pub struct JsonMasks {
    vocabulary: Arc<JsonVocabulary>,
    masks: MaskMemo<JsonState>,
    /// A reader whose DFA was dropped gets a new one.
    schemas: Recent<DfaMasks<SchemaReader>>,
    grammars: Recent<DfaMasks<GrammarReader>>,
    tags: Recent<DfaMasks<TagReader>>,
    regexes: Recent<RegexMasks>,
    /// Masks of fixed token sets, by the set.
    token_sets: Recent<(Arc<[TokenId]>, Arc<TokenMask>)>,
    /// The next new DFA's generation.
    num_dfas_made: u64,
}

impl JsonMasks {
    /// An empty cache over `vocabulary`.
    pub fn new(vocabulary: Arc<JsonVocabulary>) -> Self {
        Self {
            vocabulary,
            masks: MaskMemo::new(),
            schemas: Recent(Vec::new()),
            grammars: Recent(Vec::new()),
            tags: Recent(Vec::new()),
            regexes: Recent(Vec::new()),
            token_sets: Recent(Vec::new()),
            num_dfas_made: 0,
        }
    }

    /// The vocabulary.
    pub fn vocabulary(&self) -> &JsonVocabulary {
        &self.vocabulary
    }

    /// The tokens that may follow `state`, shared with every request in the same state.
    pub fn mask(&mut self, state: JsonState) -> Arc<TokenMask> {
        match self.masks.get(&state) {
            Some(mask) => mask,
            None => self.masks.insert(state, self.vocabulary.mask(state)),
        }
    }

    /// The vocabulary and the DFA of `schema` (compact or not), made if none is kept. A schema
    /// equal to a kept one's shares its DFA: `schema` is then pointed at the kept one's, so that
    /// every later lookup (one a token) is a pointer comparison.
    fn dfa(
        &mut self,
        schema: &mut Arc<JsonSchema>,
        compact: bool,
    ) -> (&JsonVocabulary, &mut DfaMasks<SchemaReader>) {
        type Same = fn(&Arc<JsonSchema>, &Arc<JsonSchema>) -> bool;
        let wanted: &Arc<JsonSchema> = schema;
        let kept = |same: Same| {
            move |d: &DfaMasks<SchemaReader>| {
                let (kept, kept_compact) = d.dfa.nfa().key();
                kept_compact == compact && same(kept, wanted)
            }
        };
        let (generation, mut made) = (self.num_dfas_made, false);
        let masks = self.schemas.get_or_make(kept(Arc::ptr_eq), kept(|a, b| a == b), || {
            made = true;
            DfaMasks { dfa: schema_dfa(Arc::clone(wanted), compact, generation), classes: None }
        });
        self.num_dfas_made += u64::from(made);
        if !Arc::ptr_eq(masks.dfa.nfa().key().0, schema) {
            *schema = Arc::clone(masks.dfa.nfa().key().0);
        }
        (&self.vocabulary, masks)
    }

    /// The vocabulary and the DFA of `grammar`, made if none is kept (an equal grammar's
    /// shared, `grammar` then pointed at the kept one, as [`Self::dfa`] does).
    fn grammar(
        &mut self,
        grammar: &mut Arc<Grammar>,
    ) -> (&JsonVocabulary, &mut DfaMasks<GrammarReader>) {
        let (generation, mut made) = (self.num_dfas_made, false);
        let (vocabulary, wanted): (_, &Arc<Grammar>) = (&self.vocabulary, grammar);
        let masks = self.grammars.get_or_make(
            |d| Arc::ptr_eq(d.dfa.nfa().grammar(), wanted),
            |d| d.dfa.nfa().grammar() == wanted,
            || {
                made = true;
                let classes = ClassTrie::new(wanted.byte_classes(), vocabulary.max_class_nodes());
                DfaMasks {
                    dfa: grammar_dfa(Arc::clone(wanted), generation),
                    classes: Some(classes),
                }
            },
        );
        self.num_dfas_made += u64::from(made);
        if !Arc::ptr_eq(masks.dfa.nfa().grammar(), grammar) {
            *grammar = Arc::clone(masks.dfa.nfa().grammar());
        }
        (&self.vocabulary, masks)
    }

    /// The vocabulary and the DFA of structural tag `tag`, made if none is kept (an equal tag's
    /// shared, `tag` then pointed at the kept one, as [`Self::dfa`] does).
    fn tag(&mut self, tag: &mut Arc<StructuralTag>) -> (&JsonVocabulary, &mut DfaMasks<TagReader>) {
        let (generation, mut made) = (self.num_dfas_made, false);
        let wanted: &Arc<StructuralTag> = tag;
        let masks = self.tags.get_or_make(
            |d| Arc::ptr_eq(d.dfa.nfa().tag(), wanted),
            |d| d.dfa.nfa().tag() == wanted,
            || {
                made = true;
                DfaMasks { dfa: tag_dfa(Arc::clone(wanted), generation), classes: None }
            },
        );
        self.num_dfas_made += u64::from(made);
        if !Arc::ptr_eq(masks.dfa.nfa().tag(), tag) {
            *tag = Arc::clone(masks.dfa.nfa().tag());
        }
        (&self.vocabulary, masks)
    }

    /// The mask allowing exactly `ids` (those in the vocabulary), kept from now on: requests
    /// with equal sets share it.
    fn tokens(&mut self, ids: &Arc<[TokenId]>) -> Arc<TokenMask> {
        let num_tokens = self.vocabulary.num_tokens();
        let (_, mask) = self.token_sets.get_or_make(
            |(kept, _)| Arc::ptr_eq(kept, ids),
            |(kept, _)| kept == ids,
            || {
                let mut mask = TokenMask::none(num_tokens);
                ids.iter().filter(|&&t| (t as usize) < num_tokens).for_each(|&t| mask.allow(t));
                (Arc::clone(ids), Arc::new(mask))
            },
        );
        Arc::clone(mask)
    }

    /// The vocabulary and the masks of `regex`, kept from now on if they were not. An equal
    /// regex's are shared, `regex` then pointed at the kept one (as [`Self::dfa`] does).
    fn regex(&mut self, regex: &mut Arc<Regex>) -> (&JsonVocabulary, &mut RegexMasks) {
        let vocabulary = &self.vocabulary;
        let kept = self.regexes.get_or_make(
            |r| Arc::ptr_eq(&r.regex, regex),
            |r| r.regex == *regex,
            || RegexMasks {
                regex: Arc::clone(regex),
                masks: MaskMemo::new(),
                classes: Some(ClassTrie::new(regex.byte_classes(), vocabulary.max_class_nodes())),
            },
        );
        if !Arc::ptr_eq(&kept.regex, regex) {
            *regex = Arc::clone(&kept.regex);
        }
        (&self.vocabulary, kept)
    }

    /// The tokens that may follow `state` of `regex`: those it can go on with, EOS where the
    /// text matches.
    fn regex_mask(
        vocabulary: &JsonVocabulary,
        kept: &mut RegexMasks,
        state: RegexState,
    ) -> Arc<TokenMask> {
        if let Some(mask) = kept.masks.get(&state) {
            return mask;
        }
        let RegexMasks { regex, masks, classes } = kept;
        let mut feed = |s: &mut RegexState, b| regex.next(*s, b).map(|next| *s = next).is_some();
        let mask = vocabulary.mask_by_classes(classes, state, regex.is_match(state), &mut feed);
        masks.insert(state, mask)
    }

    /// The tokens that may follow `state` of `kept`'s DFA: between a JSON string's characters
    /// those that fit any string and the others walked, elsewhere a walk of the trie merged by
    /// class where the reader has classes.
    fn dfa_mask<N: Nfa>(
        vocabulary: &JsonVocabulary,
        kept: &mut DfaMasks<N>,
        state: u32,
    ) -> Arc<TokenMask> {
        let DfaMasks { dfa, classes } = kept;
        dfa.mask_of(state, |dfa| {
            let (in_string, complete) = (dfa.is_in_string(state), dfa.is_complete(state));
            let mut feed = |s: &mut u32, b| dfa.step(*s, b).map(|next| *s = next).is_some();
            match in_string {
                true => vocabulary.mask_with(state, true, complete, &mut feed),
                false => vocabulary.mask_by_classes(classes, state, complete, &mut feed),
            }
        })
    }
}

/// What a constrained sequence's output is read as.
#[derive(Clone, Debug)]
enum Reader {
    /// One JSON object.
    Object(JsonState),
    /// One value of `schema`.
    Schema { schema: Arc<JsonSchema>, compact: bool, pos: SchemaPos },
    /// Text `regex` matches whole.
    Regex { regex: Arc<Regex>, state: RegexState },
    /// A text of `grammar`'s root rule.
    Grammar { grammar: Arc<Grammar>, pos: GrammarPos },
    /// Tokens of a fixed set, the mask allowing them.
    Tokens(Arc<TokenMask>),
    /// Free text with `tag`'s structures.
    Tagged { tag: Arc<StructuralTag>, pos: TagPos },
}

/// A constrained sequence's reader and the tokens it allows next.
#[derive(Clone, Debug)]
pub struct JsonConstraint {
    /// The end-of-thinking token the constraint waits for while a reasoning model thinks.
    waits_for: Option<TokenId>,
    /// The output read so far; `None` once a token that could not follow was sampled (then
    /// nothing is constrained any more).
    reader: Option<Reader>,
    /// What may be sampled next; `None` while the model thinks.
    allowed: Option<Arc<TokenMask>>,
}

impl JsonConstraint {
    /// Nothing generated yet after `prompt`, for the output `format` asks for (`None` for
    /// [`ResponseFormat::Text`], which constrains nothing). With `thinking` tags the constraint
    /// waits for the end tag, unless the prompt already closed the thinking (vLLM's rule for its
    /// reasoning parsers: the last tag of the prompt decides).
    pub fn start(
        masks: &mut JsonMasks,
        format: &ResponseFormat,
        prompt: &[TokenId],
        thinking: Option<ThinkingTags>,
    ) -> Option<Self> {
        let mut reader = match format {
            ResponseFormat::Text => return None,
            ResponseFormat::JsonObject => Reader::Object(JsonState::start()),
            ResponseFormat::CompactJsonObject => Reader::Object(JsonState::start_compact()),
            ResponseFormat::JsonSchema { schema, compact } => {
                let mut schema = Arc::clone(schema);
                let pos = masks.dfa(&mut schema, *compact).1.dfa.start();
                Reader::Schema { schema, compact: *compact, pos }
            }
            // A root of literal texts, nothing before them.
            ResponseFormat::Choice(choices) => {
                let mut schema = Arc::new(JsonSchema::of_choices(choices));
                let pos = masks.dfa(&mut schema, true).1.dfa.start();
                Reader::Schema { schema, compact: true, pos }
            }
            ResponseFormat::Regex(regex) => {
                Reader::Regex { regex: Arc::clone(regex), state: regex.start() }
            }
            ResponseFormat::Grammar(grammar) => {
                let mut grammar = Arc::clone(grammar);
                let pos = masks.grammar(&mut grammar).1.dfa.start();
                Reader::Grammar { grammar, pos }
            }
            ResponseFormat::Tokens(ids) => Reader::Tokens(masks.tokens(ids)),
            ResponseFormat::StructuralTag(tag) => {
                let mut tag = Arc::clone(tag);
                let pos = masks.tag(&mut tag).1.dfa.start();
                Reader::Tagged { tag, pos }
            }
        };
        let waits_for = thinking.filter(|tags| !tags.ended_in(prompt)).map(|tags| tags.end);
        let allowed = match waits_for {
            Some(_) => None,
            None => Some(Self::mask(&mut reader, masks)),
        };
        Some(Self { waits_for, reader: Some(reader), allowed })
    }

    /// The tokens that may be sampled next, `None` while the model thinks.
    pub fn allowed(&self) -> Option<&Arc<TokenMask>> {
        self.allowed.as_ref()
    }

    /// Whether every token sampled so far was one the constraint allowed (a mask allows a token
    /// that cannot follow only when nothing else could).
    pub fn is_followed(&self) -> bool {
        self.reader.is_some()
    }

    /// After `token` was sampled.
    pub fn advance(&mut self, token: TokenId, masks: &mut JsonMasks) {
        if let Some(end) = self.waits_for {
            if token == end {
                self.waits_for = None;
                self.allowed = self.reader.as_mut().map(|reader| Self::mask(reader, masks));
            }
            return;
        }
        let Some(reader) = self.reader.take() else { return };
        let (reader, allowed) = Self::read(reader, token, masks);
        self.reader = reader;
        self.allowed = Some(allowed);
    }

    /// `reader` after `token` (`None` when the token cannot follow, and then every token may
    /// come), with what it allows next: for a schema, one DFA lookup for both.
    fn read(
        reader: Reader,
        token: TokenId,
        masks: &mut JsonMasks,
    ) -> (Option<Reader>, Arc<TokenMask>) {
        let anything = |masks: &JsonMasks| Arc::new(TokenMask::all(masks.vocabulary.num_tokens()));
        match reader {
            Reader::Object(state) => match masks.vocabulary.advance(state, token) {
                Some(next) => (Some(Reader::Object(next)), masks.mask(next)),
                None => (None, anything(masks)),
            },
            Reader::Schema { mut schema, compact, pos } => {
                let (vocabulary, dfa) = masks.dfa(&mut schema, compact);
                match Self::read_dfa(vocabulary, dfa, &pos, token) {
                    Some((pos, allowed)) => {
                        (Some(Reader::Schema { schema, compact, pos }), allowed)
                    }
                    None => (None, anything(masks)),
                }
            }
            Reader::Grammar { mut grammar, pos } => {
                let (vocabulary, dfa) = masks.grammar(&mut grammar);
                match Self::read_dfa(vocabulary, dfa, &pos, token) {
                    Some((pos, allowed)) => (Some(Reader::Grammar { grammar, pos }), allowed),
                    None => (None, anything(masks)),
                }
            }
            Reader::Tokens(mask) => match mask.allows(token) {
                true => (Some(Reader::Tokens(Arc::clone(&mask))), mask),
                false => (None, anything(masks)),
            },
            Reader::Tagged { mut tag, pos } => {
                let (vocabulary, dfa) = masks.tag(&mut tag);
                match Self::read_dfa(vocabulary, dfa, &pos, token) {
                    Some((pos, allowed)) => (Some(Reader::Tagged { tag, pos }), allowed),
                    None => (None, anything(masks)),
                }
            }
            Reader::Regex { mut regex, state } => {
                let (vocabulary, kept) = masks.regex(&mut regex);
                let pattern = &kept.regex;
                // Only a match ends.
                let next = vocabulary.read_token(state, token, |s, b| match b {
                    Some(b) => pattern.next(s, b),
                    None => pattern.is_match(s).then_some(s),
                });
                let Some(state) = next else { return (None, anything(masks)) };
                let allowed = JsonMasks::regex_mask(vocabulary, kept, state);
                (Some(Reader::Regex { regex, state }), allowed)
            }
        }
    }

    /// `pos` of `dfa` after `token`, with what it allows next (one DFA lookup for both); `None`
    /// when the token cannot follow. Only a whole text ends.
    fn read_dfa<N: Nfa>(
        vocabulary: &JsonVocabulary,
        kept: &mut DfaMasks<N>,
        pos: &DfaPos<N::Configs>,
        token: TokenId,
    ) -> Option<(DfaPos<N::Configs>, Arc<TokenMask>)> {
        let dfa = &mut kept.dfa;
        let from = dfa.state(pos);
        let state = vocabulary.read_token(from, token, |s, b| match b {
            Some(b) => dfa.step(s, b),
            None => dfa.is_complete(s).then_some(s),
        })?;
        Some((dfa.pos(state), JsonMasks::dfa_mask(vocabulary, kept, state)))
    }

    /// The tokens `kept`'s DFA allows at `pos` (renewed if the DFA started again).
    fn renewed_mask<N: Nfa>(
        vocabulary: &JsonVocabulary,
        kept: &mut DfaMasks<N>,
        pos: &mut DfaPos<N::Configs>,
    ) -> Arc<TokenMask> {
        let state = kept.dfa.state(pos);
        *pos = kept.dfa.pos(state);
        JsonMasks::dfa_mask(vocabulary, kept, state)
    }

    /// The tokens `reader` allows next (a schema's or a grammar's reader's position is renewed
    /// if its DFA started again).
    fn mask(reader: &mut Reader, masks: &mut JsonMasks) -> Arc<TokenMask> {
        match reader {
            Reader::Object(state) => masks.mask(*state),
            Reader::Schema { schema, compact, pos } => {
                let (vocabulary, dfa) = masks.dfa(schema, *compact);
                Self::renewed_mask(vocabulary, dfa, pos)
            }
            Reader::Grammar { grammar, pos } => {
                let (vocabulary, dfa) = masks.grammar(grammar);
                Self::renewed_mask(vocabulary, dfa, pos)
            }
            Reader::Regex { regex, state } => {
                let (vocabulary, kept) = masks.regex(regex);
                JsonMasks::regex_mask(vocabulary, kept, *state)
            }
            Reader::Tokens(mask) => Arc::clone(mask),
            Reader::Tagged { tag, pos } => {
                let (vocabulary, dfa) = masks.tag(tag);
                Self::renewed_mask(vocabulary, dfa, pos)
            }
        }
    }
}
