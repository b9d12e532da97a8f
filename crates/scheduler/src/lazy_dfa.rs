//! A DFA over a reader run as sets of configurations (a schema's or a grammar's pushdown
//! automaton), built lazily: sets are interned as states as the output and the mask walks reach
//! them, each with a row of successors by byte and a memoised mask.

use crate::json_mode::MaskMemo;
use routed_types::TokenMask;
use std::{collections::HashMap, fmt::Debug, hash::Hash, sync::Arc};

/// DFA states kept before the DFA starts again from nothing: a row is 1 KiB, so a DFA holds at
/// most 4 MiB of rows (a schema's values typically visit a few hundred states).
const MAX_STATES: usize = 1 << 12;

/// Bytes of configurations a DFA keeps before it starts again: a grammar's state may hold a
/// thousand stacks hundreds deep, and a few thousand such states would take gigabytes.
const MAX_CONFIG_BYTES: usize = 64 << 20;

/// A transition not computed yet.
const UNKNOWN: u32 = u32::MAX;

/// A transition to no configuration: the byte cannot follow.
const DEAD: u32 = u32::MAX - 1;

/// A reader run as sets of configurations: what a byte does to a set.
pub(crate) trait Nfa {
    /// A set of configurations (sorted, without repeats, so that equal sets are equal values).
    type Configs: Clone + Debug + Eq + Hash;

    /// Nothing read yet.
    fn start(&self) -> Self::Configs;

    /// The configurations after `b`; `None` when there are none (the byte cannot follow).
    fn step(&self, from: &Self::Configs, b: u8) -> Option<Self::Configs>;

    /// Whether one of `configs` has read a whole text (EOS may follow).
    fn is_complete(&self, configs: &Self::Configs) -> bool;

    /// Whether every one of `configs` is between a JSON string's characters, where every token
    /// that fits any string may come.
    fn is_in_string(&self, configs: &Self::Configs) -> bool;

    /// The heap bytes `configs` take.
    fn heap_bytes(&self, configs: &Self::Configs) -> usize;
}

/// The DFA over one reader, built as it is walked, with its states' masks.
#[derive(Debug)]
pub(crate) struct LazyDfa<N: Nfa> {
    nfa: N,
    /// The configurations of each state.
    states: Vec<Arc<N::Configs>>,
    ids: HashMap<Arc<N::Configs>, u32>,
    /// Each state's successor per byte ([`UNKNOWN`] until computed, [`DEAD`] for none).
    next: Vec<[u32; 256]>,
    /// Whether a state has read a whole text (EOS may follow).
    complete: Vec<bool>,
    /// Whether every configuration of a state is between a string's characters.
    in_string: Vec<bool>,
    masks: MaskMemo<u32>,
    /// Bumped each time the DFA starts again: state ids of older generations mean nothing.
    generation: u64,
    /// States kept before it starts again.
    max_states: usize,
    /// The heap bytes of the states' configurations.
    num_config_bytes: usize,
    /// Bytes of configurations kept before it starts again.
    max_config_bytes: usize,
}

/// Where a reader is: its configurations, with their state in the DFA of `generation`.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct DfaPos<C> {
    configs: Arc<C>,
    state: u32,
    generation: u64,
}

// By hand: a derive would ask `C: Clone`, and the configurations are shared, not copied.
impl<C> Clone for DfaPos<C> {
    fn clone(&self) -> Self {
        Self { configs: Arc::clone(&self.configs), state: self.state, generation: self.generation }
    }
}

#[cfg(test)]
impl<C> DfaPos<C> {
    /// The DFA generation its state belongs to.
    pub(crate) fn generation(&self) -> u64 {
        self.generation
    }
}

impl<N: Nfa> LazyDfa<N> {
    /// A DFA over `nfa`; `generation` tells its state ids from another DFA's.
    pub(crate) fn new(nfa: N, generation: u64) -> Self {
        Self {
            nfa,
            states: Vec::new(),
            ids: HashMap::new(),
            next: Vec::new(),
            complete: Vec::new(),
            in_string: Vec::new(),
            masks: MaskMemo::new(),
            generation,
            max_states: MAX_STATES,
            num_config_bytes: 0,
            max_config_bytes: MAX_CONFIG_BYTES,
        }
    }

    /// A DFA that starts again after `max_states` states (to test a restart).
    #[cfg(test)]
    pub(crate) fn with_max_states(mut self, max_states: usize) -> Self {
        self.max_states = max_states;
        self
    }

    /// A DFA that starts again once its configurations take `max_config_bytes` (to test a
    /// restart).
    #[cfg(test)]
    pub(crate) fn with_max_config_bytes(mut self, max_config_bytes: usize) -> Self {
        self.max_config_bytes = max_config_bytes;
        self
    }

    /// The reader.
    pub(crate) fn nfa(&self) -> &N {
        &self.nfa
    }

    /// Nothing read yet.
    pub(crate) fn start(&mut self) -> DfaPos<N::Configs> {
        self.make_room();
        let state = self.intern(self.nfa.start());
        self.pos(state)
    }

    /// The state of `pos` in this DFA (interned again if it was made in another generation).
    /// Call before walking: between this and the next call, the DFA does not start again.
    pub(crate) fn state(&mut self, pos: &DfaPos<N::Configs>) -> u32 {
        self.make_room();
        if pos.generation == self.generation {
            return pos.state;
        }
        self.intern((*pos.configs).clone())
    }

    /// The position of `state`.
    pub(crate) fn pos(&self, state: u32) -> DfaPos<N::Configs> {
        let configs = Arc::clone(&self.states[state as usize]);
        DfaPos { configs, state, generation: self.generation }
    }

    /// The state after `b`, or `None` when `b` cannot follow.
    pub(crate) fn step(&mut self, state: u32, b: u8) -> Option<u32> {
        let known = self.next[state as usize][b as usize];
        let next = match known {
            UNKNOWN => {
                let next = match self.nfa.step(&self.states[state as usize], b) {
                    Some(configs) => self.intern(configs),
                    None => DEAD,
                };
                self.next[state as usize][b as usize] = next;
                next
            }
            known => known,
        };
        (next != DEAD).then_some(next)
    }

    /// Whether `state` has read a whole text.
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
    pub(crate) fn num_states(&self) -> usize {
        self.states.len()
    }

    fn intern(&mut self, configs: N::Configs) -> u32 {
        if let Some(&id) = self.ids.get(&configs) {
            return id;
        }
        let id = self.states.len() as u32;
        self.complete.push(self.nfa.is_complete(&configs));
        self.in_string.push(self.nfa.is_in_string(&configs));
        self.num_config_bytes += self.nfa.heap_bytes(&configs);
        let configs = Arc::new(configs);
        self.states.push(Arc::clone(&configs));
        self.ids.insert(configs, id);
        self.next.push([UNKNOWN; 256]);
        id
    }

    /// Starts again from nothing once the states fill their budget, in count or in bytes (a
    /// reader whose texts nest or count without bound): positions re-intern their
    /// configurations.
    fn make_room(&mut self) {
        if self.states.len() < self.max_states && self.num_config_bytes < self.max_config_bytes {
            return;
        }
        self.num_config_bytes = 0;
        self.states.clear();
        self.ids.clear();
        self.next.clear();
        self.complete.clear();
        self.in_string.clear();
        self.masks.clear();
        self.generation += 1 << 32;
    }
}
