//! Checkpoint loading beyond the golden path: the tokenizer and chat template against what
//! transformers produced, and sharded checkpoints with mixed storage dtypes.

use routed::model::{ChatMessage, Model, ModelError, Tokenizer, Weights};
use routed_test_support::{Driver, Golden};
use safetensors::{Dtype, SafeTensors, tensor::TensorView};

#[test]
fn tokenizer_reproduces_the_reference_prompt_ids() {
    let g = Golden::open("qwen3_moe");
    let tok = Tokenizer::from_dir(&g.model_dir()).unwrap();
    for (case, meta) in g.meta["cases"].as_object().unwrap() {
        let text = meta["text"].as_str().unwrap();
        let ids = tok.encode(text).unwrap();
        assert_eq!(ids, g.prompt(case), "{case}: {text:?}");
    }
    assert_eq!(tok.eos_token_ids(), [2]);
}

#[test]
fn chat_template_renders_chatml_as_transformers_does() {
    let g = Golden::open("nemotron_h");
    let tok = Tokenizer::from_dir(&g.model_dir()).unwrap();
    let messages = [ChatMessage::new("user", "hi")];
    assert_eq!(
        tok.apply_chat_template(&messages, true).unwrap(),
        "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    );
    assert_eq!(
        tok.apply_chat_template(&messages, false).unwrap(),
        "<|im_start|>user\nhi<|im_end|>\n"
    );
    // The `long` golden prompt is a rendered user turn: the template and tokenizer reproduce it.
    let long = g.meta["cases"]["long"]["text"].as_str().unwrap();
    let content = long.trim_start_matches("<|im_start|>user\n").split("<|im_end|>").next().unwrap();
    let rendered = tok.apply_chat_template(&[ChatMessage::new("user", content)], true).unwrap();
    assert_eq!(tok.encode(&rendered).unwrap(), g.prompt("long"));
}

/// Splits the golden checkpoint into two shards with an index, the first shard re-encoded as
/// f32, and checks the logits are unchanged.
#[test]
fn sharded_checkpoint_with_f32_shard_loads_identically() {
    let g = Golden::open("mixtral");
    let src = g.model_dir();
    let dir = tempfile::tempdir().unwrap();
    for f in ["config.json", "tokenizer.json", "tokenizer_config.json", "generation_config.json"] {
        std::fs::copy(src.join(f), dir.path().join(f)).unwrap();
    }
    let bytes = std::fs::read(src.join("model.safetensors")).unwrap();
    let st = SafeTensors::deserialize(&bytes).unwrap();
    let mut names: Vec<String> = st.names().into_iter().map(str::to_owned).collect();
    names.sort();
    let (first, second) = names.split_at(names.len() / 2);
    let f32_data: Vec<(String, Vec<usize>, Vec<u8>)> = first
        .iter()
        .map(|n| {
            let t = st.tensor(n).unwrap();
            assert_eq!(t.dtype(), Dtype::BF16);
            let widened = t
                .data()
                .chunks_exact(2)
                .flat_map(|c| half::bf16::from_le_bytes([c[0], c[1]]).to_f32().to_le_bytes())
                .collect();
            (n.clone(), t.shape().to_vec(), widened)
        })
        .collect();
    let views: Vec<(String, TensorView<'_>)> = f32_data
        .iter()
        .map(|(n, s, d)| (n.clone(), TensorView::new(Dtype::F32, s.clone(), d).unwrap()))
        .collect();
    safetensors::serialize_to_file(
        views,
        None,
        &dir.path().join("model-00001-of-00002.safetensors"),
    )
    .unwrap();
    let views: Vec<(String, TensorView<'_>)> =
        second.iter().map(|n| (n.clone(), st.tensor(n).unwrap())).collect();
    safetensors::serialize_to_file(
        views,
        None,
        &dir.path().join("model-00002-of-00002.safetensors"),
    )
    .unwrap();
    let map: serde_json::Map<String, serde_json::Value> = names
        .iter()
        .enumerate()
        .map(|(i, n)| {
            (
                n.clone(),
                format!("model-0000{}-of-00002.safetensors", 1 + (i >= first.len()) as u8).into(),
            )
        })
        .collect();
    let index = serde_json::json!({"metadata": {}, "weight_map": map});
    std::fs::write(dir.path().join("model.safetensors.index.json"), index.to_string()).unwrap();

    let original = Model::load(&src, &mut |_, _| {}).unwrap();
    let sharded = Model::load(dir.path(), &mut |_, _| {}).unwrap();
    let prompt = g.prompt("main");
    let (mut a, mut b) = (Driver::new(&original, 64), Driver::new(&sharded, 64));
    let (sa, sb) = (a.seq(prompt.len()), b.seq(prompt.len()));
    assert!(a.prefill(&prompt, &sa, 24).logits == b.prefill(&prompt, &sb, 24).logits);
}

#[test]
fn load_reports_progress_up_to_every_tensor() {
    let g = Golden::open("granitemoehybrid");
    let mut last = (0, 0);
    Model::load(&g.model_dir(), &mut |done, total| last = (done, total)).unwrap();
    assert!(last.1 > 0 && last.0 == last.1, "progress ended at {last:?}");
}

#[test]
fn f16_tensors_convert_and_other_dtypes_are_named() {
    let dir = tempfile::tempdir().unwrap();
    let halfs: Vec<u8> =
        [1.5f32, -2.0].iter().flat_map(|v| half::f16::from_f32(*v).to_le_bytes()).collect();
    let ints: Vec<u8> = [7i64].iter().flat_map(|v| v.to_le_bytes()).collect();
    let views = vec![
        ("x".to_owned(), TensorView::new(Dtype::F16, vec![2], &halfs).unwrap()),
        ("n".to_owned(), TensorView::new(Dtype::I64, vec![1], &ints).unwrap()),
    ];
    safetensors::serialize_to_file(views, None, &dir.path().join("model.safetensors")).unwrap();
    let w = Weights::open(dir.path()).unwrap();
    assert_eq!(w.f32("x", &[2]).unwrap(), [1.5, -2.0]);
    let err = w.f32("n", &[1]).unwrap_err();
    assert!(matches!(err, ModelError::UnsupportedDtype { ref name, .. } if name == "n"), "{err}");
}
