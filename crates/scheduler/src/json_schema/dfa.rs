//! The DFA over a schema's reader: sets of configurations interned as states as the output and
//! the mask walks reach them, each with a row of successors by byte and a memoised mask.

use super::{Configs, Frame, Reader};
use crate::{json_lex::StrPos, json_mode::MaskMemo};
use routed_types::{JsonSchema, TokenMask};
use std::{collections::HashMap, sync::Arc};

/// DFA states kept before the DFA starts again from nothing: a row is 1 KiB, so a DFA holds at
/// most 4 MiB of rows (a schema's values typically visit a few hundred states).
const MAX_STATES: usize = 1 << 12;

/// A transition not computed yet.
const UNKNOWN: u32 = u32::MAX;

/// A transition to no configuration: the byte cannot follow.
const DEAD: u32 = u32::MAX - 1;

/// The DFA over one schema's reader, built as it is walked, with its states' masks.
#[derive(Debug)]
pub(crate) struct SchemaDfa {
    reader: Reader,
    /// The configurations of each state.
    states: Vec<Arc<Configs>>,
    ids: HashMap<Arc<Configs>, u32>,
    /// Each state's successor per byte ([`UNKNOWN`] until computed, [`DEAD`] for none).
    next: Vec<[u32; 256]>,
    /// Whether a state has read a whole value (EOS may follow).
    complete: Vec<bool>,
    /// Whether every configuration of a state is between a string's characters.
    in_string: Vec<bool>,
    masks: MaskMemo<u32>,
    /// Bumped each time the DFA starts again: state ids of older generations mean nothing.
    generation: u64,
    /// States kept before it starts again.
    max_states: usize,
}

/// Where a reader is: its configurations, with their state in the DFA of `generation`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct SchemaPos {
    configs: Arc<Configs>,
    state: u32,
    generation: u64,
}

#[cfg(test)]
impl SchemaPos {
    /// The DFA generation its state belongs to.
    pub(super) fn generation(&self) -> u64 {
        self.generation
    }
}

impl SchemaDfa {
    /// A DFA over `schema`'s reader (`compact`: no whitespace outside strings); `generation`
    /// tells its state ids from another DFA's.
    pub(crate) fn new(schema: Arc<JsonSchema>, compact: bool, generation: u64) -> Self {
        Self {
            reader: Reader { schema, compact },
            states: Vec::new(),
            ids: HashMap::new(),
            next: Vec::new(),
            complete: Vec::new(),
            in_string: Vec::new(),
            masks: MaskMemo::new(),
            generation,
            max_states: MAX_STATES,
        }
    }

    /// A DFA that starts again after `max_states` states (to test a restart).
    #[cfg(test)]
    pub(super) fn with_max_states(mut self, max_states: usize) -> Self {
        self.max_states = max_states;
        self
    }

    /// The schema and whether it is compact.
    pub(crate) fn key(&self) -> (&Arc<JsonSchema>, bool) {
        (&self.reader.schema, self.reader.compact)
    }

    /// Nothing read yet.
    pub(crate) fn start(&mut self) -> SchemaPos {
        self.make_room();
        let state = self.intern(self.reader.start());
        self.pos(state)
    }

    /// The state of `pos` in this DFA (interned again if it was made in another generation).
    /// Call before walking: between this and the next call, the DFA does not start again.
    pub(crate) fn state(&mut self, pos: &SchemaPos) -> u32 {
        self.make_room();
        if pos.generation == self.generation {
            return pos.state;
        }
        self.intern((*pos.configs).clone())
    }

    /// The position of `state`.
    pub(crate) fn pos(&self, state: u32) -> SchemaPos {
        let configs = Arc::clone(&self.states[state as usize]);
        SchemaPos { configs, state, generation: self.generation }
    }

    /// The state after `b`, or `None` when `b` cannot follow.
    pub(crate) fn step(&mut self, state: u32, b: u8) -> Option<u32> {
        let known = self.next[state as usize][b as usize];
        let next = match known {
            UNKNOWN => {
                let configs = self.reader.step(&self.states[state as usize], b);
                let next = if configs.0.is_empty() { DEAD } else { self.intern(configs) };
                self.next[state as usize][b as usize] = next;
                next
            }
            known => known,
        };
        (next != DEAD).then_some(next)
    }

    /// Whether `state` has read a whole value.
    pub(crate) fn is_complete(&self, state: u32) -> bool {
        self.complete[state as usize]
    }

    /// Whether every configuration of `state` is between a string's characters, where every
    /// token that fits any string may come.
    pub(crate) fn is_in_string(&self, state: u32) -> bool {
        self.in_string[state as usize]
    }

    /// The memoised mask of `state`, or the one `make` builds (and that is kept).
    pub(crate) fn mask_of(
        &mut self,
        state: u32,
        make: impl FnOnce(&mut Self) -> TokenMask,
    ) -> Arc<TokenMask> {
        if let Some(mask) = self.masks.get(&state) {
            return mask;
        }
        let mask = make(self);
        self.masks.insert(state, mask)
    }

    /// States so far.
    #[cfg(test)]
    pub(super) fn num_states(&self) -> usize {
        self.states.len()
    }

    fn intern(&mut self, configs: Configs) -> u32 {
        if let Some(&id) = self.ids.get(&configs) {
            return id;
        }
        let id = self.states.len() as u32;
        let complete = configs.0.iter().any(|c| self.reader.is_complete(c));
        let in_string = configs.0.iter().all(|c| c.last() == Some(&Frame::Str(StrPos::Chars)));
        let configs = Arc::new(configs);
        self.states.push(Arc::clone(&configs));
        self.ids.insert(configs, id);
        self.next.push([UNKNOWN; 256]);
        self.complete.push(complete);
        self.in_string.push(in_string);
        id
    }

    /// Starts again from nothing once the states fill their budget (a schema whose values
    /// nest or count without bound): positions re-intern their configurations.
    fn make_room(&mut self) {
        if self.states.len() < self.max_states {
            return;
        }
        self.states.clear();
        self.ids.clear();
        self.next.clear();
        self.complete.clear();
        self.in_string.clear();
        self.masks.clear();
        self.generation += 1 << 32;
    }
}
