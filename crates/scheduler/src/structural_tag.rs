//! `structural_tag` outputs: free text in which each trigger opens a structure (its begin text,
//! one JSON value of its schema, its end text), after which the text is free again.
//!
//! The reader runs as a set of configurations, as the schema reader does, so the lazy DFA
//! interns its states and the masks walk the vocabulary from them. Free text keeps, as its
//! configuration, the bytes at its end that could still grow into a trigger or an exclude: the
//! longest such suffix, so at most the longest one's length. A trigger completed in free text
//! goes on into every structure whose begin text starts with it, an exclude completed there is a
//! dead end; the value's configurations are the schema reader's own (whitespace may come before
//! the value); a whole value may be followed by whitespace and then the end text. With
//! `at_least_one` the output starts in the structures' begin texts rather than in free text, and
//! with `stop_after_first` a structure's end text ends it.

use std::sync::Arc;

use routed_types::StructuralTag;

use crate::{
    json_lex::is_whitespace,
    json_schema::{Configs as ValueConfigs, SchemaReader},
    lazy_dfa::{DfaPos, LazyDfa, Nfa},
};

/// Where one way of reading the output is.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
enum Config {
    /// Free text whose last bytes, `held`, begin a trigger.
    Text { held: Box<[u8]> },
    /// `at` bytes into structure `index`'s begin text.
    Begin { index: u16, at: u16 },
    /// Inside structure `index`'s value.
    Value { index: u16, value: ValueConfigs },
    /// Whitespace after structure `index`'s whole value.
    After { index: u16 },
    /// `at` bytes into structure `index`'s end text.
    End { index: u16, at: u16 },
    /// After the first structure, with `stop_after_first`: nothing more.
    Done,
}

/// A set of configurations, sorted and without repeats: a DFA state.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) struct Configs(Vec<Config>);

/// The DFA over a structural tag's reader.
pub(crate) type TagDfa = LazyDfa<TagReader>;

/// Where a structural tag's reader is.
pub(crate) type TagPos = DfaPos<Configs>;

/// A DFA over `tag`'s reader; `generation` tells its state ids from another DFA's.
pub(crate) fn tag_dfa(tag: Arc<StructuralTag>, generation: u64) -> TagDfa {
    let values = tag.structures.iter().map(|s| SchemaReader::new(s.schema.clone(), false));
    let values = values.collect();
    LazyDfa::new(TagReader { tag, values }, generation)
}

/// The NFA over one structural tag.
#[derive(Debug)]
pub(crate) struct TagReader {
    tag: Arc<StructuralTag>,
    /// Each structure's value reader.
    values: Vec<SchemaReader>,
}

impl Nfa for TagReader {
    type Configs = Configs;

    fn start(&self) -> Configs {
        if !self.tag.at_least_one {
            return Configs(vec![Config::Text { held: Box::new([]) }]);
        }
        let mut out = Vec::new();
        (0..self.tag.structures.len()).for_each(|index| self.begun(index as u16, 0, &mut out));
        out.sort_unstable();
        out.dedup();
        Configs(out)
    }

    fn step(&self, from: &Configs, b: u8) -> Option<Configs> {
        let mut out = Vec::new();
        for config in &from.0 {
            self.feed(config, b, &mut out);
        }
        out.sort_unstable();
        out.dedup();
        (!out.is_empty()).then_some(Configs(out))
    }

    fn is_complete(&self, configs: &Configs) -> bool {
        configs.0.iter().any(|c| matches!(c, Config::Text { .. } | Config::Done))
    }

    fn is_in_string(&self, configs: &Configs) -> bool {
        configs.0.iter().all(|c| match c {
            Config::Value { index, value } => self.values[*index as usize].is_in_string(value),
            _ => false,
        })
    }

    fn heap_bytes(&self, configs: &Configs) -> usize {
        let inner: usize = configs
            .0
            .iter()
            .map(|c| match c {
                Config::Text { held } => held.len(),
                Config::Value { index, value } => self.values[*index as usize].heap_bytes(value),
                _ => 0,
            })
            .sum();
        inner + configs.0.capacity() * size_of::<Config>()
    }
}

impl TagReader {
    /// The tag.
    pub(crate) fn tag(&self) -> &Arc<StructuralTag> {
        &self.tag
    }

    /// Adds to `out` the configurations `config` goes to on `b`.
    fn feed(&self, config: &Config, b: u8, out: &mut Vec<Config>) {
        let structures = &self.tag.structures;
        match config {
            Config::Text { held } => self.text(held, b, out),
            Config::Begin { index, at } => {
                let begin = structures[*index as usize].begin.as_bytes();
                if begin[*at as usize] == b {
                    self.begun(*index, *at as usize + 1, out);
                }
            }
            Config::Value { index, value } => {
                let reader = &self.values[*index as usize];
                if let Some(value) = reader.step(value, b) {
                    out.push(Config::Value { index: *index, value });
                }
                if reader.is_complete(value) {
                    self.after(*index, b, out);
                }
            }
            Config::After { index } => self.after(*index, b, out),
            Config::End { index, at } => self.ending(*index, *at as usize, b, out),
            Config::Done => {}
        }
    }

    /// Free text with `held` at its end, then `b`: an exclude completed ends the way; a trigger
    /// completed opens every structure whose begin starts with it; else the text goes on,
    /// holding its new longest suffix that begins a trigger or an exclude.
    fn text(&self, held: &[u8], b: u8, out: &mut Vec<Config>) {
        let mut text = Vec::with_capacity(held.len() + 1);
        text.extend_from_slice(held);
        text.push(b);
        let (triggers, excludes) = (&self.tag.triggers, &self.tag.excludes);
        if excludes.iter().any(|e| text.ends_with(e.as_bytes())) {
            return;
        }
        let completed: Vec<&String> =
            triggers.iter().filter(|t| text.ends_with(t.as_bytes())).collect();
        if !completed.is_empty() {
            for (index, s) in self.tag.structures.iter().enumerate() {
                if let Some(t) = completed.iter().find(|t| s.begin.starts_with(t.as_str())) {
                    self.begun(index as u16, t.len(), out);
                }
            }
            return;
        }
        let begins_one = |suffix: &[u8]| {
            let begins = |t: &String| t.as_bytes().starts_with(suffix);
            triggers.iter().any(begins) || excludes.iter().any(begins)
        };
        let keep = (0..=text.len()).find(|&from| begins_one(&text[from..])).unwrap_or(text.len());
        out.push(Config::Text { held: text[keep..].into() });
    }

    /// `at` bytes into structure `index`'s begin text: the rest of it, or its value.
    fn begun(&self, index: u16, at: usize, out: &mut Vec<Config>) {
        if at < self.tag.structures[index as usize].begin.len() {
            out.push(Config::Begin { index, at: at as u16 });
        } else {
            let value = self.values[index as usize].start();
            out.push(Config::Value { index, value });
        }
    }

    /// After structure `index`'s whole value, `b`: whitespace (a model writes a call on a line
    /// of its own), or the end text's first byte.
    fn after(&self, index: u16, b: u8, out: &mut Vec<Config>) {
        if is_whitespace(b) {
            out.push(Config::After { index });
        }
        self.ending(index, 0, b, out);
    }

    /// `at` bytes into structure `index`'s end text, then `b`.
    fn ending(&self, index: u16, at: usize, b: u8, out: &mut Vec<Config>) {
        let end = self.tag.structures[index as usize].end.as_bytes();
        if end[at] != b {
            return;
        }
        match at + 1 < end.len() {
            true => out.push(Config::End { index, at: at as u16 + 1 }),
            false if self.tag.stop_after_first => out.push(Config::Done),
            false => out.push(Config::Text { held: Box::new([]) }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use routed_types::{JsonSchema, SchemaNode, TagStructure};

    /// Calls as `<f=name>` and an integer or `true`/`false` after it, closed by `</f>`.
    fn calls() -> Arc<StructuralTag> {
        let integer = JsonSchema { nodes: vec![SchemaNode::Number { integer: true }] };
        let flag = JsonSchema::of_choices(&["true".to_owned(), "false".to_owned()]);
        let structure = |begin: &str, schema: JsonSchema| TagStructure {
            begin: begin.into(),
            schema: Arc::new(schema),
            end: "</f>".into(),
        };
        Arc::new(StructuralTag::new(
            vec![structure("<f=count>", integer), structure("<f=flag>", flag)],
            vec!["<f=".into()],
        ))
    }

    /// The configurations after reading `text` from the start, if it can be read.
    fn read(reader: &TagReader, text: &str) -> Option<Configs> {
        text.bytes().try_fold(reader.start(), |c, b| reader.step(&c, b))
    }

    fn reader() -> TagReader {
        reader_of(calls())
    }

    fn reader_of(tag: Arc<StructuralTag>) -> TagReader {
        let values = tag.structures.iter().map(|s| SchemaReader::new(s.schema.clone(), false));
        TagReader { values: values.collect(), tag }
    }

    /// Whether `text` reads whole, reads as a start, or cannot be read.
    fn judge(r: &TagReader, text: &str) -> &'static str {
        match read(r, text) {
            Some(c) if r.is_complete(&c) => "whole",
            Some(_) => "open",
            None => "refused",
        }
    }

    #[test]
    fn at_least_one_starts_in_a_structure_and_stop_after_first_ends_after_it() {
        let with = |at_least_one, stop_after_first| {
            let tag = StructuralTag { at_least_one, stop_after_first, ..(*calls()).clone() };
            reader_of(Arc::new(tag))
        };
        let (first, only, both) = (with(true, false), with(false, true), with(true, true));
        for (r, text, want) in [
            (&first, "", "open"),
            (&first, "x <f=count>1</f>", "refused"),
            (&first, "<f=count>1</f>", "whole"),
            (&first, "<f=count>1</f> and <f=flag>true</f> more", "whole"),
            (&only, "", "whole"),
            (&only, "text", "whole"),
            (&only, "text <f=count>1</f>", "whole"),
            (&only, "text <f=count>1</f> ", "refused"),
            (&both, "<f=flag>true</f>", "whole"),
            (&both, "<f=flag>true</f>x", "refused"),
            (&both, "x", "refused"),
        ] {
            assert_eq!(judge(r, text), want, "{text:?}");
        }
    }

    #[test]
    fn free_text_never_writes_an_exclude() {
        let tag = StructuralTag { excludes: vec!["</r>".into()], ..(*calls()).clone() };
        let r = reader_of(Arc::new(tag));
        assert_eq!(judge(&r, "text </ and </r"), "whole");
        assert_eq!(judge(&r, "text </r>"), "refused");
        assert_eq!(judge(&r, "<f=count>1</f> </r> "), "refused");
        // Inside a structure the exclude is the value's business, not free text's.
        assert_eq!(judge(&r, "<f=count> 1 </f>"), "whole");
    }

    #[test]
    fn free_text_ends_anywhere_and_a_trigger_opens_a_structure() {
        let r = reader();
        for whole in [
            "",
            "plain text < f = not a trigger <f",
            "call <f=count>12</f> then <f=flag>true</f>.",
            "<f=flag>false</f><f=count>-3</f>",
            // Whitespace around the value, as a model writes a call on its own line.
            "<f=count>\n12\n</f> <f=flag> true </f>",
        ] {
            let c = read(&r, whole).unwrap_or_else(|| panic!("{whole:?} cannot be read"));
            assert!(r.is_complete(&c), "{whole:?} is whole");
        }
        for open in ["<f=", "<f=cou", "<f=count>12", "<f=count>12</f", "x <f=flag>tr"] {
            let c = read(&r, open).unwrap_or_else(|| panic!("{open:?} cannot be read"));
            assert!(!r.is_complete(&c), "{open:?} is not whole");
        }
        for wrong in ["<f=other>", "<f=count>x", "<f=flag>yes", "<f=count>1<<", "<f=count>1</g>"] {
            assert!(read(&r, wrong).is_none(), "{wrong:?} was read");
        }
    }

    #[test]
    fn text_holds_only_what_may_grow_into_a_trigger() {
        let r = reader();
        let held = |text: &str| match &read(&r, text).unwrap().0[..] {
            [Config::Text { held }] => String::from_utf8(held.to_vec()).unwrap(),
            other => panic!("{text:?}: {other:?}"),
        };
        assert_eq!(held("a <"), "<");
        assert_eq!(held("a <f"), "<f");
        assert_eq!(held("a <<f"), "<f");
        assert_eq!(held("a <x"), "");
        // A long free text keeps one state: the DFA does not grow with the text.
        let a = read(&r, &"some text ".repeat(200)).unwrap();
        assert_eq!(a, read(&r, "some text ").unwrap());
    }
}
