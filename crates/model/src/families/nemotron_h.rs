//! Nemotron-H (`NemotronHForCausalLM`): a stack of single-mixer blocks `x + mixer(RMSNorm(x))`
//! whose kinds come from the layer pattern: `M` Mamba2, `*` attention without positional
//! encoding, `E` MoE, `-` squared-ReLU MLP.
//!
//! The MoE router scores experts with a sigmoid, adds `e_score_correction_bias` only to choose
//! (group-limited top-k), takes weights from the unbiased scores, renormalises them and scales by
//! `routed_scaling_factor`; experts and the shared expert are ungated squared-ReLU MLPs.
//!
//! `dt` is clamped below by `time_step_min` at prompt positions only: the reference
//! implementation clamps in its multi-token scan and not in its one-token decode step, and making
//! it a property of the position keeps every chunking and every recomputation identical.

use super::Loader;
use crate::{
    config::{
        Architecture, AttentionConfig, FfnActivation, FfnKind, LayerSpec, MambaConfig, MixerKind,
        ModelConfig, MoeConfig, Multipliers, RawConfig, RouterKind,
    },
    error::Result,
    model::{Ffn, Layer, Mixer, Model},
};

fn pattern(raw: &RawConfig) -> Result<Vec<char>> {
    if let Some(p) = raw.opt_str(&["hybrid_override_pattern"]) {
        return Ok(p.chars().collect());
    }
    let list = raw
        .get(&["layers_block_type"])
        .and_then(|v| v.as_array())
        .ok_or_else(|| raw.error("missing `hybrid_override_pattern` (or `layers_block_type`)"))?;
    list.iter()
        .map(|v| match v.as_str() {
            Some("mamba" | "linear_attention") => Ok('M'),
            Some("attention" | "full_attention") => Ok('*'),
            Some("moe") => Ok('E'),
            Some("mlp") => Ok('-'),
            _ => Err(raw.error(format!("unknown entry {v} in `layers_block_type`"))),
        })
        .collect()
}

pub(super) fn config(raw: &RawConfig) -> Result<ModelConfig> {
    let hidden = raw.usize(&["hidden_size"])?;
    let layers = pattern(raw)?
        .into_iter()
        .map(|c| match c {
            'M' => Ok(LayerSpec { mixer: MixerKind::Mamba, ffn: FfnKind::None }),
            '*' => Ok(LayerSpec { mixer: MixerKind::Attention, ffn: FfnKind::None }),
            'E' => Ok(LayerSpec { mixer: MixerKind::None, ffn: FfnKind::Moe }),
            '-' => Ok(LayerSpec {
                mixer: MixerKind::None,
                ffn: FfnKind::Dense { intermediate: raw.usize(&["intermediate_size"])? },
            }),
            other => {
                Err(raw.error(format!("unknown layer kind {other:?} in `hybrid_override_pattern`")))
            }
        })
        .collect::<Result<Vec<_>>>()?;
    for key in ["mlp_hidden_act", "mamba_hidden_act"] {
        let want = if key == "mlp_hidden_act" { "relu2" } else { "silu" };
        if let Some(act) = raw.opt_str(&[key]).filter(|a| *a != want) {
            return Err(raw.unsupported(format!("{key} = {act:?} (only {want:?})")));
        }
    }
    if raw.opt_usize(&["moe_latent_size"])?.is_some() {
        return Err(raw.unsupported("moe_latent_size (latent MoE projections)"));
    }
    if raw.opt_bool(&["mamba_proj_bias", "use_bias"])?.unwrap_or(false)
        || raw.opt_bool(&["attention_bias"])?.unwrap_or(false)
    {
        return Err(raw.unsupported("projection biases"));
    }
    let num_heads = raw.usize(&["num_attention_heads"])?;
    let head_dim =
        raw.opt_usize(&["head_dim", "attention_head_dim"])?.unwrap_or(hidden / num_heads);
    let shared = match raw.opt_usize(&["n_shared_experts"])?.unwrap_or(0) {
        0 => None,
        n => Some(n * raw.usize(&["moe_shared_expert_intermediate_size"])?),
    };
    let mamba_groups = raw.usize(&["n_groups"])?;
    Ok(ModelConfig {
        architecture: Architecture::NemotronH,
        vocab_size: raw.usize(&["vocab_size"])?,
        hidden_size: hidden,
        layers,
        norm_eps: raw.opt_f32(&["layer_norm_epsilon"])?.unwrap_or(1e-5),
        attention: Some(AttentionConfig {
            num_heads,
            num_kv_heads: raw.opt_usize(&["num_key_value_heads"])?.unwrap_or(num_heads),
            head_dim,
            rope_theta: None,
            qk_norm: false,
            sliding_window: None,
            scale: 1.0 / (head_dim as f32).sqrt(),
        }),
        moe: Some(MoeConfig {
            num_experts: raw.usize(&["n_routed_experts"])?,
            top_k: raw.usize(&["num_experts_per_tok"])?,
            expert_intermediate: raw.usize(&["moe_intermediate_size"])?,
            router: RouterKind::SigmoidGrouped {
                num_groups: raw.opt_usize(&["n_group"])?.unwrap_or(1),
                topk_groups: raw.opt_usize(&["topk_group"])?.unwrap_or(1),
                renormalize: raw.opt_bool(&["norm_topk_prob"])?.unwrap_or(true),
                scaling: raw.opt_f32(&["routed_scaling_factor"])?.unwrap_or(1.0),
            },
            activation: FfnActivation::Relu2,
            shared_intermediate: shared,
        }),
        mamba: Some(MambaConfig {
            num_heads: raw.usize(&["mamba_num_heads"])?,
            head_dim: raw.usize(&["mamba_head_dim"])?,
            num_groups: mamba_groups,
            state_size: raw.usize(&["ssm_state_size"])?,
            conv_kernel: raw.usize(&["conv_kernel"])?,
            conv_bias: raw.opt_bool(&["use_conv_bias"])?.unwrap_or(true),
            proj_bias: false,
            dt_min_prompt: Some(raw.opt_f32(&["time_step_min"])?.unwrap_or(0.001)),
            dt_max_prompt: None,
            norm_eps: raw.opt_f32(&["layer_norm_epsilon"])?.unwrap_or(1e-5),
            norm_groups: mamba_groups,
            chunk_size: raw.opt_usize(&["chunk_size"])?.unwrap_or(128),
        }),
        tie_word_embeddings: raw.opt_bool(&["tie_word_embeddings"])?.unwrap_or(false),
        max_position_embeddings: raw.opt_usize(&["max_position_embeddings"])?.unwrap_or(4096),
        multipliers: Multipliers::default(),
        dtype: raw.dtype(),
    })
}

pub(super) fn load(config: ModelConfig, w: &mut Loader<'_>) -> Result<Model> {
    let h = config.hidden_size;
    let eps = config.norm_eps;
    let embed = w.matrix("backbone.embeddings.weight", &[config.vocab_size, h])?;
    let (mut num_attn, mut num_mamba) = (0, 0);
    let mut layers = Vec::with_capacity(config.layers.len());
    for (l, spec) in config.layers.iter().enumerate() {
        let p = format!("backbone.layers.{l}.mixer");
        let norm = w.tensor(&format!("backbone.layers.{l}.norm.weight"), &[h])?;
        let layer = match (spec.mixer, spec.ffn) {
            (MixerKind::Attention, _) => {
                let attn = w.attention(
                    &p,
                    config.attention.as_ref().expect("attention"),
                    h,
                    num_attn,
                    eps,
                )?;
                num_attn += 1;
                Layer { mixer: Some((norm, Mixer::Attention(attn))), ffn: None }
            }
            (MixerKind::Mamba, _) => {
                let mamba = w.mamba(&p, config.mamba.as_ref().expect("mamba"), h, num_mamba)?;
                num_mamba += 1;
                Layer { mixer: Some((norm, Mixer::Mamba(mamba))), ffn: None }
            }
            (MixerKind::None, FfnKind::Moe) => {
                Layer { mixer: None, ffn: Some((norm, Ffn::Moe(moe(w, &config, &p)?))) }
            }
            (MixerKind::None, FfnKind::Dense { intermediate }) => {
                let (up, down) = (format!("{p}.up_proj.weight"), format!("{p}.down_proj.weight"));
                let mlp =
                    w.mlp([None, Some(&up), Some(&down)], FfnActivation::Relu2, h, intermediate)?;
                Layer { mixer: None, ffn: Some((norm, Ffn::Dense(mlp))) }
            }
            (MixerKind::None, FfnKind::None) => unreachable!("every Nemotron-H block has a mixer"),
        };
        layers.push(layer);
    }
    let final_norm = w.tensor("backbone.norm_f.weight", &[h])?;
    let lm_head = w.lm_head(config.tie_word_embeddings, config.vocab_size, h)?;
    Ok(Model::new(config, embed, layers, final_norm, lm_head))
}

fn moe(w: &mut Loader<'_>, config: &ModelConfig, p: &str) -> Result<crate::layers::moe::Moe> {
    let cfg = config.moe.as_ref().expect("moe");
    let h = config.hidden_size;
    let expert = |e: usize| {
        [
            None,
            Some(format!("{p}.experts.{e}.up_proj.weight")),
            Some(format!("{p}.experts.{e}.down_proj.weight")),
        ]
    };
    let mut moe = w.moe(cfg, h, &format!("{p}.gate.weight"), expert)?;
    moe.router_bias =
        Some(w.tensor(&format!("{p}.gate.e_score_correction_bias"), &[cfg.num_experts])?);
    if let Some(inter) = cfg.shared_intermediate {
        let (up, down) = (
            format!("{p}.shared_experts.up_proj.weight"),
            format!("{p}.shared_experts.down_proj.weight"),
        );
        moe.shared = Some(w.mlp([None, Some(&up), Some(&down)], FfnActivation::Relu2, h, inter)?);
    }
    Ok(moe)
}
