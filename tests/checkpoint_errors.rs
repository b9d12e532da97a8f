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

/// Copies the `arch` golden checkpoint into `dir` and rewrites the JSON file `file` with `edit`.
fn edited_checkpoint(
    arch: &str,
    dir: &Path,
    file: &str,
    edit: impl FnOnce(&mut serde_json::Value),
) {
    let src = Golden::open(arch).model_dir();
    for entry in std::fs::read_dir(&src).unwrap() {
        let path = entry.unwrap().path();
        std::fs::copy(&path, dir.join(path.file_name().unwrap())).unwrap();
    }
    let path = dir.join(file);
    let mut value: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    edit(&mut value);
    std::fs::write(&path, value.to_string()).unwrap();
}

/// Loads the edited checkpoint (with `config.v5.json` when that is the file edited), which must fail with one line naming `key` and `file`.
fn load_error(arch: &str, file: &str, key: &str, edit: impl FnOnce(&mut serde_json::Value)) {
    let dir = tempfile::tempdir().unwrap();
    edited_checkpoint(arch, dir.path(), file, edit);
    let loaded = match file {
        "config.v5.json" => Model::load_with_config(dir.path(), &dir.path().join(file)),
        _ => Model::load(dir.path(), &mut |_, _| {}),
    };
    let msg = loaded.err().expect("load must fail").to_string();
    assert!(msg.contains(key) && msg.contains(file) && !msg.contains('\n'), "{key}: {msg}");
}

#[test]
fn a_layer_pattern_of_another_length_than_num_hidden_layers_is_named() {
    // The golden Nemotron-H has 7 layers, "ME*EM-E".
    load_error("nemotron_h", "config.json", "hybrid_override_pattern", |c| {
        c["hybrid_override_pattern"] = "ME*EM".into();
    });
    load_error("nemotron_h", "config.json", "hybrid_override_pattern", |c| {
        c["hybrid_override_pattern"] = "ME*EM-EE".into();
    });
    load_error("granitemoehybrid", "config.json", "layer_types", |c| {
        c["num_hidden_layers"] = 5.into();
    });
}

#[test]
fn max_position_embeddings_zero_is_named() {
    for arch in ["qwen3_moe", "nemotron_h"] {
        load_error(arch, "config.json", "max_position_embeddings", |c| {
            c["max_position_embeddings"] = 0.into();
        });
    }
}

#[test]
fn an_eos_token_id_outside_the_vocabulary_is_named_with_its_file() {
    // The golden vocabularies have 512 tokens.
    load_error("qwen3_moe", "config.json", "eos_token_id", |c| c["eos_token_id"] = 512.into());
    load_error("qwen3_moe", "generation_config.json", "eos_token_id", |c| {
        c["eos_token_id"] = serde_json::json!([2, 100000]);
    });
}

#[test]
fn an_unknown_dtype_is_named() {
    load_error("qwen3_moe", "config.json", "torch_dtype", |c| c["torch_dtype"] = "bfloat17".into());
    load_error("nemotron_h", "config.v5.json", "dtype", |c| c["dtype"] = "int4x".into());
}
