//! Hugging Face checkpoints and the model families of `routed`.
//!
//! * [`ModelConfig`] normalises `config.json` in both key styles;
//! * [`Weights`] memory-maps safetensors shards;
//! * [`Tokenizer`] wraps `tokenizer.json`, the chat template and the EOS ids;
//! * [`Model::forward`] runs a ragged batch (prefill chunks and decode tokens together) over the
//!   paged [`KvCache`], writing every MoE layer's expert choices into a [`RoutingBuffer`];
//! * [`Sampler`] picks tokens.
//!
//! A model does not know it is driven by actors: it takes ids and block tables and returns logits.

mod batch;
mod config;
mod error;
mod families;
mod kv;
mod layers;
mod model;
mod sampling;
mod state;
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
pub use routed_types::SampledToken;
pub use sampling::Sampler;
pub use state::StateCache;
pub use tokenizer::{ChatMessage, Tokenizer};
pub use weights::{Weights, streamed_vec};

use std::path::Path;

impl Model {
    /// Loads the model in checkpoint directory `dir` (config and weights), reporting progress as
    /// `(tensors loaded, total tensors)`.
    pub fn load(dir: &Path, progress: &mut dyn FnMut(usize, usize)) -> Result<Self> {
        let config = ModelConfig::from_dir(dir)?;
        let weights = Weights::open(dir)?;
        families::load(config, &weights, progress)
    }

    /// Loads a model from an explicit config file (e.g. a transformers 5 `config.v5.json`) and the
    /// weights in `dir`.
    pub fn load_with_config(dir: &Path, config_file: &Path) -> Result<Self> {
        let config = ModelConfig::from_file(config_file)?;
        families::load(config, &Weights::open(dir)?, &mut |_, _| {})
    }
}
