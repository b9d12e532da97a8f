//! Structural tags (SGLang's and vLLM's `structural_tag` output format): free text in which a
//! trigger opens a structure, a begin text, one JSON value of the structure's schema and an end
//! text, after which the text is free again. Tool calls written inside free text are the use:
//! `<function=get_weather>{"city": "Paris"}</function>` with the trigger `<function=`.

use std::sync::Arc;

use crate::JsonSchema;

/// One structure a trigger may open.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct TagStructure {
    /// Written first; starts with one of the tag's triggers.
    pub begin: String,
    /// What the value between the begin and end texts must be.
    pub schema: Arc<JsonSchema>,
    /// Written right after the value.
    pub end: String,
}

/// Free text, and a structure wherever the text writes a trigger.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct StructuralTag {
    /// The structures; the first whose begin text the output follows is the one written.
    pub structures: Vec<TagStructure>,
    /// Texts that free text never contains: each opens a structure whose begin starts with it.
    pub triggers: Vec<String>,
    /// At least one structure is written, and the output starts with one (no free text before
    /// the first).
    #[serde(default)]
    pub at_least_one: bool,
    /// The output ends right after the first structure.
    #[serde(default)]
    pub stop_after_first: bool,
    /// Texts that free text never contains and that open nothing: the output cannot write them
    /// outside a structure.
    #[serde(default)]
    pub excludes: Vec<String>,
}

impl StructuralTag {
    /// Free text with `structures` wherever it writes one of `triggers`, as often as it likes.
    pub fn new(structures: Vec<TagStructure>, triggers: Vec<String>) -> Self {
        Self {
            structures,
            triggers,
            at_least_one: false,
            stop_after_first: false,
            excludes: Vec::new(),
        }
    }

    /// Most structures, and most triggers, of one tag.
    pub const MAX_STRUCTURES: usize = 64;

    /// Longest begin, end or trigger text, in bytes.
    pub const MAX_TEXT: usize = 256;

    /// Why the tag cannot be followed, if it cannot: no structure or trigger (or too many), an
    /// empty or overlong text, a begin that no trigger starts, a schema not well formed.
    pub fn problem(&self) -> Option<String> {
        let (max, text) = (Self::MAX_STRUCTURES, Self::MAX_TEXT);
        if !(1..=max).contains(&self.structures.len()) || !(1..=max).contains(&self.triggers.len())
        {
            return Some(format!("a structural tag has 1 to {max} structures and triggers"));
        }
        let fits = |s: &str| !s.is_empty() && s.len() <= text;
        if !self.triggers.iter().all(|t| fits(t)) {
            return Some(format!("triggers must be 1 to {text} bytes long"));
        }
        if self.excludes.len() > max || !self.excludes.iter().all(|e| fits(e)) {
            return Some(format!(
                "a structural tag has at most {max} excludes of 1 to {text} bytes"
            ));
        }
        for (i, s) in self.structures.iter().enumerate() {
            if !fits(&s.begin) || !fits(&s.end) {
                return Some(format!(
                    "structure {i}: begin and end must be 1 to {text} bytes long"
                ));
            }
            if !self.triggers.iter().any(|t| s.begin.starts_with(t.as_str())) {
                return Some(format!(
                    "structure {i}: its begin {:?} starts with no trigger",
                    s.begin
                ));
            }
            if !s.schema.is_well_formed() {
                return Some(format!("structure {i}: its schema is not well formed"));
            }
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tag(begin: &str, end: &str, triggers: &[&str]) -> StructuralTag {
        let schema = Arc::new(JsonSchema::of_choices(&["1".to_owned()]));
        StructuralTag::new(
            vec![TagStructure { begin: begin.into(), schema, end: end.into() }],
            triggers.iter().map(|&t| t.to_owned()).collect(),
        )
    }

    #[test]
    fn a_begin_must_start_with_a_trigger_and_texts_must_not_be_empty() {
        assert_eq!(tag("<f=a>", "</f>", &["<f="]).problem(), None);
        assert!(tag("<g>", "</f>", &["<f="]).problem().unwrap().contains("starts with no trigger"));
        assert!(tag("<f=a>", "", &["<f="]).problem().unwrap().contains("1 to 256 bytes"));
        assert!(tag("<f=a>", "</f>", &[""]).problem().unwrap().contains("triggers"));
        assert!(tag("<f=a>", "</f>", &[]).problem().unwrap().contains("1 to 64"));
        let long = "<".repeat(300);
        assert!(tag(&long, "</f>", &["<"]).problem().is_some());
        let excluding =
            |e: &str| StructuralTag { excludes: vec![e.into()], ..tag("<f", ">", &["<"]) };
        assert_eq!(excluding("</x>").problem(), None);
        assert!(excluding("").problem().unwrap().contains("excludes"));
    }
}
