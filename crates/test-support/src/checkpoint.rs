//! Checkpoints derived from the golden ones, for tests that need a second set of weights.

use std::path::Path;

/// Copies the checkpoint in `from` into `to` (an existing directory) with the rows of its
/// embedding table reversed: another policy of the same model, same configuration and tensor
/// layout, whose tokens route and score differently from the original's.
pub fn write_other_policy(from: &Path, to: &Path) {
    for entry in std::fs::read_dir(from).expect("the checkpoint directory") {
        let path = entry.expect("a directory entry").path();
        let Some(name) = path.file_name() else { continue };
        if path.extension().is_some_and(|e| e == "safetensors") {
            std::fs::write(to.join(name), reversed_embedding(&path)).expect("written");
        } else if path.is_file() {
            std::fs::copy(&path, to.join(name)).expect("copied");
        }
    }
}

/// The safetensors file at `path` with the rows of its embedding table reversed.
fn reversed_embedding(path: &Path) -> Vec<u8> {
    let bytes = std::fs::read(path).expect("the checkpoint");
    let file = safetensors::SafeTensors::deserialize(&bytes).expect("a safetensors file");
    let (_, metadata) = safetensors::SafeTensors::read_metadata(&bytes).expect("its header");
    let mut owned = Vec::new();
    for (name, view) in file.tensors() {
        let mut data = view.data().to_vec();
        if name.contains("embed") && view.shape().len() == 2 {
            let row = data.len() / view.shape()[0];
            data = data.chunks(row).rev().collect::<Vec<_>>().concat();
        }
        owned.push((name, view.dtype(), view.shape().to_vec(), data));
    }
    let views = owned.iter().map(|(name, dtype, shape, data)| {
        let view = safetensors::tensor::TensorView::new(*dtype, shape.clone(), data);
        (name.clone(), view.expect("the same tensor"))
    });
    safetensors::serialize(views, metadata.metadata().clone()).expect("serialised")
}
