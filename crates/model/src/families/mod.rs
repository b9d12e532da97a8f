//! Model families: each maps its Hugging Face config keys and tensor names onto the shared
//! building blocks. Adding a family means one file here and a line in each `match` below.

mod granite_moe_hybrid;
mod mixtral;
mod nemotron_h;
mod qwen3_moe;

use crate::{
    config::{
        Architecture, AttentionConfig, FfnActivation, MambaConfig, ModelConfig, MoeConfig,
        RawConfig,
    },
    error::Result,
    layers::{attention::Attention, mamba::Mamba, mlp::Mlp, moe::Moe},
    model::Model,
    weights::Weights,
};
use routed_backend::cpu::Matrix;

/// Normalises a raw config for `arch`.
pub(crate) fn config_for(arch: Architecture, raw: &RawConfig) -> Result<ModelConfig> {
    match arch {
        Architecture::Qwen3Moe => qwen3_moe::config(raw),
        Architecture::Mixtral => mixtral::config(raw),
        Architecture::NemotronH => nemotron_h::config(raw),
        Architecture::GraniteMoeHybrid => granite_moe_hybrid::config(raw),
    }
}

/// Builds the model for `config` from `weights`, reporting progress as `(tensors loaded, total)`.
pub(crate) fn load(
    config: ModelConfig,
    weights: &Weights,
    progress: &mut dyn FnMut(usize, usize),
) -> Result<Model> {
    let mut loader = Loader { weights, done: 0, total: weights.len(), progress };
    match config.architecture {
        Architecture::Qwen3Moe | Architecture::Mixtral => qwen3_moe::load(config, &mut loader),
        Architecture::NemotronH => nemotron_h::load(config, &mut loader),
        Architecture::GraniteMoeHybrid => granite_moe_hybrid::load(config, &mut loader),
    }
}

/// Reads tensors with their expected shapes and reports progress.
pub(crate) struct Loader<'a> {
    weights: &'a Weights,
    done: usize,
    total: usize,
    progress: &'a mut dyn FnMut(usize, usize),
}

impl Loader<'_> {
    /// A tensor of exactly `shape`.
    pub fn tensor(&mut self, name: &str, shape: &[usize]) -> Result<Vec<f32>> {
        let t = self.weights.f32(name, shape)?;
        self.done += 1;
        (self.progress)(self.done.min(self.total), self.total);
        Ok(t)
    }

    /// A weight matrix of exactly `shape` (see [`Weights::matrix`]).
    pub fn matrix(&mut self, name: &str, shape: &[usize]) -> Result<Matrix> {
        let t = self.weights.matrix(name, shape)?;
        self.done += 1;
        (self.progress)(self.done.min(self.total), self.total);
        Ok(t)
    }

    /// Whether the checkpoint has `name`.
    pub fn has(&self, name: &str) -> bool {
        self.weights.contains(name)
    }

    /// The LM head, or `None` when tied to the embedding.
    pub fn lm_head(&mut self, tied: bool, vocab: usize, hidden: usize) -> Result<Option<Matrix>> {
        if tied && !self.has("lm_head.weight") {
            return Ok(None);
        }
        self.matrix("lm_head.weight", &[vocab, hidden]).map(Some)
    }

    /// Llama-style attention under `prefix` (`{prefix}.q_proj.weight`, ...).
    pub fn attention(
        &mut self,
        prefix: &str,
        cfg: &AttentionConfig,
        hidden: usize,
        kv_index: usize,
        eps: f32,
    ) -> Result<Attention> {
        let (nh, nkv, hd) = (cfg.num_heads, cfg.num_kv_heads, cfg.head_dim);
        let (q_norm, k_norm) = if cfg.qk_norm {
            (
                Some(self.tensor(&format!("{prefix}.q_norm.weight"), &[hd])?),
                Some(self.tensor(&format!("{prefix}.k_norm.weight"), &[hd])?),
            )
        } else {
            (None, None)
        };
        Ok(Attention {
            cfg: cfg.clone(),
            kv_index,
            q_proj: self.matrix(&format!("{prefix}.q_proj.weight"), &[nh * hd, hidden])?,
            k_proj: self.matrix(&format!("{prefix}.k_proj.weight"), &[nkv * hd, hidden])?,
            v_proj: self.matrix(&format!("{prefix}.v_proj.weight"), &[nkv * hd, hidden])?,
            o_proj: self.matrix(&format!("{prefix}.o_proj.weight"), &[hidden, nh * hd])?,
            q_norm,
            k_norm,
            norm_eps: eps,
        })
    }

    /// A feed-forward block with the given tensor names (`gate` is `None` for squared ReLU).
    pub fn mlp(
        &mut self,
        names: [Option<&str>; 3],
        activation: FfnActivation,
        hidden: usize,
        inter: usize,
    ) -> Result<Mlp> {
        let [gate, up, down] = names;
        let gate = match gate {
            Some(name) => Some(self.matrix(name, &[inter, hidden])?),
            None => None,
        };
        Ok(Mlp {
            activation,
            gate,
            up: self.matrix(up.expect("every MLP has an up projection"), &[inter, hidden])?,
            down: self.matrix(down.expect("every MLP has a down projection"), &[hidden, inter])?,
            hidden,
            inter,
        })
    }

    /// A Mamba2 mixer under `prefix` (`{prefix}.in_proj.weight`, ...); `index` is its place among
    /// the model's Mamba layers.
    pub fn mamba(
        &mut self,
        prefix: &str,
        cfg: &MambaConfig,
        hidden: usize,
        index: usize,
    ) -> Result<Mamba> {
        let (d_inner, conv_dim, nh, k) =
            (cfg.d_inner(), cfg.conv_dim(), cfg.num_heads, cfg.conv_kernel);
        let proj_dim = d_inner + conv_dim + nh;
        let a_log = self.tensor(&format!("{prefix}.A_log"), &[nh])?;
        Ok(Mamba {
            cfg: cfg.clone(),
            index,
            in_proj: self.matrix(&format!("{prefix}.in_proj.weight"), &[proj_dim, hidden])?,
            conv_weight_t: transpose(
                &self.tensor(&format!("{prefix}.conv1d.weight"), &[conv_dim, 1, k])?,
                conv_dim,
                k,
            ),
            conv_bias: match cfg.conv_bias {
                true => Some(self.tensor(&format!("{prefix}.conv1d.bias"), &[conv_dim])?),
                false => None,
            },
            dt_bias: self.tensor(&format!("{prefix}.dt_bias"), &[nh])?,
            a: a_log.iter().map(|x| -x.exp()).collect(),
            d: self.tensor(&format!("{prefix}.D"), &[nh])?,
            norm: self.tensor(&format!("{prefix}.norm.weight"), &[d_inner])?,
            norm_groups: cfg.norm_groups,
            out_proj: self.matrix(&format!("{prefix}.out_proj.weight"), &[hidden, d_inner])?,
        })
    }

    /// A MoE block whose experts' tensor names are given by `expert(e)`.
    pub fn moe(
        &mut self,
        cfg: &MoeConfig,
        hidden: usize,
        router: &str,
        expert: impl Fn(usize) -> [Option<String>; 3],
    ) -> Result<Moe> {
        let router = self.matrix(router, &[cfg.num_experts, hidden])?;
        let experts = (0..cfg.num_experts)
            .map(|e| {
                let names = expert(e);
                let [g, u, d] = [names[0].as_deref(), names[1].as_deref(), names[2].as_deref()];
                self.mlp([g, u, d], cfg.activation, hidden, cfg.expert_intermediate)
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(Moe { cfg: cfg.clone(), router, router_bias: None, experts, shared: None, hidden })
    }
}

/// `[rows, cols]` to `[cols, rows]`.
fn transpose(x: &[f32], rows: usize, cols: usize) -> Vec<f32> {
    let mut out = vec![0.0; x.len()];
    for (r, row) in x.chunks_exact(cols).enumerate() {
        for (c, &v) in row.iter().enumerate() {
            out[c * rows + r] = v;
        }
    }
    out
}
