//! The vocabulary's byte trie seen through a regex's or a grammar's byte classes, for their
//! readers' walks.
//!
//! Bytes of one class move every state of a regex's DFA (or a grammar's reader) alike, so
//! tokens whose bytes fall in the same classes are allowed or refused together: inside
//! `[a-z]+`, ` the` and ` cat` are one path. Merging the byte trie's nodes by class makes a trie far smaller than the vocabulary's
//! wherever a pattern reads free text, which is where a state's walk would otherwise visit most
//! of the byte trie. The merge is lazy: a node is expanded the first time a walk reaches it, so a
//! pattern whose walks prune early (a phone number) never pays for the parts it does not read.

use super::Trie;
use routed_types::{TokenId, TokenMask};
use std::ops::Range;

/// A node not yet expanded has this as its first edge.
const UNEXPANDED: u32 = u32::MAX;

/// A byte trie's nodes merged by the byte classes of one pattern, built as walks reach them.
/// Node `n` merges the byte trie nodes `sources[first_source[n]..first_source[n + 1]]`, ends
/// the tokens `tokens[first_token[n]..first_token[n + 1]]` (a node's sources and tokens are
/// pushed when it is made, so each node's are contiguous and in node order), and once expanded
/// has the children `edges[node_edges[n].0..node_edges[n].1]`.
#[derive(Debug)]
pub(super) struct ClassTrie {
    classes: [u8; 256],
    /// Past this many nodes no node is expanded: the walk gives up.
    max_nodes: usize,
    first_source: Vec<u32>,
    sources: Vec<u32>,
    first_token: Vec<u32>,
    tokens: Vec<TokenId>,
    node_edges: Vec<(u32, u32)>,
    /// `(a byte of the child's class, child)`, each node's contiguous.
    edges: Vec<(u8, u32)>,
    /// The expansion's `(class, byte, byte trie child)`, kept to reuse its allocation.
    scratch: Vec<(u8, u8, u32)>,
}

impl ClassTrie {
    /// Only the root (the byte trie's root), under `classes` (each byte's class), to grow to
    /// about `max_nodes` nodes at most.
    pub(super) fn new(classes: [u8; 256], max_nodes: usize) -> Self {
        Self {
            classes,
            max_nodes,
            first_source: vec![0, 1],
            sources: vec![0],
            first_token: vec![0, 0],
            tokens: Vec::new(),
            node_edges: vec![(UNEXPANDED, 0)],
            edges: Vec::new(),
            scratch: Vec::new(),
        }
    }

    /// Nodes made so far.
    pub(super) fn num_nodes(&self) -> usize {
        self.node_edges.len()
    }

    /// Allows in `mask` every token of `trie` whose bytes a reader in `state` reads (`feed`
    /// moves a state by a byte, `false` when it cannot follow), as [`Trie::walk`] does over the
    /// bytes themselves. `trie` must be the one every earlier walk was given. `false` when the
    /// walk gave up at the node limit, `mask` then part done.
    #[must_use]
    pub(super) fn walk<S: Copy>(
        &mut self,
        trie: &Trie,
        state: S,
        feed: &mut impl FnMut(&mut S, u8) -> bool,
        mask: &mut TokenMask,
    ) -> bool {
        self.walk_from(trie, 0, state, feed, mask)
    }

    fn walk_from<S: Copy>(
        &mut self,
        trie: &Trie,
        node: usize,
        state: S,
        feed: &mut impl FnMut(&mut S, u8) -> bool,
        mask: &mut TokenMask,
    ) -> bool {
        let edges = match self.node_edges[node] {
            (UNEXPANDED, _) if self.num_nodes() >= self.max_nodes => return false,
            (UNEXPANDED, _) => self.expand(trie, node),
            (first, end) => first..end,
        };
        for e in edges {
            let (b, child) = self.edges[e as usize];
            let mut next = state;
            if feed(&mut next, b) {
                let child = child as usize;
                let ends = self.first_token[child] as usize..self.first_token[child + 1] as usize;
                self.tokens[ends].iter().for_each(|&t| mask.allow(t));
                if !self.walk_from(trie, child, next, feed, mask) {
                    return false;
                }
            }
        }
        true
    }

    /// Makes `node`'s children, one per class among the byte edges of the byte trie nodes it
    /// merges, each merging those edges' children; returns the node's edges.
    fn expand(&mut self, trie: &Trie, node: usize) -> Range<u32> {
        self.scratch.clear();
        let sources = self.first_source[node] as usize..self.first_source[node + 1] as usize;
        for &s in &self.sources[sources] {
            let s = s as usize;
            let edges = &trie.edges[trie.first_edge[s] as usize..trie.first_edge[s + 1] as usize];
            let classes = &self.classes;
            self.scratch.extend(edges.iter().map(|&(b, child)| (classes[b as usize], b, child)));
        }
        // By class, and within one by byte trie node, so that a child's tokens come in the
        // byte trie's order (any order would allow the same tokens; this one is reproducible).
        self.scratch.sort_unstable_by_key(|&(class, _, child)| (class, child));
        let first_edge = self.edges.len() as u32;
        let mut at = 0;
        while at < self.scratch.len() {
            let (class, b, _) = self.scratch[at];
            let run = at..at + self.scratch[at..].iter().take_while(|e| e.0 == class).count();
            for &(_, _, child) in &self.scratch[run.clone()] {
                let c = child as usize;
                self.sources.push(child);
                let ends = trie.first_token[c] as usize..trie.first_token[c + 1] as usize;
                self.tokens.extend_from_slice(&trie.node_tokens[ends]);
            }
            self.edges.push((b, self.node_edges.len() as u32));
            self.node_edges.push((UNEXPANDED, 0));
            self.first_source.push(self.sources.len() as u32);
            self.first_token.push(self.tokens.len() as u32);
            at = run.end;
        }
        let end = self.edges.len() as u32;
        self.node_edges[node] = (first_edge, end);
        first_edge..end
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{grammar::grammar_dfa, json_mode::JsonVocabulary};
    use routed_types::{Grammar, Regex, RegexState};
    use std::{collections::HashSet, sync::Arc};

    /// Lower-case words with and without a leading space, numbers, punctuation and a few
    /// multi-byte characters: the shape of a real vocabulary, small.
    fn words() -> JsonVocabulary {
        let mut tokens: Vec<Option<Vec<u8>>> = Vec::new();
        let word = |i: usize| -> String {
            let letters = b"etaoinshrdlucmfw";
            (0..1 + i % 6).map(|k| letters[(i * 7 + k * 13) % letters.len()] as char).collect()
        };
        for i in 0..1500 {
            let w = word(i);
            tokens.push(Some(w.clone().into_bytes()));
            tokens.push(Some(format!(" {w}").into_bytes()));
            tokens.push(Some(format!("{}{w}.", i % 10).into_bytes()));
        }
        for t in [".", " ", "é", " día", "中文", "A", " The", "\n"] {
            tokens.push(Some(t.as_bytes().to_vec()));
        }
        tokens.push(None);
        JsonVocabulary::new(&tokens, &[tokens.len() as TokenId - 1])
    }

    #[test]
    fn walks_by_class_allow_what_walks_by_byte_do_over_far_fewer_nodes() {
        let vocab = words();
        for pattern in [r"[a-z]+( [a-z]+)*\.", r"[0-4]?[a-f ]{2,5}", r"(\w| )+", "[^.]*"] {
            let regex = Regex::new(pattern).unwrap();
            let mut classes = Some(ClassTrie::new(regex.byte_classes(), usize::MAX));
            let mut feed =
                |s: &mut RegexState, b| regex.next(*s, b).map(|next| *s = next).is_some();
            // Every state a walk from the start reaches, in the order found.
            let (mut seen, mut todo) = (HashSet::from([regex.start()]), vec![regex.start()]);
            while let Some(state) = todo.pop() {
                let by_bytes = vocab.mask_with(state, false, regex.is_match(state), &mut feed);
                let by_class =
                    vocab.mask_by_classes(&mut classes, state, regex.is_match(state), &mut feed);
                assert_eq!(by_class, by_bytes, "{pattern}");
                for b in 0..=255 {
                    if let Some(next) = regex.next(state, b)
                        && seen.insert(next)
                    {
                        todo.push(next);
                    }
                }
            }
            let merged = classes.expect("classes coarser than the bytes are kept");
            assert!(
                merged.num_nodes() * 10 < vocab.all.num_nodes(),
                "{pattern}: {} class nodes for {} byte nodes",
                merged.num_nodes(),
                vocab.all.num_nodes()
            );
        }
    }

    #[test]
    fn grammar_walks_by_class_allow_what_walks_by_byte_do() {
        let vocab = words();
        for text in [
            r#"root ::= [a-z]+ (" " [a-z]+)* "." "#,
            r#"root ::= list
list ::= "[" (item ("," " "? item)*)? "]"
item ::= [a-f]+ | list"#,
        ] {
            let grammar = Arc::new(Grammar::new(text).unwrap());
            let mut classes = Some(ClassTrie::new(grammar.byte_classes(), usize::MAX));
            let mut dfa = grammar_dfa(Arc::clone(&grammar), 0);
            let start = dfa.start();
            let start = dfa.state(&start);
            // Every state a walk from the start reaches (nesting bounded by the count).
            let (mut seen, mut todo) = (HashSet::from([start]), vec![start]);
            while let Some(state) = todo.pop().filter(|_| seen.len() < 300) {
                let complete = dfa.is_complete(state);
                let mut feed = |s: &mut u32, b| dfa.step(*s, b).map(|next| *s = next).is_some();
                let by_bytes = vocab.mask_with(state, false, complete, &mut feed);
                let by_class = vocab.mask_by_classes(&mut classes, state, complete, &mut feed);
                assert_eq!(by_class, by_bytes, "{text}");
                for b in 0..=255 {
                    if let Some(next) = dfa.step(state, b)
                        && seen.insert(next)
                    {
                        todo.push(next);
                    }
                }
            }
            let merged = classes.expect("classes coarser than the bytes are kept");
            assert!(merged.num_nodes() * 10 < vocab.all.num_nodes(), "{text}");
        }
    }

    #[test]
    fn a_walk_that_prunes_early_expands_only_what_it_reads() {
        let vocab = words();
        let regex = Regex::new(r"[0-9][a-z]+\.").unwrap();
        let mut classes = Some(ClassTrie::new(regex.byte_classes(), usize::MAX));
        let mut feed = |s: &mut RegexState, b| regex.next(*s, b).map(|next| *s = next).is_some();
        let mask = vocab.mask_by_classes(&mut classes, regex.start(), false, &mut feed);
        assert_eq!(mask.num_allowed(), 1500, "the tokens of a digit, a word and a dot");
        // The root's children and the chain of classes under the digits: nothing under a word.
        let num_nodes = classes.expect("kept").num_nodes();
        assert!(num_nodes < 20, "{num_nodes} nodes");
    }

    #[test]
    fn classes_as_fine_as_the_bytes_give_way_to_the_byte_walk() {
        let vocab = words();
        let regex = Regex::new(r"[0-9a-z .]+").unwrap();
        let mut feed = |s: &mut RegexState, b| regex.next(*s, b).map(|next| *s = next).is_some();
        let want = vocab.mask_with(regex.start(), false, false, &mut feed);
        // One class a byte: the merged trie is the byte trie.
        let mut classes =
            Some(ClassTrie::new(std::array::from_fn(|b| b as u8), vocab.all.num_nodes() / 4));
        let mask = vocab.mask_by_classes(&mut classes, regex.start(), false, &mut feed);
        assert_eq!(mask, want);
        assert!(classes.is_none(), "dropped at its node limit");
        let mask = vocab.mask_by_classes(&mut classes, regex.start(), false, &mut feed);
        assert_eq!(mask, want, "the byte walk after");
    }
}
