//! Reference outputs produced by Hugging Face transformers (`tests/golden/make_golden.py`) and
//! committed with the tiny checkpoints they were computed from.

use safetensors::{Dtype, SafeTensors};
use std::path::{Path, PathBuf};

/// The variable that points the tests at another copy of `tests/golden`: test executables built
/// here and run on another machine (a GPU's) find the folder there through it.
pub const GOLDEN_DIR_ENV: &str = "ROUTED_GOLDEN_DIR";

/// `tests/golden` at the workspace root, or the folder `$ROUTED_GOLDEN_DIR` names.
pub fn golden_root() -> PathBuf {
    match std::env::var_os(GOLDEN_DIR_ENV) {
        Some(dir) if !dir.is_empty() => PathBuf::from(dir),
        _ => Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/golden"),
    }
}

/// One architecture's golden directory: its checkpoint and reference tensors.
pub struct Golden {
    dir: PathBuf,
    bytes: Vec<u8>,
    /// `golden.json`.
    pub meta: serde_json::Value,
}

impl Golden {
    /// Opens `tests/golden/<arch>`.
    pub fn open(arch: &str) -> Self {
        Self::open_tensors(arch, "golden.safetensors")
    }

    /// Opens `tests/golden/<arch>` with its reference tensors read from `file` (such as
    /// `golden_bf16.safetensors`, transformers' bfloat16 run).
    pub fn open_tensors(arch: &str, file: &str) -> Self {
        let dir = golden_root().join(arch);
        let bytes = std::fs::read(dir.join(file))
            .unwrap_or_else(|e| panic!("reading {}/{file}: {e}", dir.display()));
        let meta = serde_json::from_str(
            &std::fs::read_to_string(dir.join("golden.json")).expect("golden.json"),
        )
        .expect("golden.json is JSON");
        Self { dir, bytes, meta }
    }

    /// The checkpoint directory.
    pub fn model_dir(&self) -> PathBuf {
        self.dir.join("model")
    }

    fn tensors(&self) -> SafeTensors<'_> {
        SafeTensors::deserialize(&self.bytes).expect("golden.safetensors is valid")
    }

    /// Whether a reference tensor exists.
    pub fn has(&self, name: &str) -> bool {
        self.tensors().names().contains(&name)
    }

    /// A reference tensor as `f32` with its shape.
    pub fn f32(&self, name: &str) -> (Vec<f32>, Vec<usize>) {
        let st = self.tensors();
        let t = st.tensor(name).unwrap_or_else(|_| panic!("golden tensor {name} missing"));
        assert_eq!(t.dtype(), Dtype::F32, "{name} is not f32");
        let v =
            t.data().chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect();
        (v, t.shape().to_vec())
    }

    /// A reference integer tensor (stored as i64) with its shape.
    pub fn i64(&self, name: &str) -> (Vec<i64>, Vec<usize>) {
        let st = self.tensors();
        let t = st.tensor(name).unwrap_or_else(|_| panic!("golden tensor {name} missing"));
        assert_eq!(t.dtype(), Dtype::I64, "{name} is not i64");
        let v =
            t.data().chunks_exact(8).map(|c| i64::from_le_bytes(c.try_into().unwrap())).collect();
        (v, t.shape().to_vec())
    }

    /// Prompt token ids of a case.
    pub fn prompt(&self, case: &str) -> Vec<u32> {
        self.i64(&format!("{case}.prompt_ids")).0.into_iter().map(|x| x as u32).collect()
    }

    /// Decoder-layer indices of the MoE layers.
    pub fn moe_layers(&self) -> Vec<usize> {
        self.meta["moe_layers"]
            .as_array()
            .expect("moe_layers")
            .iter()
            .map(|v| v.as_u64().unwrap() as usize)
            .collect()
    }
}
