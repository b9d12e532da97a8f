//! Stop strings found from a window of the last tokens (`routed_scheduler::check_stop`) against
//! their definition, the whole output decoded and searched after every token: on random outputs
//! of a byte-level BPE tokenizer (the golden checkpoints') and of a SentencePiece-style one
//! (Metaspace, byte fallback, the leading space stripped, as Llama's and Mistral's), with special
//! tokens kept or skipped, multi-byte characters split over byte tokens, invalid bytes, and stop
//! strings taken from the text itself so that most outputs stop somewhere inside.

use routed::model::Tokenizer;
use routed_scheduler::check_stop;
use routed_test_support::{SplitMix64 as Rng, golden_root};
use routed_types::{FinishReason, SamplingParams, StopMatch, TokenId};

/// The definition: the whole output decoded after the token, the first match of any stop string.
fn definition(
    output: &[TokenId],
    params: &SamplingParams,
    text: &mut dyn FnMut(&[TokenId], bool) -> String,
) -> Option<(String, usize)> {
    if output.len() < params.min_tokens as usize {
        return None;
    }
    let decoded = text(output, params.skip_special_tokens);
    let (at, s) =
        params.stop.iter().filter_map(|s| decoded.find(s.as_str()).map(|at| (at, s))).min()?;
    Some((s.clone(), if params.include_stop_str_in_output { at + s.len() } else { at }))
}

/// Random stop strings: pieces of `text` (on character boundaries) and a few fixed ones.
fn stop_strings(rng: &mut Rng, text: &str) -> Vec<String> {
    let starts: Vec<usize> = text.char_indices().map(|(i, _)| i).collect();
    let mut stop = Vec::new();
    for _ in 0..1 + rng.below(3) {
        if starts.len() > 2 && rng.below(5) > 0 {
            let a = rng.below(starts.len() - 1);
            let b = (a + 2 + rng.below(8)).min(starts.len());
            let end = starts.get(b).copied().unwrap_or(text.len());
            stop.push(text[starts[a]..end].to_owned());
        } else {
            let fixed = [" ", "。", " the", "\u{FFFD}", "ab", "日本"];
            stop.push(fixed[rng.below(fixed.len())].to_owned());
        }
    }
    stop
}

/// Generates outputs with `token`, then, token by token, checks that the window finds what the
/// definition finds, at the same step.
fn agree(tokenizer: &Tokenizer, trials: usize, seed: u64, token: &dyn Fn(&mut Rng) -> TokenId) {
    let mut rng = Rng(seed);
    let mut text =
        |ids: &[TokenId], skip: bool| tokenizer.decode_with(ids, skip).unwrap_or_default();
    let (mut num_stopped, mut num_late) = (0, 0);
    for trial in 0..trials {
        let len = 40 + rng.below(260);
        let output: Vec<TokenId> = (0..len).map(|_| token(&mut rng)).collect();
        let skip = rng.below(2) == 0;
        // Stop strings from the text of another output of the same kind, or of this one (its
        // last part, so that the match completes late).
        let source = if rng.below(3) > 0 {
            text(&output[len * 2 / 3..], skip)
        } else {
            let other: Vec<TokenId> = (0..len).map(|_| token(&mut rng)).collect();
            text(&other, skip)
        };
        let params = SamplingParams {
            stop: stop_strings(&mut rng, &source),
            skip_special_tokens: skip,
            include_stop_str_in_output: rng.below(2) == 0,
            min_tokens: if rng.below(3) == 0 { rng.below(60) as u32 } else { 0 },
            ..SamplingParams::greedy(10_000)
        };
        for n in 1..=len {
            let out = &output[..n];
            let got = check_stop(out, &params, &[], n, 1 << 20, &mut text).map(|(reason, keep)| {
                let FinishReason::Stop { matched: Some(StopMatch::Text(s)) } = reason else {
                    panic!("trial {trial}, token {n}: {reason:?}");
                };
                (s, keep.expect("a stop string keeps a length"))
            });
            let want = definition(out, &params, &mut text);
            assert_eq!(got, want, "trial {trial}, token {n}, stop {:?}, skip {skip}", params.stop);
            if got.is_some() {
                num_stopped += 1;
                // Past the first windows: decided from a window, not the whole output.
                num_late += usize::from(n > 64);
                break;
            }
        }
    }
    // The stop strings come from the text: most outputs must have stopped somewhere, or the
    // comparison would say little.
    assert!(num_stopped * 2 > trials, "{num_stopped} of {trials} stopped");
    assert!(num_late * 4 > trials, "{num_late} of {trials} stopped after token 64");
}

#[test]
fn byte_level_bpe_finds_the_stop_strings_of_the_whole_text() {
    let tokenizer = Tokenizer::from_dir(&golden_root().join("qwen3_moe").join("model")).unwrap();
    let vocab = tokenizer.vocab_size() as TokenId;
    agree(&tokenizer, 600, 1, &|rng: &mut Rng| rng.below(vocab as usize) as TokenId);
}

/// A SentencePiece-style tokenizer: `▁` for spaces, byte tokens for what the vocabulary lacks,
/// the first leading space stripped.
fn sentencepiece_like(dir: &std::path::Path) -> Tokenizer {
    let mut vocab = serde_json::Map::new();
    let mut add = |piece: String| {
        let id = vocab.len();
        vocab.insert(piece, id.into());
    };
    for piece in ["<unk>", "<s>", "</s>"] {
        add(piece.into());
    }
    for b in 0..=255u32 {
        add(format!("<0x{b:02X}>"));
    }
    for piece in
        ["▁", "▁the", "▁a", "a", "b", "the", "▁Human", ":", "。", "日", "本", "▁stop", "\n"]
    {
        add(piece.into());
    }
    let special = |id: u32, content: &str| {
        serde_json::json!({"id": id, "content": content, "single_word": false, "lstrip": false,
            "rstrip": false, "normalized": false, "special": true})
    };
    let json = serde_json::json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": [special(0, "<unk>"), special(1, "<s>"), special(2, "</s>")],
        "normalizer": null,
        "pre_tokenizer": null,
        "post_processor": null,
        "decoder": {"type": "Sequence", "decoders": [
            {"type": "Replace", "pattern": {"String": "▁"}, "content": " "},
            {"type": "ByteFallback"},
            {"type": "Fuse"},
            {"type": "Strip", "content": " ", "start": 1, "stop": 0}
        ]},
        "model": {"type": "BPE", "dropout": null, "unk_token": "<unk>",
            "continuing_subword_prefix": null, "end_of_word_suffix": null, "fuse_unk": true,
            "byte_fallback": true, "vocab": vocab, "merges": []}
    });
    std::fs::write(dir.join("tokenizer.json"), json.to_string()).unwrap();
    Tokenizer::from_dir(dir).unwrap()
}

#[test]
fn sentencepiece_style_decoding_finds_the_stop_strings_of_the_whole_text() {
    let dir = tempfile::tempdir().unwrap();
    let tokenizer = sentencepiece_like(dir.path());
    let words = 3 + 256;
    let num_words = tokenizer.vocab_size() - words;
    // "日" as bytes, split over three byte tokens.
    let sun = [0xE6u32, 0x97, 0xA5].map(|b| 3 + b);
    agree(&tokenizer, 600, 2, &|rng: &mut Rng| match rng.below(20) {
        0 => rng.below(3) as TokenId,
        1 => 3 + rng.below(256) as TokenId,
        2..=4 => sun[rng.below(3)],
        _ => (words + rng.below(num_words)) as TokenId,
    });
}
