//! A lower bound on how many tokens a text encodes to, computed without encoding it.
//!
//! Encoding is the expensive part of taking a text prompt (seconds and gigabytes for a prompt of
//! tens of MiB), so a gateway wants to refuse a prompt that cannot fit the model's context before
//! it encodes it. The bound must never exceed the real count, or a prompt that fits would be
//! refused; it holds when every byte of the (normalised) text ends up covered by exactly one
//! token and no token covers more than `max_bytes_per_token` of them. Then
//! `tokens >= ceil(normalised_bytes / max_bytes_per_token)`.
//!
//! The direction matters: "a token is at least one byte" (true of byte-level BPE) bounds the count
//! from *above* and cannot refuse anything. What refuses is the longest stretch of text one token
//! can stand for, which is the longest vocabulary entry: for byte-level BPE each character of an
//! entry stands for one byte of text, for other BPE vocabularies an entry's UTF-8 length is at
//! least what it covers (byte-fallback entries such as `<0x41>` and subword prefixes only
//! overstate it, which keeps the bound safe). Added tokens cover their content.
//!
//! Steps that can delete text make a token cover an unbounded stretch, so the bound is only
//! offered when the pipeline is known to keep every byte: a Unicode normaliser (whose output
//! length is computed exactly, with the same normalisation tables the tokenizer uses) or none;
//! pre-tokenizers that only split or map bytes (`ByteLevel`, `Split` and `Punctuation` unless they
//! remove the delimiter, `Metaspace`, `Digits`); a BPE model that never fuses unknown characters
//! into one token; added tokens that do not swallow the whitespace beside them; no truncation.
//! Anything else (WordPiece's whole-word `[UNK]`, whitespace-removing pre-tokenizers, ...) gets no
//! bound and callers encode as before.

use serde_json::Value;
use tokenizers::{ModelWrapper, Tokenizer};
use unicode_normalization_alignments::UnicodeNormalization;

/// A Unicode normalisation the tokenizer applies before splitting.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Normalization {
    None,
    Nfc,
    Nfd,
    Nfkc,
    Nfkd,
}

impl Normalization {
    /// From the normaliser's JSON: none, one of the four forms, or a sequence of just one.
    fn of(value: &Value) -> Option<Self> {
        match value.get("type").and_then(Value::as_str) {
            None if value.is_null() => Some(Self::None),
            Some("NFC") => Some(Self::Nfc),
            Some("NFD") => Some(Self::Nfd),
            Some("NFKC") => Some(Self::Nfkc),
            Some("NFKD") => Some(Self::Nfkd),
            Some("Sequence") => match value.get("normalizers")?.as_array()?.as_slice() {
                [] => Some(Self::None),
                [one] => Self::of(one),
                _ => None,
            },
            _ => None,
        }
    }

    /// UTF-8 length of `text` normalised. ASCII is unchanged by all four forms (no ASCII
    /// character decomposes or composes), which skips the tables for most prompts.
    fn len(self, text: &str) -> usize {
        let bytes =
            |it: &mut dyn Iterator<Item = (char, isize)>| it.map(|(c, _)| c.len_utf8()).sum();
        match self {
            Self::None => text.len(),
            _ if text.is_ascii() => text.len(),
            Self::Nfc => bytes(&mut text.nfc()),
            Self::Nfd => bytes(&mut text.nfd()),
            Self::Nfkc => bytes(&mut text.nfkc()),
            Self::Nfkd => bytes(&mut text.nfkd()),
        }
    }
}

/// What a pre-tokenizer does to the text, from its JSON: `None` when it may delete text,
/// otherwise whether it maps bytes to characters one for one (`ByteLevel`).
fn pre_tokenizer(value: &Value) -> Option<bool> {
    let removes = |v: &Value| v.get("behavior").and_then(Value::as_str) == Some("Removed");
    match value.get("type").and_then(Value::as_str) {
        None if value.is_null() => Some(false),
        Some("ByteLevel") => Some(true),
        Some("Split" | "Punctuation") if !removes(value) => Some(false),
        Some("Metaspace" | "Digits") => Some(false),
        Some("Sequence") => {
            let parts = value.get("pretokenizers")?.as_array()?;
            parts.iter().map(pre_tokenizer).try_fold(false, |any, p| Some(any | p?))
        }
        _ => None,
    }
}

/// How many tokens a text encodes to, at least (see the module documentation).
#[derive(Clone, Debug)]
pub(crate) struct TokenBound {
    normalization: Normalization,
    max_bytes_per_token: usize,
}

impl TokenBound {
    /// The bound for `tokenizer`, or `None` when its pipeline may delete text.
    pub(crate) fn of(tokenizer: &Tokenizer) -> Option<Self> {
        if tokenizer.get_truncation().is_some() {
            return None;
        }
        let normalization =
            Normalization::of(&serde_json::to_value(tokenizer.get_normalizer()).ok()?)?;
        let byte_level = pre_tokenizer(&serde_json::to_value(tokenizer.get_pre_tokenizer()).ok()?)?;
        let ModelWrapper::BPE(bpe) = tokenizer.get_model() else { return None };
        if bpe.unk_token.is_some() && bpe.fuse_unk && !bpe.byte_fallback {
            return None;
        }
        let entry_len = |s: &str| if byte_level { s.chars().count() } else { s.len() };
        let mut longest = tokenizer.get_vocab(false).keys().map(|s| entry_len(s)).max()?;
        if bpe.unk_token.is_some() {
            // An unknown character becomes one token: at most one 4-byte character.
            longest = longest.max(4);
        }
        for added in tokenizer.get_added_tokens_decoder().values() {
            if added.lstrip || added.rstrip {
                return None;
            }
            let content = &added.content;
            longest = longest.max(content.len()).max(normalization.len(content));
        }
        Some(Self { normalization, max_bytes_per_token: longest.max(1) })
    }

    /// At most this many bytes of normalised text per token.
    pub(crate) fn max_bytes_per_token(&self) -> usize {
        self.max_bytes_per_token
    }

    /// Tokens `text` encodes to, at least (special tokens the post-processor adds come on top).
    ///
    /// The tokenizer normalises the pieces between added tokens one by one and this normalises
    /// the whole text; composition can only join characters, so the whole is never longer than
    /// the pieces together and the bound stays below the real count.
    pub(crate) fn min_tokens(&self, text: &str) -> usize {
        self.normalization.len(text).div_ceil(self.max_bytes_per_token)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn pipelines_that_may_delete_text_get_no_bound() {
        assert_eq!(Normalization::of(&json!({"type": "NFC"})), Some(Normalization::Nfc));
        assert_eq!(Normalization::of(&Value::Null), Some(Normalization::None));
        assert_eq!(Normalization::of(&json!({"type": "Strip"})), None);
        assert_eq!(Normalization::of(&json!({"type": "Lowercase"})), None);
        let seq = |p: Value| json!({"type": "Sequence", "pretokenizers": p});
        let split = |b: &str| json!({"type": "Split", "behavior": b});
        assert_eq!(
            pre_tokenizer(&seq(json!([split("Isolated"), {"type": "ByteLevel"}]))),
            Some(true)
        );
        assert_eq!(pre_tokenizer(&seq(json!([split("Removed")]))), None);
        assert_eq!(pre_tokenizer(&json!({"type": "Whitespace"})), None);
        assert_eq!(pre_tokenizer(&json!({"type": "Metaspace"})), Some(false));
    }

    #[test]
    fn normalised_lengths_are_exact() {
        // "e" + combining acute composes to "é" (3 bytes -> 2); Hangul jamo L V T compose to one
        // syllable (9 bytes -> 3); the ohm sign decomposes to omega (3 bytes -> 2).
        assert_eq!(Normalization::Nfc.len("e\u{301}"), 2);
        assert_eq!(Normalization::Nfc.len("\u{1100}\u{1161}\u{11A8}"), 3);
        assert_eq!(Normalization::Nfc.len("\u{2126}"), 2);
        assert_eq!(Normalization::Nfd.len("é"), 3);
        assert_eq!(Normalization::None.len("é"), 2);
    }

    /// Never above the real count, on texts built to be hard for it: long runs, whitespace,
    /// special tokens, combining marks and jamo that normalisation composes, emoji, and
    /// pseudo-random mixes of all of these.
    #[test]
    fn the_bound_never_exceeds_the_real_count_of_a_golden_tokenizer() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../tests/golden/tiny_hybrid_default/model");
        let tokenizer = crate::Tokenizer::from_dir(&dir).unwrap();
        assert_eq!(tokenizer.max_bytes_per_token(), Some(13), "longest entry: <|endoftext|>");
        let pieces = [
            "a",
            " ",
            "hello",
            " world",
            "\n",
            "\t\t",
            "<|im_start|>",
            "<|endoftext|>",
            "e\u{301}",
            "\u{1100}\u{1161}\u{11A8}",
            "\u{2126}",
            "é",
            "专家",
            "🙂",
            "0123",
            "!!",
            "\u{301}",
        ];
        let mut texts: Vec<String> = pieces.iter().map(|p| p.repeat(3000)).collect();
        let mut state = 0x2545_f491_4f6c_dd1d_u64;
        for _ in 0..200 {
            let mut text = String::new();
            for _ in 0..(state % 400) {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                text.push_str(pieces[(state % pieces.len() as u64) as usize]);
            }
            texts.push(text);
        }
        for text in &texts {
            let real = tokenizer.encode(text).unwrap().len();
            let bound = tokenizer.min_tokens(text);
            assert!(
                bound <= real,
                "bound {bound} > {real} tokens for {:?}",
                &text[..text.len().min(80)]
            );
        }
        assert!(tokenizer.min_tokens(&"a".repeat(13_000)) == 1000);
    }
}
