//! Each vocabulary entry as the bytes it decodes to, for constraints that read the output byte by
//! byte (`response_format: json_object`).
//!
//! Byte-level BPE vocabularies (GPT-2's scheme, which Qwen, Mixtral's and Nemotron's Hugging Face
//! tokenizers in byte-level form use) spell each byte as one printable character; the table
//! below inverts that spelling. Other vocabularies are read as SentencePiece writes them: `▁` for
//! a space and `<0xNN>` for a byte that has no piece of its own. Special tokens have no bytes:
//! they are never part of a constrained text.

use std::collections::HashMap;
use tokenizers::{DecoderWrapper, Tokenizer};

/// GPT-2's byte-to-character table inverted: the byte each spelling character stands for.
fn byte_level_table() -> HashMap<char, u8> {
    let printable = |b: u8| matches!(b, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF);
    let mut next = 256u32;
    (0..=255u8)
        .map(|b| {
            let c = if printable(b) {
                b as u32
            } else {
                next += 1;
                next - 1
            };
            (char::from_u32(c).expect("below 512"), b)
        })
        .collect()
}

/// Whether the tokenizer's decoder is byte-level (alone or within a sequence).
fn is_byte_level(decoder: Option<&DecoderWrapper>) -> bool {
    match decoder {
        Some(DecoderWrapper::ByteLevel(_)) => true,
        Some(DecoderWrapper::Sequence(seq)) => {
            seq.get_decoders().iter().any(|d| matches!(d, DecoderWrapper::ByteLevel(_)))
        }
        _ => false,
    }
}

/// `<0xNN>`'s byte.
fn byte_fallback(piece: &str) -> Option<u8> {
    let hex = piece.strip_prefix("<0x")?.strip_suffix('>')?;
    (hex.len() == 2).then(|| u8::from_str_radix(hex, 16).ok()).flatten()
}

/// Token `t`'s bytes for every `t` of the vocabulary, `None` for special tokens and for ids the
/// vocabulary leaves unused.
pub(crate) fn vocabulary_bytes(tokenizer: &Tokenizer) -> Vec<Option<Vec<u8>>> {
    let added = tokenizer.get_added_tokens_decoder();
    let byte_level = is_byte_level(tokenizer.get_decoder()).then(byte_level_table);
    (0..tokenizer.get_vocab_size(true) as u32)
        .map(|id| {
            if let Some(token) = added.get(&id) {
                // Added tokens are plain text, not spelled.
                return (!token.special).then(|| token.content.as_bytes().to_vec());
            }
            let piece = tokenizer.id_to_token(id)?;
            Some(match &byte_level {
                Some(table) => {
                    piece.chars().map(|c| table.get(&c).copied()).collect::<Option<_>>()?
                }
                None => match byte_fallback(&piece) {
                    Some(b) => vec![b],
                    None => piece.replace('\u{2581}', " ").into_bytes(),
                },
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_byte_level_table_covers_every_byte_once() {
        let table = byte_level_table();
        assert_eq!(table.len(), 256);
        assert_eq!(table[&'Ġ'], b' ');
        assert_eq!(table[&'Ċ'], b'\n');
        assert_eq!(table[&'a'], b'a');
        let mut bytes: Vec<u8> = table.values().copied().collect();
        bytes.sort_unstable();
        assert_eq!(bytes, (0..=255).collect::<Vec<u8>>());
    }

    #[test]
    fn byte_fallback_pieces_are_their_byte() {
        assert_eq!(byte_fallback("<0x0A>"), Some(b'\n'));
        assert_eq!(byte_fallback("<0xE4>"), Some(0xE4));
        assert_eq!(byte_fallback("<0x0>"), None);
        assert_eq!(byte_fallback("hello"), None);
    }

    #[test]
    fn a_texts_tokens_spell_its_bytes_and_special_tokens_have_none() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../tests/golden/tiny_hybrid_default/model");
        let tokenizer = crate::Tokenizer::from_dir(&dir).unwrap();
        let bytes = tokenizer.token_bytes();
        assert_eq!(bytes.len(), tokenizer.vocab_size());
        let text = "{\"key\": [1, 2.5e-3, \"\u{e9}t\u{e9} \u{4e2d}\u{6587} \u{1f980}\"]}\n\ttabs";
        let ids = tokenizer.encode(text).unwrap();
        let spelled: Vec<u8> =
            ids.iter().flat_map(|&id| bytes[id as usize].clone().unwrap()).collect();
        assert_eq!(spelled, text.as_bytes());
        for &eos in tokenizer.eos_token_ids() {
            assert_eq!(bytes[eos as usize], None, "EOS is special");
        }
        let num_special = bytes.iter().filter(|b| b.is_none()).count();
        assert!((1..=8).contains(&num_special), "{num_special} special tokens");
    }

    /// A SentencePiece-style vocabulary (Mixtral's and Llama's Hugging Face form: `▁` for a
    /// space, `<0xNN>` byte pieces, a decoder that replaces, falls back to bytes and strips).
    #[test]
    fn sentencepiece_pieces_spell_spaces_and_byte_fallbacks() {
        let json = r#"{
          "version": "1.0", "truncation": null, "padding": null,
          "added_tokens": [
            {"id": 0, "content": "<unk>", "single_word": false, "lstrip": false, "rstrip": false, "normalized": false, "special": true},
            {"id": 1, "content": "<s>", "single_word": false, "lstrip": false, "rstrip": false, "normalized": false, "special": true},
            {"id": 2, "content": "</s>", "single_word": false, "lstrip": false, "rstrip": false, "normalized": false, "special": true}
          ],
          "normalizer": {"type": "Sequence", "normalizers": [
            {"type": "Prepend", "prepend": "\u2581"}, {"type": "Replace", "pattern": {"String": " "}, "content": "\u2581"}]},
          "pre_tokenizer": null, "post_processor": null,
          "decoder": {"type": "Sequence", "decoders": [
            {"type": "Replace", "pattern": {"String": "\u2581"}, "content": " "},
            {"type": "ByteFallback"}, {"type": "Fuse"}, {"type": "Strip", "content": " ", "start": 1, "stop": 0}]},
          "model": {"type": "BPE", "dropout": null, "unk_token": "<unk>", "continuing_subword_prefix": null,
                    "end_of_word_suffix": null, "fuse_unk": true, "byte_fallback": true, "ignore_merges": false,
                    "vocab": {"<unk>": 0, "<s>": 1, "</s>": 2, "<0x0A>": 3, "<0xE4>": 4, "\u2581": 5, "{": 6,
                              "\u2581{": 7, "\"": 8, "a": 9, "\u2581a": 10},
                    "merges": [["\u2581", "{"], ["\u2581", "a"]]}
        }"#;
        let tokenizer = Tokenizer::from_bytes(json.as_bytes()).unwrap();
        let bytes = vocabulary_bytes(&tokenizer);
        let spelled: Vec<Option<&[u8]>> = bytes.iter().map(|b| b.as_deref()).collect();
        let expected: [Option<&[u8]>; 11] = [
            None,
            None,
            None,
            Some(b"\n"),
            Some(&[0xE4]),
            Some(b" "),
            Some(b"{"),
            Some(b" {"),
            Some(b"\""),
            Some(b"a"),
            Some(b" a"),
        ];
        assert_eq!(spelled, expected);
    }
}
