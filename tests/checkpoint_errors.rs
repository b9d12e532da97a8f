//! A broken checkpoint is an error that names what is wrong, never a panic.

use routed::model::{Model, ModelError};
use routed_test_support::Golden;
use safetensors::{Dtype, SafeTensors, tensor::TensorView};
use std::path::Path;

/// Copies the qwen3_moe golden checkpoint into `dir`, rewriting its weights with `edit`.
fn broken_checkpoint(dir: &Path, edit: impl Fn(&str, Vec<usize>) -> Option<Vec<usize>>) {
    let src = Golden::open("qwen3_moe").model_dir();
    for f in ["config.json", "tokenizer.json", "tokenizer_config.json", "generation_config.json"] {
        std::fs::copy(src.join(f), dir.join(f)).unwrap();
    }
    let bytes = std::fs::read(src.join("model.safetensors")).unwrap();
    let st = SafeTensors::deserialize(&bytes).unwrap();
    let mut kept: Vec<(String, Vec<usize>, Vec<u8>)> = Vec::new();
    for (name, view) in st.tensors() {
        if let Some(shape) = edit(&name, view.shape().to_vec()) {
            let n: usize = shape.iter().product();
            let data = view.data()[..n * 2].to_vec();
            kept.push((name, shape, data));
        }
    }
    let views: Vec<(String, TensorView<'_>)> = kept
        .iter()
        .map(|(n, s, d)| (n.clone(), TensorView::new(Dtype::BF16, s.clone(), d).unwrap()))
        .collect();
    safetensors::serialize_to_file(views, None, &dir.join("model.safetensors")).unwrap();
}

const VICTIM: &str = "model.layers.1.mlp.experts.3.up_proj.weight";

#[test]
fn a_removed_tensor_is_named() {
    let dir = tempfile::tempdir().unwrap();
    broken_checkpoint(dir.path(), |name, shape| (name != VICTIM).then_some(shape));
    let err = Model::load(dir.path(), &mut |_, _| {}).err().expect("load must fail");
    assert!(matches!(&err, ModelError::MissingTensor { name, .. } if name == VICTIM), "{err}");
    assert!(err.to_string().contains(VICTIM));
}

#[test]
fn a_misshaped_tensor_is_named_with_both_shapes() {
    let dir = tempfile::tempdir().unwrap();
    broken_checkpoint(dir.path(), |name, mut shape| {
        if name == VICTIM {
            shape[0] -= 1;
        }
        Some(shape)
    });
    let err = Model::load(dir.path(), &mut |_, _| {}).err().expect("load must fail");
    let msg = err.to_string();
    assert!(msg.contains(VICTIM) && msg.contains("[15, 64]") && msg.contains("[16, 64]"), "{msg}");
}

#[test]
fn an_unknown_architecture_and_a_missing_file_are_named() {
    let dir = tempfile::tempdir().unwrap();
    broken_checkpoint(dir.path(), |_, shape| Some(shape));
    let cfg = std::fs::read_to_string(dir.path().join("config.json")).unwrap();
    std::fs::write(
        dir.path().join("config.json"),
        cfg.replace("Qwen3MoeForCausalLM", "FancyForCausalLM"),
    )
    .unwrap();
    let msg = Model::load(dir.path(), &mut |_, _| {}).err().unwrap().to_string();
    assert!(msg.contains("FancyForCausalLM") && msg.contains("config.json"), "{msg}");

    std::fs::remove_file(dir.path().join("config.json")).unwrap();
    let msg = Model::load(dir.path(), &mut |_, _| {}).err().unwrap().to_string();
    assert!(msg.contains("config.json"), "{msg}");
}
