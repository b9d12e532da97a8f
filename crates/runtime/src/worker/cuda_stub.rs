//! Stand-in for the CUDA worker in a build without the `cuda` feature: the same surface, and no
//! way to make one (the device it needs cannot be opened in such a build), so call sites need no
//! `cfg`.

use super::{CacheShape, CudaLimits, ExecutedStep, LockstepId, Worker, WorkerError};
use crate::{MemoryTags, routing_ring::CopyEngine};
use routed_backend::{BackendError, cuda::CudaDevice};
use routed_model::{Model, ModelConfig};
use routed_types::{RoutingMeta, StepPlan};
use std::{convert::Infallible, path::Path, sync::Arc};

/// A model rank on a CUDA device. Never constructed in a build without CUDA.
pub struct CudaWorker {
    never: Infallible,
}

impl CudaWorker {
    /// Always fails: this build has no CUDA support.
    pub fn new(_dev: CudaDevice, _model: &Model, _limits: CudaLimits) -> Result<Self, WorkerError> {
        Err(BackendError::CudaNotCompiled.into())
    }
}

impl Worker for CudaWorker {
    fn device(&self) -> String {
        match self.never {}
    }

    fn rank(&self) -> usize {
        match self.never {}
    }

    fn config(&self) -> &ModelConfig {
        match self.never {}
    }

    fn routing_meta(&self) -> Option<RoutingMeta> {
        match self.never {}
    }

    fn weight_bytes_per_token(&self) -> usize {
        match self.never {}
    }

    fn kv_block_bytes(&self, _block_size: usize) -> usize {
        match self.never {}
    }

    fn initialize_cache(&mut self, _shape: &CacheShape) -> Result<(), WorkerError> {
        match self.never {}
    }

    fn routing_engine(&self) -> Option<Arc<dyn CopyEngine>> {
        match self.never {}
    }

    fn execute(
        &mut self,
        _plan: &StepPlan,
        _unit: LockstepId,
    ) -> Result<ExecutedStep, WorkerError> {
        match self.never {}
    }

    fn dummy_forward(&mut self, _unit: LockstepId) -> Result<(), WorkerError> {
        match self.never {}
    }

    fn abort(&self, _unit: LockstepId) {
        match self.never {}
    }

    fn stage_weights(&mut self, _dir: &Path) -> Result<(), WorkerError> {
        match self.never {}
    }

    fn commit_weights(&mut self) -> Result<(), WorkerError> {
        match self.never {}
    }

    fn discard_weights(&mut self) {
        match self.never {}
    }

    fn release_memory(&mut self, _tags: MemoryTags) -> Result<usize, WorkerError> {
        match self.never {}
    }

    fn resume_memory(&mut self, _tags: MemoryTags, _dir: &Path) -> Result<usize, WorkerError> {
        match self.never {}
    }
}
