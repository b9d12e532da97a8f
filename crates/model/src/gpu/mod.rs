//! The model on a CUDA device (feature `cuda`): the host model's weights uploaded once, the
//! worker's pools in one arena, and the forward of a step written against the launch wrappers of
//! `routed_backend::cuda::ops`, block by block in the CPU model's order.
//!
//! * [`weights`]: the upload (bf16 matrices as stored, f32 vectors; experts stacked per layer).
//! * [`caches`]: KV blocks, Mamba live and snapshot states, the routing buffer, the step inputs,
//!   the activations, and the page-locked host buffers of a step.
//! * [`forward`]: the packed inputs the step changed uploaded in a few copies, then every block.
//! * [`logits`]: the LM head over the rows that want logits, device sampling, host rows.
//! * [`exchange`]: the expert rows between the GPUs of an expert-parallel group.
//!
//! Checked on the CUDA simulator in CI and on an H100 (`docs/gpu.md` says what runs where).

mod caches;
#[cfg(test)]
mod draw_tests;
mod exchange;
mod forward;
mod logits;
mod weights;

pub use caches::{GpuCacheShape, GpuCaches, RoutingSource};
pub use logits::LogitsOut;

use crate::{
    config::{MixerKind, ModelConfig},
    error::{ModelError, Result},
    model::Model,
};
use routed_backend::{collective::Collective, cuda::CudaDevice};
use std::sync::Arc;
use weights::GpuWeights;

/// A model's weights on a CUDA device, ready to run steps on a [`GpuCaches`].
pub struct GpuModel {
    dev: CudaDevice,
    config: ModelConfig,
    weights: GpuWeights,
    /// The expert-parallel group this rank belongs to (the host model's).
    ranks: Arc<dyn Collective>,
}

impl GpuModel {
    /// Uploads `model` (a whole model, or one rank's part of it: the rank then exchanges expert
    /// rows with the other ranks of the model's collective) to `dev`, every matrix in its
    /// storage (bf16, or f32 as the loader keeps f32 and f16 checkpoints). Refuses a layer whose
    /// experts mix the two, naming it.
    pub fn upload(model: &Model, dev: CudaDevice) -> Result<Self> {
        let weights = GpuWeights::upload(model, &dev)?;
        dev.synchronize()?;
        let ranks = model.collective().clone();
        Ok(Self { config: model.config.clone(), dev, weights, ranks })
    }

    /// Whether `model` (loaded for the same rank) can replace the weights on the device in place:
    /// the same configuration, and every tensor of the shape, storage and arithmetic of the one
    /// it would overwrite. Nothing is written.
    pub fn check_weights(&self, model: &Model) -> Result<()> {
        if let Some(message) = self.config.mismatch(&model.config) {
            return Err(ModelError::Unsupported { path: "the CUDA device".into(), message });
        }
        self.weights.check_refill(model)
    }

    /// Writes `model`'s weights over the ones on the device, in place (after
    /// [`GpuModel::check_weights`]; refused the same way): every address a launch or a captured
    /// graph holds stays valid. Returns once the copies are done. No step may run meanwhile.
    pub fn replace_weights(&mut self, model: &Model) -> Result<()> {
        self.check_weights(model)?;
        self.weights.refill(model)?;
        Ok(self.dev.synchronize()?)
    }

    /// Gives the weights' device memory back (an RL trainer colocated on the GPU takes it while
    /// it trains). Until [`GpuModel::restore_weights`] every forward fails. Returns the bytes
    /// freed (0 when already released).
    pub fn release_weights(&mut self) -> Result<usize> {
        Ok(self.weights.arena.release()?)
    }

    /// Allocates the released weights' memory again and writes `model`'s weights into it (after
    /// [`GpuModel::check_weights`]; refused the same way, and then still released). The
    /// weights' address may have changed: graphs captured before must be dropped
    /// ([`GpuCaches::drop_graphs`]).
    pub fn restore_weights(&mut self, model: &Model) -> Result<()> {
        self.check_weights(model)?;
        self.weights.arena.restore(&self.dev)?;
        self.weights.refill(model)?;
        Ok(self.dev.synchronize()?)
    }

    /// Whether the weights' memory is released.
    pub fn weights_released(&self) -> bool {
        self.weights.arena.is_released()
    }

    /// The expert-parallel group this rank belongs to.
    pub fn collective(&self) -> &Arc<dyn Collective> {
        &self.ranks
    }

    /// The normalised configuration.
    pub fn config(&self) -> &ModelConfig {
        &self.config
    }

    /// The device.
    pub fn device(&self) -> &CudaDevice {
        &self.dev
    }

    /// Device bytes of the weights.
    pub fn weight_bytes(&self) -> usize {
        self.weights.arena.num_bytes()
    }

    /// Device bytes of one KV block of `block_size` tokens (bf16 keys and values of every
    /// attention layer).
    pub fn kv_block_bytes(&self, block_size: usize) -> usize {
        let layers = self.config.layers.iter().filter(|l| l.mixer == MixerKind::Attention).count();
        let width = self.config.attention.as_ref().map_or(0, |a| a.num_kv_heads * a.head_dim);
        layers * 2 * block_size * width * size_of::<half::bf16>()
    }

    /// Device bytes the pools of `shape` take.
    pub fn caches_bytes(&self, shape: &GpuCacheShape) -> usize {
        GpuCaches::device_bytes(&self.config, &self.weights, shape)
    }

    /// Allocates the pools of `shape`, zeroed.
    pub fn new_caches(&self, shape: GpuCacheShape) -> Result<GpuCaches> {
        GpuCaches::new(&self.dev, &self.config, &self.weights, &self.ranks, shape)
    }

    /// Waits for everything queued on the compute stream; a device error surfaces here.
    pub fn synchronize(&self) -> Result<()> {
        Ok(self.dev.synchronize()?)
    }
}
