//! Stand-in for the CUDA device when `routed` is built without the `cuda` feature. It has the
//! same surface as the real module, and opening a device always fails with
//! [`BackendError::CudaNotCompiled`], so call sites need no `cfg`.

use crate::BackendError;

/// A CUDA device. Never constructed in a build without CUDA.
#[derive(Clone, Debug)]
pub struct CudaDevice {
    never: std::convert::Infallible,
}

impl CudaDevice {
    /// Always fails: this build has no CUDA support.
    pub fn open(_ordinal: usize) -> Result<Self, BackendError> {
        Err(BackendError::CudaNotCompiled)
    }

    /// Always fails: this build has no CUDA support, so no simulator either.
    pub fn simulated() -> Result<Self, BackendError> {
        Err(BackendError::CudaNotCompiled)
    }

    /// Never called: no device exists in this build.
    pub fn simulated_peer(&self) -> Result<Self, BackendError> {
        match self.never {}
    }

    /// Never links: no device exists in this build.
    pub fn link_peers(_devices: &[Self]) -> Result<bool, BackendError> {
        Ok(false)
    }

    /// Never true: no device exists in this build.
    pub fn is_simulated(&self) -> bool {
        match self.never {}
    }

    /// The device ordinal.
    pub fn ordinal(&self) -> usize {
        match self.never {}
    }

    /// The device's marketing name.
    pub fn name(&self) -> &str {
        match self.never {}
    }

    /// The architecture name.
    pub fn arch(&self) -> &str {
        match self.never {}
    }

    /// Whether it has bf16 tensor cores.
    pub fn has_bf16_mma(&self) -> bool {
        match self.never {}
    }
}
