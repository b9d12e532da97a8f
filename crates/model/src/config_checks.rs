//! Checks across the keys of a checkpoint's configuration: each key may parse on its own and still
//! contradict another one or the vocabulary. Loading such a checkpoint would serve a different
//! model than the one described (a layer pattern shorter than `num_hidden_layers` silently drops
//! layers), or fail much later with a message that names nothing; so each case is a one-line
//! error naming the file and the key.

use crate::config::{ModelConfig, RawConfig};
use crate::error::{ModelError, Result};
use serde_json::Value;
use std::path::Path;

/// Keys that spell out the decoder layers one by one, as the families read them.
const LAYER_PATTERN_KEYS: [&str; 3] =
    ["hybrid_override_pattern", "layers_block_type", "layer_types"];

/// The storage dtypes a config may name (PyTorch's floating-point dtypes, by the names
/// transformers writes and their aliases). The loader converts each tensor by its own safetensors
/// dtype; the config's value is informational, but a name outside this list means the file was
/// mistyped or written for something else.
const KNOWN_DTYPES: [&str; 11] = [
    "float32",
    "float16",
    "bfloat16",
    "float64",
    "float",
    "half",
    "double",
    "float8_e4m3fn",
    "float8_e5m2",
    "float8_e4m3fnuz",
    "float8_e5m2fnuz",
];

/// Checks `config` (normalised from `raw`) against the keys it was read from, and the EOS ids of
/// `generation_config.json` beside the config file against the vocabulary.
pub(crate) fn check(raw: &RawConfig, config: &ModelConfig) -> Result<()> {
    layer_count(raw)?;
    if config.max_position_embeddings == 0 {
        return Err(raw.error("`max_position_embeddings` must be at least 1, got 0"));
    }
    dtype(raw)?;
    let vocab = config.vocab_size;
    eos_ids(raw.path(), raw.get(&["eos_token_id"]), vocab)?;
    let generation = raw.path().with_file_name("generation_config.json");
    if let Some(value) = crate::tokenizer::read_optional_json(&generation)? {
        eos_ids(&generation, value.get("eos_token_id").filter(|v| !v.is_null()), vocab)?;
    }
    Ok(())
}

/// Every per-layer list present must have `num_hidden_layers` entries, when that key is given.
fn layer_count(raw: &RawConfig) -> Result<()> {
    let Some(num_layers) = raw.opt_usize(&["num_hidden_layers"])? else { return Ok(()) };
    for key in LAYER_PATTERN_KEYS {
        let len = match raw.get(&[key]) {
            None => continue,
            Some(Value::String(pattern)) => pattern.chars().count(),
            Some(Value::Array(list)) => list.len(),
            Some(other) => {
                return Err(raw.error(format!("`{key}` must be a string or a list, got {other}")));
            }
        };
        if len != num_layers {
            return Err(raw.error(format!(
                "`{key}` describes {len} layers but `num_hidden_layers` is {num_layers}"
            )));
        }
    }
    Ok(())
}

/// `torch_dtype` / `dtype`, when given, must be a string naming a known dtype.
fn dtype(raw: &RawConfig) -> Result<()> {
    for key in ["torch_dtype", "dtype"] {
        match raw.get(&[key]) {
            None => {}
            Some(Value::String(name)) if KNOWN_DTYPES.contains(&name.as_str()) => {}
            Some(other) => {
                return Err(raw.error(format!(
                    "`{key}` {other} is not a known dtype (expected one of {})",
                    KNOWN_DTYPES.join(", ")
                )));
            }
        }
    }
    Ok(())
}

/// `eos_token_id` (one id or a list of them) must name tokens of the vocabulary: a generation
/// could never end on an id the model cannot produce.
fn eos_ids(path: &Path, value: Option<&Value>, vocab_size: usize) -> Result<()> {
    let error = |message: String| ModelError::Config { path: path.to_owned(), message };
    let ids: Vec<&Value> = match value {
        None => return Ok(()),
        Some(Value::Array(list)) => list.iter().collect(),
        Some(one) => vec![one],
    };
    for id in ids {
        match id.as_u64() {
            Some(id) if (id as usize) < vocab_size => {}
            Some(id) => {
                return Err(error(format!(
                    "`eos_token_id` {id} is outside the vocabulary (vocab_size {vocab_size})"
                )));
            }
            None => {
                return Err(error(format!(
                    "`eos_token_id` must be a non-negative integer or a list of them, got {id}"
                )));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn raw(value: Value) -> RawConfig {
        RawConfig::from_value("/nonexistent/config.json".into(), value)
    }

    #[test]
    fn a_pattern_of_another_length_names_both_keys() {
        let r = raw(json!({"num_hidden_layers": 4, "hybrid_override_pattern": "ME*"}));
        let e = layer_count(&r).unwrap_err().to_string();
        assert!(e.contains("hybrid_override_pattern") && e.contains("num_hidden_layers"), "{e}");
        assert!(
            layer_count(&raw(json!({"num_hidden_layers": 3, "layer_types": [1, 2, 3]}))).is_ok()
        );
        // Without `num_hidden_layers` the pattern is the layer count.
        assert!(layer_count(&raw(json!({"layers_block_type": ["moe"]}))).is_ok());
    }

    #[test]
    fn dtypes_and_eos_ids_are_checked() {
        assert!(dtype(&raw(json!({"torch_dtype": "bfloat16", "dtype": "float32"}))).is_ok());
        let e = dtype(&raw(json!({"dtype": "bfloat17"}))).unwrap_err().to_string();
        assert!(e.contains("`dtype`") && e.contains("bfloat17"), "{e}");
        assert!(dtype(&raw(json!({"torch_dtype": 16}))).is_err());
        let p = Path::new("g.json");
        assert!(eos_ids(p, Some(&json!([1, 2])), 8).is_ok());
        let e = eos_ids(p, Some(&json!([1, 8])), 8).unwrap_err().to_string();
        assert!(e.contains("g.json") && e.contains("eos_token_id") && e.contains('8'), "{e}");
        assert!(eos_ids(p, Some(&json!(-1)), 8).is_err());
    }
}
