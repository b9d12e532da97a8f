//! Qwen3-MoE (`Qwen3MoeForCausalLM`): Llama-style blocks with per-head q/k RMSNorm before RoPE,
//! grouped-query attention, and MoE feed-forward blocks routed by softmax over all experts, top-k,
//! and (with `norm_topk_prob`) renormalisation. Layers listed in `mlp_only_layers`, or off the
//! `decoder_sparse_step` grid, have a dense SwiGLU MLP instead.
//!
//! Mixtral shares this structure (see `mixtral.rs` for its config); the loader below handles both.

use super::Loader;
use crate::{
    config::{
        Architecture, AttentionConfig, FfnActivation, FfnKind, LayerSpec, MixerKind, ModelConfig,
        MoeConfig, Multipliers, RawConfig, RouterKind,
    },
    error::Result,
    model::{Ffn, Layer, Mixer, Model},
};

pub(super) fn config(raw: &RawConfig) -> Result<ModelConfig> {
    if raw.opt_bool(&["use_sliding_window"])?.unwrap_or(false) {
        return Err(raw.unsupported("use_sliding_window = true"));
    }
    let num_layers = raw.usize(&["num_hidden_layers"])?;
    let num_experts = raw.usize(&["num_experts", "num_local_experts"])?;
    let sparse_step = raw.opt_usize(&["decoder_sparse_step"])?.unwrap_or(1).max(1);
    let mlp_only: Vec<usize> = match raw.get(&["mlp_only_layers"]) {
        Some(v) => serde_json::from_value(v.clone())
            .map_err(|_| raw.error("`mlp_only_layers` must be a list of layer indices"))?,
        None => Vec::new(),
    };
    let dense = FfnKind::Dense { intermediate: raw.usize(&["intermediate_size"])? };
    let layers = (0..num_layers)
        .map(|l| {
            let is_moe = !mlp_only.contains(&l) && num_experts > 0 && (l + 1) % sparse_step == 0;
            LayerSpec {
                mixer: MixerKind::Attention,
                ffn: if is_moe { FfnKind::Moe } else { dense },
            }
        })
        .collect();
    let moe = MoeConfig {
        num_experts,
        top_k: raw.usize(&["num_experts_per_tok"])?,
        expert_intermediate: raw.usize(&["moe_intermediate_size"])?,
        router: RouterKind::SoftmaxTopK {
            renormalize: raw.opt_bool(&["norm_topk_prob"])?.unwrap_or(false),
        },
        activation: FfnActivation::SwiGlu,
        shared_intermediate: None,
    };
    base_config(raw, Architecture::Qwen3Moe, layers, moe, true)
}

/// The parts Qwen3-MoE and Mixtral configs share.
pub(super) fn base_config(
    raw: &RawConfig,
    architecture: Architecture,
    layers: Vec<LayerSpec>,
    moe: MoeConfig,
    qk_norm: bool,
) -> Result<ModelConfig> {
    let hidden = raw.usize(&["hidden_size"])?;
    let num_heads = raw.usize(&["num_attention_heads"])?;
    let head_dim = raw.opt_usize(&["head_dim"])?.unwrap_or(hidden / num_heads);
    if raw.opt_bool(&["attention_bias"])?.unwrap_or(false) {
        return Err(raw.unsupported("attention_bias = true"));
    }
    let attention = AttentionConfig {
        num_heads,
        num_kv_heads: raw.opt_usize(&["num_key_value_heads"])?.unwrap_or(num_heads),
        head_dim,
        rope_theta: Some(raw.rope_theta()?.unwrap_or(10_000.0)),
        qk_norm,
        sliding_window: None,
        scale: 1.0 / (head_dim as f32).sqrt(),
    };
    if !attention.num_heads.is_multiple_of(attention.num_kv_heads) {
        return Err(raw.error("num_attention_heads must be a multiple of num_key_value_heads"));
    }
    Ok(ModelConfig {
        architecture,
        vocab_size: raw.usize(&["vocab_size"])?,
        hidden_size: hidden,
        layers,
        norm_eps: raw.opt_f32(&["rms_norm_eps"])?.unwrap_or(1e-6),
        attention: Some(attention),
        moe: Some(moe),
        mamba: None,
        tie_word_embeddings: raw.opt_bool(&["tie_word_embeddings"])?.unwrap_or(false),
        max_position_embeddings: raw.opt_usize(&["max_position_embeddings"])?.unwrap_or(4096),
        multipliers: Multipliers::default(),
        dtype: raw.dtype(),
    })
}

/// Loads a Qwen3-MoE or Mixtral checkpoint (they differ only in the MoE tensor names).
pub(super) fn load(config: ModelConfig, w: &mut Loader<'_>) -> Result<Model> {
    let h = config.hidden_size;
    let eps = config.norm_eps;
    let attn_cfg = config.attention.clone().expect("attention config");
    let moe_cfg = config.moe.clone().expect("moe config");
    let mixtral = config.architecture == Architecture::Mixtral;
    let embed = w.matrix("model.embed_tokens.weight", &[config.vocab_size, h])?;
    let mut layers = Vec::with_capacity(config.layers.len());
    for (l, spec) in config.layers.iter().enumerate() {
        let p = format!("model.layers.{l}");
        let attn = w.attention(&format!("{p}.self_attn"), &attn_cfg, h, l, eps)?;
        let ffn = match spec.ffn {
            FfnKind::Moe if mixtral => {
                let e = |e: usize| {
                    let x = format!("{p}.block_sparse_moe.experts.{e}");
                    [
                        Some(format!("{x}.w1.weight")),
                        Some(format!("{x}.w3.weight")),
                        Some(format!("{x}.w2.weight")),
                    ]
                };
                Ffn::Moe(w.moe(&moe_cfg, h, &format!("{p}.block_sparse_moe.gate.weight"), e)?)
            }
            FfnKind::Moe => {
                let e = |e: usize| {
                    let x = format!("{p}.mlp.experts.{e}");
                    [
                        Some(format!("{x}.gate_proj.weight")),
                        Some(format!("{x}.up_proj.weight")),
                        Some(format!("{x}.down_proj.weight")),
                    ]
                };
                Ffn::Moe(w.moe(&moe_cfg, h, &format!("{p}.mlp.gate.weight"), e)?)
            }
            FfnKind::Dense { intermediate } => {
                let names = [
                    format!("{p}.mlp.gate_proj.weight"),
                    format!("{p}.mlp.up_proj.weight"),
                    format!("{p}.mlp.down_proj.weight"),
                ];
                let [g, u, d] = [names[0].as_str(), names[1].as_str(), names[2].as_str()];
                Ffn::Dense(w.mlp(
                    [Some(g), Some(u), Some(d)],
                    FfnActivation::SwiGlu,
                    h,
                    intermediate,
                )?)
            }
            FfnKind::None => {
                unreachable!("Qwen3-MoE and Mixtral layers always have a feed-forward block")
            }
        };
        layers.push(Layer {
            mixer: Some((
                w.tensor(&format!("{p}.input_layernorm.weight"), &[h])?,
                Mixer::Attention(attn),
            )),
            ffn: Some((w.tensor(&format!("{p}.post_attention_layernorm.weight"), &[h])?, ffn)),
        });
    }
    let final_norm = w.tensor("model.norm.weight", &[h])?;
    let lm_head = w.lm_head(config.tie_word_embeddings, config.vocab_size, h)?;
    Ok(Model::new(config, embed, layers, final_norm, lm_head))
}
