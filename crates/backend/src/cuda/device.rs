//! Opening a CUDA device: every failure an error, never a panic.
//!
//! Order matters: the libraries and the driver version are probed before cudarc's first call
//! (cudarc panics on a missing library or symbol); event tracking is switched off before any
//! stream or allocation exists (cudarc only applies the switch to buffers created after it, and
//! with tracking on every launch would record and wait on events, which also breaks graph
//! capture); then the compute and copy streams are made and every kernel is compiled (or read
//! from the cache) and loaded.

use super::{
    compile::{self, Arch},
    libs::{self, CudaLibrary},
    source::{KernelId, UNITS},
};
use crate::BackendError;
use cudarc::driver::{CudaContext, CudaFunction, CudaStream};
use rayon::prelude::*;
use std::sync::Arc;

/// An opened CUDA device: its primary context, a compute stream, a copy stream and the loaded
/// kernels. Cheap to clone.
#[derive(Clone)]
pub struct CudaDevice {
    inner: Arc<Inner>,
}

struct Inner {
    ctx: Arc<CudaContext>,
    compute: Arc<CudaStream>,
    copy: Arc<CudaStream>,
    ordinal: usize,
    name: String,
    arch: Arch,
    driver_version: i32,
    /// Indexed by [`KernelId::index`].
    kernels: Vec<CudaFunction>,
}

impl std::fmt::Debug for CudaDevice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CudaDevice")
            .field("ordinal", &self.inner.ordinal)
            .field("name", &self.inner.name)
            .field("arch", &self.inner.arch)
            .field("driver_version", &self.inner.driver_version)
            .finish()
    }
}

pub(crate) fn driver_err(e: cudarc::driver::DriverError) -> BackendError {
    BackendError::Driver(e.to_string())
}

impl CudaDevice {
    /// Opens device `ordinal`: probes the driver (present, version at least
    /// [`libs::MIN_DRIVER_VERSION`]) and NVRTC, checks the ordinal, creates the streams with event
    /// tracking off, and compiles and loads every kernel.
    pub fn open(ordinal: usize) -> Result<Self, BackendError> {
        let driver_version = libs::check_driver()?;
        CudaLibrary::Nvrtc.require()?;
        let count = CudaContext::device_count().map_err(driver_err)? as usize;
        if ordinal >= count {
            return Err(BackendError::NoSuchDevice { ordinal, count });
        }
        let ctx = CudaContext::new(ordinal).map_err(driver_err)?;
        // SAFETY: nothing has been allocated in this context by us yet, and the backend records
        // its own events where it needs ordering between streams.
        unsafe { ctx.disable_event_tracking() };
        let compute = ctx.new_stream().map_err(driver_err)?;
        let copy = ctx.new_stream().map_err(driver_err)?;
        let name = ctx.name().map_err(driver_err)?;
        let (major, minor) = ctx.compute_capability().map_err(driver_err)?;
        let arch = Arch::from_capability(major, minor);
        let kernels = load_kernels(&ctx, &arch)?;
        let inner = Inner { ctx, compute, copy, ordinal, name, arch, driver_version, kernels };
        Ok(Self { inner: Arc::new(inner) })
    }

    /// The device ordinal.
    pub fn ordinal(&self) -> usize {
        self.inner.ordinal
    }

    /// The device's marketing name.
    pub fn name(&self) -> &str {
        &self.inner.name
    }

    /// The architecture the kernels were compiled for (`sm_90` on an H100).
    pub fn arch(&self) -> &str {
        self.inner.arch.as_str()
    }

    /// The driver's CUDA version (`13000` for 13.0).
    pub fn driver_version(&self) -> i32 {
        self.inner.driver_version
    }

    /// The primary context.
    pub fn context(&self) -> &Arc<CudaContext> {
        &self.inner.ctx
    }

    /// The stream every kernel runs on.
    pub fn compute_stream(&self) -> &Arc<CudaStream> {
        &self.inner.compute
    }

    /// The stream of device-to-host copies that overlap the next step (routing rows).
    pub fn copy_stream(&self) -> &Arc<CudaStream> {
        &self.inner.copy
    }

    /// A new event without timing, for ordering work between the streams (recorded on one,
    /// waited on by the other) or waiting for it on the host.
    pub fn new_event(&self) -> Result<cudarc::driver::CudaEvent, BackendError> {
        self.inner.ctx.new_event(None).map_err(driver_err)
    }

    /// Waits for everything queued on the compute stream.
    pub fn synchronize(&self) -> Result<(), BackendError> {
        self.inner.compute.synchronize().map_err(driver_err)
    }

    /// The loaded kernel `id`.
    pub(crate) fn kernel(&self, id: KernelId) -> &CudaFunction {
        &self.inner.kernels[id.index()]
    }
}

/// Compiles every unit (in parallel; NVRTC programs are independent) and loads the modules.
fn load_kernels(ctx: &Arc<CudaContext>, arch: &Arch) -> Result<Vec<CudaFunction>, BackendError> {
    let cubins: Vec<Vec<u8>> =
        UNITS.par_iter().map(|unit| compile::cubin(unit, arch)).collect::<Result<_, _>>()?;
    let mut functions: Vec<Option<CudaFunction>> = vec![None; KernelId::ALL.len()];
    for (unit, cubin) in UNITS.iter().zip(cubins) {
        let module = ctx.load_module(cudarc::nvrtc::Ptx::from_binary(cubin)).map_err(driver_err)?;
        for id in unit.kernels() {
            functions[id.index()] = Some(module.load_function(id.name()).map_err(driver_err)?);
        }
    }
    functions
        .into_iter()
        .zip(KernelId::ALL)
        .map(|(f, id)| {
            f.ok_or_else(|| BackendError::Driver(format!("kernel {} was not loaded", id.name())))
        })
        .collect()
}
