//! The CUDA device, through cudarc with dynamic loading: the binary builds and starts on machines
//! without CUDA, and only opening a device needs the driver.

use crate::BackendError;
use cudarc::driver::{CudaContext, sys};
use std::sync::Arc;

/// An opened CUDA device: its primary context.
#[derive(Clone, Debug)]
pub struct CudaDevice {
    ctx: Arc<CudaContext>,
    ordinal: usize,
    name: String,
}

impl CudaDevice {
    /// Opens device `ordinal`. Checks that the driver library is present before the first driver
    /// call, because cudarc panics when it cannot load it.
    pub fn open(ordinal: usize) -> Result<Self, BackendError> {
        // SAFETY: only probes whether the shared library can be loaded.
        if !unsafe { sys::is_culib_present() } {
            return Err(BackendError::NoCudaDriver);
        }
        let count = CudaContext::device_count().map_err(|e| BackendError::Driver(e.to_string()))?;
        if ordinal >= count as usize {
            return Err(BackendError::NoSuchDevice { ordinal, count: count as usize });
        }
        let ctx = CudaContext::new(ordinal).map_err(|e| BackendError::Driver(e.to_string()))?;
        let name = ctx.name().map_err(|e| BackendError::Driver(e.to_string()))?;
        Ok(Self { ctx, ordinal, name })
    }

    /// The device ordinal.
    pub fn ordinal(&self) -> usize {
        self.ordinal
    }

    /// The device's marketing name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The primary context, for the CUDA kernels.
    pub fn context(&self) -> &Arc<CudaContext> {
        &self.ctx
    }
}
