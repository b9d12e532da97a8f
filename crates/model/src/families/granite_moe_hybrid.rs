//! Granite 4.0-H (`GraniteMoeHybridForCausalLM`): Llama-style pre-norm layers whose mixer is
//! Mamba2 or attention (`layer_types`), and whose feed-forward block is a MoE plus a shared SwiGLU
//! MLP in every layer. Routing is top-k of the raw logits, then softmax over those k.
//!
//! The Mamba gated RMSNorm normalises per group of `d_inner / mamba_n_groups` channels.
//!
//! muP multipliers: the embeddings are scaled, each residual branch is scaled before it is added,
//! attention uses `attention_multiplier` as its scale, and logits are divided by
//! `logits_scaling`. Expert weights are fused on disk (`input_linear` is `[E, 2I, H]`, gate rows
//! first).

use super::Loader;
use crate::{
    config::{
        Architecture, AttentionConfig, FfnActivation, FfnKind, LayerSpec, MambaConfig, MixerKind,
        ModelConfig, MoeConfig, Multipliers, RawConfig, RouterKind,
    },
    error::Result,
    layers::{mlp::Mlp, moe::Moe},
    model::{Ffn, Layer, Mixer, Model},
};
use routed_backend::cpu::Matrix;

pub(super) fn config(raw: &RawConfig) -> Result<ModelConfig> {
    let hidden = raw.usize(&["hidden_size"])?;
    let kinds = raw
        .get(&["layer_types"])
        .and_then(|v| v.as_array())
        .ok_or_else(|| raw.error("missing `layer_types`"))?;
    let layers = kinds
        .iter()
        .map(|v| match v.as_str() {
            Some("mamba" | "linear_attention") => {
                Ok(LayerSpec { mixer: MixerKind::Mamba, ffn: FfnKind::Moe })
            }
            Some("attention" | "full_attention") => {
                Ok(LayerSpec { mixer: MixerKind::Attention, ffn: FfnKind::Moe })
            }
            _ => Err(raw.error(format!("unknown entry {v} in `layer_types`"))),
        })
        .collect::<Result<Vec<_>>>()?;
    let num_heads = raw.usize(&["num_attention_heads"])?;
    let head_dim = hidden / num_heads;
    let rope_theta = match raw.opt_str(&["position_embedding_type"]).unwrap_or("rope") {
        "rope" => Some(raw.rope_theta()?.unwrap_or(10_000.0)),
        "nope" => None,
        other => return Err(raw.unsupported(format!("position_embedding_type {other:?}"))),
    };
    if raw.opt_bool(&["mamba_proj_bias"])?.unwrap_or(false)
        || raw.opt_bool(&["attention_bias"])?.unwrap_or(false)
    {
        return Err(raw.unsupported("projection biases"));
    }
    let (dt_min, dt_max) = time_step_limit(raw)?;
    let eps = raw.opt_f32(&["rms_norm_eps"])?.unwrap_or(1e-6);
    Ok(ModelConfig {
        architecture: Architecture::GraniteMoeHybrid,
        vocab_size: raw.usize(&["vocab_size"])?,
        hidden_size: hidden,
        layers,
        norm_eps: eps,
        attention: Some(AttentionConfig {
            num_heads,
            num_kv_heads: raw.opt_usize(&["num_key_value_heads"])?.unwrap_or(num_heads),
            head_dim,
            rope_theta,
            qk_norm: false,
            sliding_window: None,
            scale: raw
                .opt_f32(&["attention_multiplier"])?
                .unwrap_or(1.0 / (head_dim as f32).sqrt()),
        }),
        moe: Some(MoeConfig {
            num_experts: raw.usize(&["num_local_experts"])?,
            top_k: raw.usize(&["num_experts_per_tok"])?,
            expert_intermediate: raw.usize(&["intermediate_size"])?,
            router: RouterKind::TopKSoftmax,
            activation: FfnActivation::SwiGlu,
            shared_intermediate: raw.opt_usize(&["shared_intermediate_size"])?.filter(|&s| s > 0),
        }),
        mamba: Some(MambaConfig {
            num_heads: raw.usize(&["mamba_n_heads"])?,
            head_dim: raw.usize(&["mamba_d_head"])?,
            num_groups: raw.usize(&["mamba_n_groups"])?,
            state_size: raw.usize(&["mamba_d_state"])?,
            conv_kernel: raw.usize(&["mamba_d_conv"])?,
            conv_bias: raw.opt_bool(&["mamba_conv_bias"])?.unwrap_or(true),
            proj_bias: false,
            dt_min_prompt: dt_min,
            dt_max_prompt: dt_max,
            norm_eps: eps,
            norm_groups: raw.usize(&["mamba_n_groups"])?,
            chunk_size: raw.opt_usize(&["mamba_chunk_size"])?.unwrap_or(256),
        }),
        tie_word_embeddings: raw.opt_bool(&["tie_word_embeddings"])?.unwrap_or(false),
        max_position_embeddings: raw.opt_usize(&["max_position_embeddings"])?.unwrap_or(4096),
        multipliers: Multipliers {
            embedding: raw.opt_f32(&["embedding_multiplier"])?.unwrap_or(1.0),
            residual: raw.opt_f32(&["residual_multiplier"])?.unwrap_or(1.0),
            logits_scaling: raw.opt_f32(&["logits_scaling"])?.unwrap_or(1.0),
        },
        dtype: raw.dtype(),
    })
}

/// `time_step_limit` as prompt-position clamps; the default `(0, inf)` clamps nothing (`dt` is a
/// softplus, never negative), so it becomes no clamp at all.
fn time_step_limit(raw: &RawConfig) -> Result<(Option<f32>, Option<f32>)> {
    let Some(v) = raw.get(&["time_step_limit"]) else { return Ok((None, None)) };
    let pair = RawConfig::from_value(
        raw.path().to_owned(),
        serde_json::json!({"lo": v.get(0), "hi": v.get(1)}),
    );
    let lo = pair.opt_f32(&["lo"])?.filter(|&x| x > 0.0);
    let hi = pair.opt_f32(&["hi"])?.filter(|x| x.is_finite());
    Ok((lo, hi))
}

pub(super) fn load(config: ModelConfig, w: &mut Loader<'_>) -> Result<Model> {
    let h = config.hidden_size;
    let eps = config.norm_eps;
    let embed = w.matrix("model.embed_tokens.weight", &[config.vocab_size, h])?;
    let (mut num_attn, mut num_mamba) = (0, 0);
    let mut layers = Vec::with_capacity(config.layers.len());
    for (l, spec) in config.layers.iter().enumerate() {
        let p = format!("model.layers.{l}");
        let mixer = match spec.mixer {
            MixerKind::Attention => {
                num_attn += 1;
                let cfg = config.attention.as_ref().expect("attention");
                Mixer::Attention(w.attention(
                    &format!("{p}.self_attn"),
                    cfg,
                    h,
                    num_attn - 1,
                    eps,
                )?)
            }
            _ => {
                num_mamba += 1;
                Mixer::Mamba(w.mamba(
                    &format!("{p}.mamba"),
                    config.mamba.as_ref().expect("mamba"),
                    h,
                    num_mamba - 1,
                )?)
            }
        };
        let input_norm = w.tensor(&format!("{p}.input_layernorm.weight"), &[h])?;
        let post_norm = w.tensor(&format!("{p}.post_attention_layernorm.weight"), &[h])?;
        layers.push(Layer {
            mixer: Some((input_norm, mixer)),
            ffn: Some((post_norm, Ffn::Moe(moe(w, &config, &p)?))),
        });
    }
    let final_norm = w.tensor("model.norm.weight", &[h])?;
    let lm_head = w.lm_head(config.tie_word_embeddings, config.vocab_size, h)?;
    Ok(Model::new(config, embed, layers, final_norm, lm_head))
}

/// A SwiGLU MLP from rows `[at, at + 2 * inter)` of a fused input matrix (gate rows first) and
/// its down projection.
fn split_swiglu(fused: &Matrix, at: usize, down: Matrix, hidden: usize, inter: usize) -> Mlp {
    let (gate, up) =
        (fused.slice_rows(at..at + inter), fused.slice_rows(at + inter..at + 2 * inter));
    Mlp { activation: FfnActivation::SwiGlu, gate: Some(gate), up, down, hidden, inter }
}

fn moe(w: &mut Loader<'_>, config: &ModelConfig, p: &str) -> Result<Moe> {
    let cfg = config.moe.clone().expect("moe");
    let (h, e, i) = (config.hidden_size, cfg.num_experts, cfg.expert_intermediate);
    let router = w.matrix(&format!("{p}.block_sparse_moe.router.layer.weight"), &[e, h])?;
    // Fused on disk: `input_linear` is [E, 2I, H] (gate rows first), `output_linear` [E, H, I];
    // only this rank's experts are read.
    let local = w.local_experts(e);
    let input = w.matrix_slice(
        &format!("{p}.block_sparse_moe.input_linear.weight"),
        &[e, 2 * i, h],
        local.clone(),
    )?;
    let output = w.matrix_slice(
        &format!("{p}.block_sparse_moe.output_linear.weight"),
        &[e, h, i],
        local.clone(),
    )?;
    let experts = (0..local.len())
        .map(|x| split_swiglu(&input, x * 2 * i, output.slice_rows(x * h..(x + 1) * h), h, i))
        .collect();
    let shared = match cfg.shared_intermediate {
        Some(s) => {
            let fused = w.matrix(&format!("{p}.shared_mlp.input_linear.weight"), &[2 * s, h])?;
            let down = w.matrix(&format!("{p}.shared_mlp.output_linear.weight"), &[h, s])?;
            Some(split_swiglu(&fused, 0, down, h, s))
        }
        None => None,
    };
    Ok(Moe { cfg, router, router_bias: None, local, experts, shared, hidden: h })
}
