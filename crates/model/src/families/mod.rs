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
    error::{ModelError, Result},
    layers::{attention::Attention, mamba::Mamba, mlp::Mlp, moe::Moe},
    model::Model,
    shard::{ExpertShard, LoadStats},
    weights::Weights,
};
use routed_backend::cpu::Matrix;
use std::ops::Range;

/// Normalises a raw config for `arch`.
pub(crate) fn config_for(arch: Architecture, raw: &RawConfig) -> Result<ModelConfig> {
    match arch {
        Architecture::Qwen3Moe => qwen3_moe::config(raw),
        Architecture::Mixtral => mixtral::config(raw),
        Architecture::NemotronH => nemotron_h::config(raw),
        Architecture::GraniteMoeHybrid => granite_moe_hybrid::config(raw),
    }
}

/// Builds `shard`'s part of the model for `config` from `weights`, reporting progress as
/// `(tensors loaded, total)`.
pub(crate) fn load(
    config: ModelConfig,
    weights: &Weights,
    shard: ExpertShard,
    progress: &mut dyn FnMut(usize, usize),
) -> Result<Model> {
    check_shard(&config, shard)?;
    let mut loader = Loader {
        weights,
        shard,
        done: 0,
        total: weights.len(),
        stats: LoadStats::default(),
        progress,
    };
    let mut model = match config.architecture {
        Architecture::Qwen3Moe | Architecture::Mixtral => qwen3_moe::load(config, &mut loader),
        Architecture::NemotronH => nemotron_h::load(config, &mut loader),
        Architecture::GraniteMoeHybrid => granite_moe_hybrid::load(config, &mut loader),
    }?;
    // A rank skips other ranks' experts, so its count stops short of the checkpoint's.
    (loader.progress)(loader.done, loader.done);
    model.shard = shard;
    model.load_stats = loader.stats;
    Ok(model)
}

/// Experts split evenly: every rank must hold the same number of each layer's experts.
fn check_shard(config: &ModelConfig, shard: ExpertShard) -> Result<()> {
    let n = shard.num_ranks;
    let bad = |message: String| Err(ModelError::ExpertParallel { message });
    if n == 0 || shard.rank >= n {
        return bad(format!("rank {} of an expert-parallel group of {n}", shard.rank));
    }
    match &config.moe {
        _ if n == 1 => Ok(()),
        None => bad(format!("expert parallel size {n}, but the model has no MoE layers")),
        Some(moe) if !moe.num_experts.is_multiple_of(n) => bad(format!(
            "the model's {} experts per MoE layer cannot be split evenly over an expert parallel \
             size of {n}",
            moe.num_experts
        )),
        Some(_) => Ok(()),
    }
}

/// Reads tensors with their expected shapes, counts what it read and reports progress.
pub(crate) struct Loader<'a> {
    weights: &'a Weights,
    shard: ExpertShard,
    done: usize,
    total: usize,
    stats: LoadStats,
    progress: &'a mut dyn FnMut(usize, usize),
}

impl Loader<'_> {
    /// A tensor of exactly `shape`.
    pub fn tensor(&mut self, name: &str, shape: &[usize]) -> Result<Vec<f32>> {
        let t = self.weights.f32(name, shape)?;
        self.count(name, 1, 1);
        Ok(t)
    }

    /// A weight matrix of exactly `shape` (see [`Weights::matrix`]).
    pub fn matrix(&mut self, name: &str, shape: &[usize]) -> Result<Matrix> {
        let t = self.weights.matrix(name, shape)?;
        self.count(name, 1, 1);
        Ok(t)
    }

    /// Entries `leading` of the first dimension of a tensor of exactly `shape`, as a matrix (see
    /// [`Weights::matrix_slice`]).
    pub fn matrix_slice(
        &mut self,
        name: &str,
        shape: &[usize],
        leading: Range<usize>,
    ) -> Result<Matrix> {
        let t = self.weights.matrix_slice(name, shape, leading.clone())?;
        self.count(name, leading.len(), shape[0]);
        Ok(t)
    }

    /// The experts this rank holds, out of `num_experts`.
    pub fn local_experts(&self, num_experts: usize) -> Range<usize> {
        self.shard.experts(num_experts)
    }

    /// Records that `part / whole` of tensor `name` was read.
    fn count(&mut self, name: &str, part: usize, whole: usize) {
        let bytes = self.weights.num_bytes(name).unwrap_or(0);
        self.stats.num_tensors += 1;
        self.stats.num_bytes += bytes / whole.max(1) * part;
        self.done += 1;
        (self.progress)(self.done.min(self.total), self.total);
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

    /// A MoE block whose experts' tensor names are given by `expert(e)`; only this rank's
    /// experts are read.
    pub fn moe(
        &mut self,
        cfg: &MoeConfig,
        hidden: usize,
        router: &str,
        expert: impl Fn(usize) -> [Option<String>; 3],
    ) -> Result<Moe> {
        let router = self.matrix(router, &[cfg.num_experts, hidden])?;
        let local = self.local_experts(cfg.num_experts);
        let experts = local
            .clone()
            .map(|e| {
                let names = expert(e);
                let [g, u, d] = [names[0].as_deref(), names[1].as_deref(), names[2].as_deref()];
                self.mlp([g, u, d], cfg.activation, hidden, cfg.expert_intermediate)
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(Moe {
            cfg: cfg.clone(),
            router,
            router_bias: None,
            local,
            experts,
            shared: None,
            hidden,
        })
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
