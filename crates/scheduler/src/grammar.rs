//! Grammar outputs (vLLM's `guided_grammar` and `structured_outputs.grammar`, SGLang's `ebnf`):
//! the output is kept a prefix of a text of the grammar's `root` rule.
//!
//! The reader is a pushdown automaton over the grammar's rules (lowered to bytes by
//! [`Grammar`]), run as a set of stacks: a stack holds, innermost last, the position each open
//! alternative reads next, and where the grammar leaves a choice open each alternative is a
//! stack of its own until the bytes rule it out. A stack is kept *settled*: its top reads a
//! byte, or it is empty and the whole text has been read. A rule named last in its
//! alternative replaces that alternative's position rather than stacking on it, so a rule that
//! repeats by recursing at its tail (as every `*` does) reads any count at a constant depth.
//! Sets are interned as the states of a lazily built DFA ([`LazyDfa`]), as a schema's are.

use crate::lazy_dfa::{DfaPos, LazyDfa, Nfa};
use routed_types::{Grammar, GrammarElement};
use std::{collections::HashSet, sync::Arc};

/// Deepest stack; ways deeper are not followed (a text nesting its rules deeper is not read).
const MAX_DEPTH: usize = 256;

/// The most stacks a state keeps (the first in order; a grammar that reads a text in more
/// ways at once is followed along those).
const MAX_STACKS: usize = 1024;

/// The DFA over a grammar's reader.
pub(crate) type GrammarDfa = LazyDfa<GrammarReader>;

/// Where a grammar's reader is.
pub(crate) type GrammarPos = DfaPos<Stacks>;

/// A DFA over `grammar`'s reader; `generation` tells its state ids from another DFA's.
pub(crate) fn grammar_dfa(grammar: Arc<Grammar>, generation: u64) -> GrammarDfa {
    LazyDfa::new(GrammarReader { grammar }, generation)
}

/// A set of settled stacks, sorted and without repeats: a DFA state.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) struct Stacks(Vec<Vec<u32>>);

/// The pushdown automaton over one grammar.
#[derive(Debug)]
pub(crate) struct GrammarReader {
    grammar: Arc<Grammar>,
}

impl GrammarReader {
    /// The grammar.
    pub(crate) fn grammar(&self) -> &Arc<Grammar> {
        &self.grammar
    }

    /// Settles `stack`, adding each way it may go on to `out`. `expanded` holds the rules
    /// already expanded in this step with what was beneath them: expanding one again would
    /// add the same stacks (it happens where a rule reaches itself at its tail through rules
    /// that read nothing, as `("a"?)*` does), so it is skipped. The ways still to settle are a
    /// list, not the call stack: a grammar may chain thousands of rules before a byte.
    fn settle(
        &self,
        stack: Vec<u32>,
        expanded: &mut HashSet<(u32, Vec<u32>)>,
        out: &mut Vec<Vec<u32>>,
    ) {
        let mut todo = vec![stack];
        while let Some(mut stack) = todo.pop() {
            // Whether `stack` settled (a byte at its top, or empty: the whole text read)
            // rather than opening a rule, whose ways go on the list.
            let settled = loop {
                let Some(&top) = stack.last() else { break true };
                match self.grammar.element(top) {
                    GrammarElement::Byte { .. } => break true,
                    GrammarElement::End => {
                        stack.pop();
                    }
                    GrammarElement::Rule(rule) => {
                        stack.pop();
                        if self.grammar.element(top + 1) != GrammarElement::End {
                            stack.push(top + 1);
                        }
                        if stack.len() < MAX_DEPTH && expanded.insert((rule, stack.clone())) {
                            for &start in self.grammar.alternatives(rule) {
                                let mut way = Vec::with_capacity(stack.len() + 1);
                                way.extend_from_slice(&stack);
                                way.push(start);
                                todo.push(way);
                            }
                        }
                        break false;
                    }
                }
            };
            if settled {
                out.push(stack);
            }
        }
    }

    /// `out` sorted, without repeats, kept to [`MAX_STACKS`]; `None` if empty.
    fn interned(mut out: Vec<Vec<u32>>) -> Option<Stacks> {
        out.sort_unstable();
        out.dedup();
        out.truncate(MAX_STACKS);
        (!out.is_empty()).then_some(Stacks(out))
    }
}

impl Nfa for GrammarReader {
    type Configs = Stacks;

    fn start(&self) -> Stacks {
        let (mut out, mut expanded) = (Vec::new(), HashSet::new());
        for &start in self.grammar.alternatives(self.grammar.root()) {
            self.settle(vec![start], &mut expanded, &mut out);
        }
        // Empty only where every way nests past `MAX_DEPTH` before its first byte: nothing is
        // read then, and the masks allow EOS alone.
        Self::interned(out).unwrap_or(Stacks(Vec::new()))
    }

    fn step(&self, from: &Stacks, b: u8) -> Option<Stacks> {
        let (mut out, mut expanded) = (Vec::new(), HashSet::new());
        for stack in &from.0 {
            let Some(&top) = stack.last() else { continue };
            let GrammarElement::Byte { lo, hi } = self.grammar.element(top) else {
                unreachable!("a settled stack reads a byte at its top")
            };
            if (lo..=hi).contains(&b) {
                let mut next = stack.clone();
                *next.last_mut().expect("not empty") = top + 1;
                self.settle(next, &mut expanded, &mut out);
            }
        }
        Self::interned(out)
    }

    fn is_complete(&self, stacks: &Stacks) -> bool {
        // Sorted: an empty stack comes first.
        stacks.0.first().is_some_and(Vec::is_empty)
    }

    fn is_in_string(&self, _: &Stacks) -> bool {
        false
    }

    fn heap_bytes(&self, stacks: &Stacks) -> usize {
        let each = stacks.0.iter().map(|s| s.capacity() * size_of::<u32>()).sum::<usize>();
        each + stacks.0.capacity() * size_of::<Vec<u32>>()
    }
}

#[cfg(test)]
mod tests;
