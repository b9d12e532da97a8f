//! Mixtral (`MixtralForCausalLM`): Llama-style attention with RoPE and no q/k norms; every layer
//! is MoE, routed by softmax over all experts, top-k, always renormalised. An optional sliding
//! window limits attention. Tensors are loaded by `qwen3_moe::load` with Mixtral's names.

use super::qwen3_moe::base_config;
use crate::{
    config::{
        Architecture, FfnActivation, FfnKind, LayerSpec, MixerKind, ModelConfig, MoeConfig,
        RawConfig, RouterKind,
    },
    error::Result,
};

pub(super) fn config(raw: &RawConfig) -> Result<ModelConfig> {
    let num_layers = raw.usize(&["num_hidden_layers"])?;
    let layers = vec![LayerSpec { mixer: MixerKind::Attention, ffn: FfnKind::Moe }; num_layers];
    let moe = MoeConfig {
        num_experts: raw.usize(&["num_local_experts", "num_experts"])?,
        top_k: raw.usize(&["num_experts_per_tok"])?,
        expert_intermediate: raw.usize(&["intermediate_size"])?,
        router: RouterKind::SoftmaxTopK { renormalize: true },
        activation: FfnActivation::SwiGlu,
        shared_intermediate: None,
    };
    let mut config = base_config(raw, Architecture::Mixtral, layers, moe, false)?;
    if let Some(attn) = config.attention.as_mut() {
        attn.sliding_window = raw.opt_usize(&["sliding_window"])?;
    }
    Ok(config)
}
