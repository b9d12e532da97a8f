//! Hugging Face checkpoints and the model families of `routed`.
//!
//! * [`ModelConfig`] normalises `config.json` in both key styles;
//! * [`Weights`] memory-maps safetensors shards;
//! * [`Tokenizer`] wraps `tokenizer.json`, the chat template and the EOS ids;
//! * [`Model::forward`] runs a ragged batch (prefill chunks and decode tokens together) over the
//!   paged [`KvCache`], writing every MoE layer's expert choices into a [`RoutingBuffer`];
//! * [`Sampler`] picks tokens;
//! * `gpu` (feature `cuda`) runs the same model on a CUDA device.
//!
//! A model does not know it is driven by actors: it takes ids and block tables and returns logits.

mod batch;
mod config;
mod config_checks;
mod error;
mod families;
#[cfg(feature = "cuda")]
pub mod gpu;
mod kv;
mod layers;
mod model;
mod sampling;
mod shard;
mod state;
mod token_bound;
mod token_bytes;
mod tokenizer;
mod weights;
mod workspace;

pub use batch::{ForwardOutput, LiveStateId, LogitsWanted, RoutingBuffer, SeqInput, StateIo};
pub use config::{
    Architecture, AttentionConfig, FfnActivation, FfnKind, LayerSpec, MambaConfig, MixerKind,
    ModelConfig, MoeConfig, Multipliers, RawConfig, RouterKind,
};
pub use error::{ModelError, Result};
pub use kv::KvCache;
pub use model::Model;
pub use routed_backend::cpu::MatmulPrecision;
pub use routed_backend::cpu::streamed_vec;
pub use routed_types::SampledToken;
pub use sampling::Sampler;
pub use shard::{ExpertShard, LoadStats};
pub use state::StateCache;
pub use tokenizer::{ChatMessage, ChatTemplateArgs, Tokenizer};
pub use weights::Weights;

use routed_backend::collective::{Collective, SingleRank};
use std::{path::Path, sync::Arc};

impl Model {
    /// Loads the model in checkpoint directory `dir` (config and weights), reporting progress as
    /// `(tensors loaded, total tensors)`.
    pub fn load(dir: &Path, progress: &mut dyn FnMut(usize, usize)) -> Result<Self> {
        Self::load_rank(dir, Arc::new(SingleRank), progress)
    }

    /// Loads one rank's part of the model in `dir` for an expert-parallel group: the rank's slice
    /// of every MoE layer's experts (other ranks' expert tensors are never read) and everything
    /// else whole. `ranks` is how this rank exchanges expert outputs with the others; the rank and
    /// group size come from it. Fails, naming both numbers, when the group size does not divide
    /// the number of experts.
    pub fn load_rank(
        dir: &Path,
        ranks: Arc<dyn Collective>,
        progress: &mut dyn FnMut(usize, usize),
    ) -> Result<Self> {
        let config = ModelConfig::from_dir(dir)?;
        let weights = Weights::open(dir)?;
        let shard = ExpertShard { rank: ranks.rank(), num_ranks: ranks.world_size() };
        let mut model = families::load(config, &weights, shard, progress)?;
        model.collective = ranks;
        Ok(model)
    }

    /// Loads a model from an explicit config file (e.g. a transformers 5 `config.v5.json`) and the
    /// weights in `dir`.
    pub fn load_with_config(dir: &Path, config_file: &Path) -> Result<Self> {
        let config = ModelConfig::from_file(config_file)?;
        families::load(config, &Weights::open(dir)?, ExpertShard::WHOLE, &mut |_, _| {})
    }
}
