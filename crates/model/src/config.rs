//! Hugging Face `config.json`, normalised.
//!
//! Checkpoints come in two key styles: the Hub style written by transformers 4 (`num_experts`,
//! `rope_theta`, `torch_dtype`, `hybrid_override_pattern`) and the style transformers 5 writes
//! (`num_local_experts`, `rope_parameters`, `dtype`, `layers_block_type`). [`RawConfig`] looks
//! keys up under every name they go by, and each family turns it into a [`ModelConfig`], the one
//! shape the rest of the engine reads.

use crate::error::{ModelError, Result};
use serde_json::Value;
use std::path::{Path, PathBuf};

/// The model families this engine implements, by their Hugging Face `architectures` name.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Architecture {
    /// `Qwen3MoeForCausalLM`.
    Qwen3Moe,
    /// `MixtralForCausalLM`.
    Mixtral,
    /// `NemotronHForCausalLM`.
    NemotronH,
    /// `GraniteMoeHybridForCausalLM`.
    GraniteMoeHybrid,
}

impl Architecture {
    const ALL: [(&'static str, Architecture); 4] = [
        ("Qwen3MoeForCausalLM", Architecture::Qwen3Moe),
        ("MixtralForCausalLM", Architecture::Mixtral),
        ("NemotronHForCausalLM", Architecture::NemotronH),
        ("GraniteMoeHybridForCausalLM", Architecture::GraniteMoeHybrid),
    ];

    /// The Hugging Face class name.
    pub fn hf_name(self) -> &'static str {
        Self::ALL.iter().find(|(_, a)| *a == self).map(|(n, _)| *n).unwrap_or("?")
    }

    fn from_hf_name(name: &str) -> Option<Self> {
        Self::ALL.iter().find(|(n, _)| *n == name).map(|(_, a)| *a)
    }
}

/// How a MoE layer turns router logits into expert ids and weights.
#[derive(Clone, Debug, PartialEq)]
pub enum RouterKind {
    /// Softmax over all experts, top-k, optionally renormalise the k weights (Qwen3-MoE, Mixtral).
    SoftmaxTopK {
        /// Rescale the k weights to sum to 1 (`norm_topk_prob`).
        renormalize: bool,
    },
    /// Top-k of the raw logits, then softmax over the k (Granite).
    TopKSoftmax,
    /// Sigmoid scores; a correction bias used only for choosing; group-limited top-k; weights from
    /// the unbiased scores, optionally renormalised, times a scaling factor (Nemotron-H).
    SigmoidGrouped {
        /// Expert groups (`n_group`).
        num_groups: usize,
        /// Groups a token may choose from (`topk_group`).
        topk_groups: usize,
        /// Rescale the k weights to sum to 1.
        renormalize: bool,
        /// The routed scaling factor applied to the weights.
        scaling: f32,
    },
}

/// The activation of a feed-forward block.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FfnActivation {
    /// `down(silu(gate(x)) * up(x))`.
    SwiGlu,
    /// `down(relu(up(x))²)`, no gate.
    Relu2,
}

/// Mixture-of-experts parameters shared by every MoE layer of a model.
#[derive(Clone, Debug, PartialEq)]
pub struct MoeConfig {
    /// Routed experts per layer.
    pub num_experts: usize,
    /// Experts chosen per token.
    pub top_k: usize,
    /// Hidden width of one expert.
    pub expert_intermediate: usize,
    /// The routing function.
    pub router: RouterKind,
    /// Expert activation.
    pub activation: FfnActivation,
    /// Width of the shared expert that sees every token, if any.
    pub shared_intermediate: Option<usize>,
}

/// Attention parameters.
#[derive(Clone, Debug, PartialEq)]
pub struct AttentionConfig {
    /// Query heads.
    pub num_heads: usize,
    /// Key/value heads (grouped-query attention when fewer than `num_heads`).
    pub num_kv_heads: usize,
    /// Width of one head.
    pub head_dim: usize,
    /// RoPE base, or `None` for attention without positional encoding.
    pub rope_theta: Option<f32>,
    /// Per-head RMSNorm of q and k before RoPE (Qwen3).
    pub qk_norm: bool,
    /// A query attends to at most this many most recent keys (itself included).
    pub sliding_window: Option<usize>,
    /// Multiplier of `q·k`; `1/sqrt(head_dim)` unless the family says otherwise.
    pub scale: f32,
}

/// Mamba2 mixer parameters.
#[derive(Clone, Debug, PartialEq)]
pub struct MambaConfig {
    /// SSM heads.
    pub num_heads: usize,
    /// Width of one head.
    pub head_dim: usize,
    /// Groups sharing B and C.
    pub num_groups: usize,
    /// SSM state size per head channel.
    pub state_size: usize,
    /// Causal conv1d kernel width.
    pub conv_kernel: usize,
    /// Whether the conv has a bias.
    pub conv_bias: bool,
    /// Whether in_proj/out_proj have biases.
    pub proj_bias: bool,
    /// Lower clamp of `dt` applied at prompt positions only (see `docs/ARCHITECTURE.md`).
    pub dt_min_prompt: Option<f32>,
    /// Upper clamp of `dt` at prompt positions (`None`: infinity).
    pub dt_max_prompt: Option<f32>,
    /// Epsilon of the gated RMSNorm.
    pub norm_eps: f32,
    /// The gated RMSNorm normalises `d_inner / norm_groups` channels at a time.
    pub norm_groups: usize,
    /// The chunk size the reference implementation scans in (informational: we scan per token).
    pub chunk_size: usize,
}

impl MambaConfig {
    /// Inner width `heads * head_dim`.
    pub fn d_inner(&self) -> usize {
        self.num_heads * self.head_dim
    }

    /// Channels that go through the conv: x, B and C.
    pub fn conv_dim(&self) -> usize {
        self.d_inner() + 2 * self.num_groups * self.state_size
    }
}

/// What a decoder layer mixes tokens with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MixerKind {
    /// Self-attention over the paged KV cache.
    Attention,
    /// A Mamba2 selective state-space mixer.
    Mamba,
    /// No token mixer (a Nemotron-H MoE or MLP block).
    None,
}

/// The feed-forward part of a decoder layer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FfnKind {
    /// None (a Nemotron-H mixer-only block).
    None,
    /// A dense MLP.
    Dense {
        /// Its intermediate width.
        intermediate: usize,
    },
    /// A mixture-of-experts block (see [`MoeConfig`]).
    Moe,
}

/// One decoder layer's structure.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LayerSpec {
    /// Token mixer.
    pub mixer: MixerKind,
    /// Feed-forward block.
    pub ffn: FfnKind,
}

/// Scalar multipliers (Granite's muP); all 1 for other families.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Multipliers {
    /// Scales the embeddings.
    pub embedding: f32,
    /// Scales each residual branch before it is added.
    pub residual: f32,
    /// Logits are divided by this.
    pub logits_scaling: f32,
}

impl Default for Multipliers {
    fn default() -> Self {
        Self { embedding: 1.0, residual: 1.0, logits_scaling: 1.0 }
    }
}

/// A model's configuration in the engine's own terms.
#[derive(Clone, Debug, PartialEq)]
pub struct ModelConfig {
    /// The family.
    pub architecture: Architecture,
    /// Vocabulary size (rows of the embedding and the LM head).
    pub vocab_size: usize,
    /// Residual stream width.
    pub hidden_size: usize,
    /// Per-layer structure, in model order.
    pub layers: Vec<LayerSpec>,
    /// Epsilon of the block and final RMSNorms.
    pub norm_eps: f32,
    /// Attention parameters, when any layer attends.
    pub attention: Option<AttentionConfig>,
    /// MoE parameters, when any layer is MoE.
    pub moe: Option<MoeConfig>,
    /// Mamba2 parameters, when any layer is Mamba.
    pub mamba: Option<MambaConfig>,
    /// Whether the LM head reuses the embedding matrix.
    pub tie_word_embeddings: bool,
    /// Longest sequence the model was configured for.
    pub max_position_embeddings: usize,
    /// muP multipliers.
    pub multipliers: Multipliers,
    /// Dtype the weights are stored in, as the config says (informational).
    pub dtype: Option<String>,
}

impl ModelConfig {
    /// Indices of the MoE layers among all decoder layers, in model order: the layer axis of the
    /// routing rows.
    pub fn moe_layer_ids(&self) -> Vec<u32> {
        self.layers
            .iter()
            .enumerate()
            .filter(|(_, l)| l.ffn == FfnKind::Moe)
            .map(|(i, _)| i as u32)
            .collect()
    }

    /// Whether the model has Mamba layers (and so needs state snapshots for prefix caching).
    pub fn is_hybrid(&self) -> bool {
        self.layers.iter().any(|l| l.mixer == MixerKind::Mamba)
    }

    /// Whether per-token math differs between prompt and generated positions, so the prefix
    /// cache must key blocks on which of their positions were generated.
    pub fn math_depends_on_position_kind(&self) -> bool {
        self.mamba.as_ref().is_some_and(|m| m.dt_min_prompt.is_some() || m.dt_max_prompt.is_some())
    }

    /// What differs between two configurations in what the engine computes with (the stored
    /// dtype is informational and ignored), naming the first field that does; `None` when a
    /// checkpoint of `other` can replace the weights of `self` (a weight update).
    pub fn mismatch(&self, other: &Self) -> Option<String> {
        let differs = |name: &str, a: &dyn std::fmt::Debug, b: &dyn std::fmt::Debug| {
            Some(format!("{name} differs: {a:?} served, {b:?} in the new checkpoint"))
        };
        macro_rules! same {
            ($($field:ident),*) => {$(
                if self.$field != other.$field {
                    return differs(stringify!($field), &self.$field, &other.$field);
                }
            )*};
        }
        same!(architecture, vocab_size, hidden_size);
        if self.layers.len() != other.layers.len() {
            return differs("the number of layers", &self.layers.len(), &other.layers.len());
        }
        if let Some(i) = (0..self.layers.len()).find(|&i| self.layers[i] != other.layers[i]) {
            return differs(&format!("layer {i}"), &self.layers[i], &other.layers[i]);
        }
        same!(
            norm_eps,
            attention,
            moe,
            mamba,
            tie_word_embeddings,
            max_position_embeddings,
            multipliers
        );
        None
    }

    /// Reads `dir/config.json` and normalises it.
    pub fn from_dir(dir: &Path) -> Result<Self> {
        Self::from_file(&dir.join("config.json"))
    }

    /// Reads a config file and normalises it; keys that contradict each other or the vocabulary
    /// (also the EOS ids of a `generation_config.json` beside it) are an error naming the key.
    pub fn from_file(path: &Path) -> Result<Self> {
        let raw = RawConfig::read(path)?;
        let arch_name = raw.architecture()?;
        let arch = Architecture::from_hf_name(&arch_name).ok_or_else(|| {
            ModelError::UnknownArchitecture {
                path: path.to_owned(),
                name: arch_name.clone(),
                supported: Architecture::ALL.iter().map(|(n, _)| *n).collect::<Vec<_>>().join(", "),
            }
        })?;
        let config = crate::families::config_for(arch, &raw)?;
        crate::config_checks::check(&raw, &config)?;
        Ok(config)
    }
}

/// A parsed `config.json` with lookups that accept every name a key goes by.
pub struct RawConfig {
    path: PathBuf,
    value: Value,
}

impl RawConfig {
    /// Reads and parses `path`.
    pub fn read(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path)
            .map_err(|source| ModelError::Io { path: path.to_owned(), source })?;
        let value = serde_json::from_str(&text)
            .map_err(|source| ModelError::Json { path: path.to_owned(), source })?;
        Ok(Self { path: path.to_owned(), value })
    }

    /// Builds a config from an in-memory value (tests).
    pub fn from_value(path: PathBuf, value: Value) -> Self {
        Self { path, value }
    }

    /// The file this came from, for error messages.
    pub fn path(&self) -> &Path {
        &self.path
    }

    fn architecture(&self) -> Result<String> {
        match self.value.get("architectures").and_then(|a| a.get(0)).and_then(Value::as_str) {
            Some(name) => Ok(name.to_owned()),
            None => Err(self.error("missing `architectures` (a list naming the model class)")),
        }
    }

    /// A config error at this file.
    pub fn error(&self, message: impl Into<String>) -> ModelError {
        ModelError::Config { path: self.path.clone(), message: message.into() }
    }

    /// An unsupported-feature error at this file.
    pub fn unsupported(&self, message: impl Into<String>) -> ModelError {
        ModelError::Unsupported { path: self.path.clone(), message: message.into() }
    }

    /// The first of `keys` that is present and not null.
    pub fn get(&self, keys: &[&str]) -> Option<&Value> {
        keys.iter().find_map(|k| self.value.get(*k).filter(|v| !v.is_null()))
    }

    /// A required non-negative integer.
    pub fn usize(&self, keys: &[&str]) -> Result<usize> {
        self.opt_usize(keys)?
            .ok_or_else(|| self.error(format!("missing integer `{}`", keys.join("` / `"))))
    }

    /// An optional non-negative integer.
    pub fn opt_usize(&self, keys: &[&str]) -> Result<Option<usize>> {
        match self.get(keys) {
            None => Ok(None),
            Some(v) => v.as_u64().map(|n| Some(n as usize)).ok_or_else(|| {
                self.error(format!("`{}` must be a non-negative integer, got {v}", keys[0]))
            }),
        }
    }

    /// A required number.
    pub fn f32(&self, keys: &[&str]) -> Result<f32> {
        self.opt_f32(keys)?
            .ok_or_else(|| self.error(format!("missing number `{}`", keys.join("` / `"))))
    }

    /// An optional number; also accepts transformers 5's `{"__float__": "Infinity"}`.
    pub fn opt_f32(&self, keys: &[&str]) -> Result<Option<f32>> {
        match self.get(keys) {
            None => Ok(None),
            Some(v) => parse_float(v)
                .map(Some)
                .ok_or_else(|| self.error(format!("`{}` must be a number, got {v}", keys[0]))),
        }
    }

    /// An optional boolean.
    pub fn opt_bool(&self, keys: &[&str]) -> Result<Option<bool>> {
        match self.get(keys) {
            None => Ok(None),
            Some(v) => v
                .as_bool()
                .map(Some)
                .ok_or_else(|| self.error(format!("`{}` must be a boolean, got {v}", keys[0]))),
        }
    }

    /// An optional string.
    pub fn opt_str(&self, keys: &[&str]) -> Option<&str> {
        self.get(keys).and_then(Value::as_str)
    }

    /// The RoPE base from `rope_theta` (Hub style) or `rope_parameters.rope_theta` (transformers 5).
    /// Scaled RoPE variants are rejected with a clear error rather than computed wrongly.
    pub fn rope_theta(&self) -> Result<Option<f32>> {
        for key in ["rope_parameters", "rope_scaling"] {
            if let Some(p) = self.get(&[key]) {
                let kind = p
                    .get("rope_type")
                    .or_else(|| p.get("type"))
                    .and_then(Value::as_str)
                    .unwrap_or("default");
                if kind != "default" {
                    return Err(self.unsupported(format!(
                        "{key}.rope_type {kind:?} (only default RoPE is implemented)"
                    )));
                }
            }
        }
        if let Some(t) = self.opt_f32(&["rope_theta"])? {
            return Ok(Some(t));
        }
        Ok(self.get(&["rope_parameters"]).and_then(|p| p.get("rope_theta")).and_then(parse_float))
    }

    /// The storage dtype (`torch_dtype` or `dtype`).
    pub fn dtype(&self) -> Option<String> {
        self.opt_str(&["torch_dtype", "dtype"]).map(str::to_owned)
    }
}

fn parse_float(v: &Value) -> Option<f32> {
    if let Some(f) = v.as_f64() {
        return Some(f as f32);
    }
    match v.get("__float__").and_then(Value::as_str)? {
        "Infinity" | "inf" => Some(f32::INFINITY),
        "-Infinity" | "-inf" => Some(f32::NEG_INFINITY),
        "NaN" | "nan" => Some(f32::NAN),
        s => s.parse().ok(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn accepts_transformers5_infinity() {
        let raw = RawConfig::from_value(
            "c.json".into(),
            json!({"x": {"__float__": "Infinity"}, "y": 2.5}),
        );
        assert_eq!(raw.opt_f32(&["x"]).unwrap(), Some(f32::INFINITY));
        assert_eq!(raw.f32(&["y"]).unwrap(), 2.5);
    }

    #[test]
    fn wrong_types_are_named() {
        let raw = RawConfig::from_value("c.json".into(), json!({"hidden_size": "big"}));
        let e = raw.usize(&["hidden_size"]).unwrap_err().to_string();
        assert!(e.contains("hidden_size") && e.contains("c.json"), "{e}");
    }

    #[test]
    fn rope_theta_in_both_styles() {
        let hub = RawConfig::from_value("c".into(), json!({"rope_theta": 1e6}));
        let v5 = RawConfig::from_value(
            "c".into(),
            json!({"rope_parameters": {"rope_type": "default", "rope_theta": 1e6}}),
        );
        assert_eq!(hub.rope_theta().unwrap(), Some(1e6));
        assert_eq!(v5.rope_theta().unwrap(), Some(1e6));
        let yarn =
            RawConfig::from_value("c".into(), json!({"rope_scaling": {"rope_type": "yarn"}}));
        assert!(yarn.rope_theta().is_err());
    }
}
