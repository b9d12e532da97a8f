//! The default model compiled into the binary: a tiny Nemotron-H-style hybrid checkpoint (Mamba2,
//! attention and MoE layers) in Hugging Face format, with random weights, a byte-level BPE
//! tokenizer, a ChatML chat template and an EOS token. It lets `routed serve` run on a fresh machine with
//! nothing downloaded. It is made by `tests/golden/make_golden.py`.

use std::{
    hash::{Hash, Hasher},
    io,
    path::PathBuf,
};

/// The name the embedded model is served under.
pub const SERVED_MODEL_NAME: &str = "routed-tiny-hybrid";

const FILES: [(&str, &[u8]); 5] = [
    ("config.json", include_bytes!("../tests/golden/tiny_hybrid_default/model/config.json")),
    (
        "generation_config.json",
        include_bytes!("../tests/golden/tiny_hybrid_default/model/generation_config.json"),
    ),
    (
        "model.safetensors",
        include_bytes!("../tests/golden/tiny_hybrid_default/model/model.safetensors"),
    ),
    ("tokenizer.json", include_bytes!("../tests/golden/tiny_hybrid_default/model/tokenizer.json")),
    (
        "tokenizer_config.json",
        include_bytes!("../tests/golden/tiny_hybrid_default/model/tokenizer_config.json"),
    ),
];

/// Writes the embedded checkpoint to a directory under the system's temporary directory (once per
/// content: the directory name carries a hash of the files) and returns it.
pub fn unpack() -> io::Result<PathBuf> {
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    for (name, bytes) in FILES {
        name.hash(&mut hasher);
        bytes.hash(&mut hasher);
    }
    let dir = std::env::temp_dir().join(format!("routed-tiny-hybrid-{:016x}", hasher.finish()));
    std::fs::create_dir_all(&dir)?;
    for (name, bytes) in FILES {
        let path = dir.join(name);
        if std::fs::read(&path).is_ok_and(|on_disk| on_disk == bytes) {
            continue;
        }
        // Write then rename, so a concurrent start never reads a half-written file.
        let tmp = dir.join(format!(".{name}.{}", std::process::id()));
        std::fs::write(&tmp, bytes)?;
        std::fs::rename(&tmp, &path)?;
    }
    Ok(dir)
}

#[cfg(test)]
mod tests {
    #[test]
    fn unpacks_a_loadable_checkpoint() {
        let dir = super::unpack().unwrap();
        let config = routed_model::ModelConfig::from_dir(&dir).unwrap();
        assert!(config.is_hybrid() && config.moe.is_some());
        assert!(config.layers.iter().any(|l| l.mixer == routed_model::MixerKind::Attention));
        let tok = routed_model::Tokenizer::from_dir(&dir).unwrap();
        assert!(tok.has_chat_template() && !tok.eos_token_ids().is_empty());
        assert_eq!(super::unpack().unwrap(), dir, "unpacking is idempotent");
    }
}
