//! Typed launch wrappers, one per kernel, as methods of [`CudaDevice`]. Each checks the sizes it
//! can see on the host (buffer lengths against the shape, limits of the kernel) and then makes the
//! single launch; the argument order of a kernel is written down only in its wrapper. Every launch
//! goes on the compute stream.
//!
//! Buffers are [`DevSlice`]s of the pools. Device-side indices (token ids, slots, block tables,
//! positions) cannot be checked here; the host code that fills the step inputs validates them, as
//! the CPU model does before a forward.

mod attention;
mod common;
mod gemm;
mod moe;
mod sample;
mod ssm;

pub use attention::{AttentionBuffers, AttentionParams};
pub use moe::{ExpertActivation, MoeSortBuffers, RouterKind, RouterParams};
pub use ssm::{ConvParams, MambaSeqs, ScanParams, ScanWeights};

use super::{CudaDevice, DevSlice, KernelId, device::driver_err, launch::Shape};
use crate::BackendError;
use cudarc::driver::{LaunchConfig, sys::CUfunction_attribute};

/// Launches `$kernel` with `$shape` and the given argument variables, pushed in order. The
/// arguments must be variables (cudarc keeps pointers to them until the launch).
macro_rules! launch {
    ($dev:expr, $kernel:expr, $shape:expr, [$($arg:ident),* $(,)?]) => {{
        let shape = $shape;
        let func = $dev.prepare($kernel, &shape)?;
        let mut builder = $dev.compute_stream().launch_builder(func);
        $( cudarc::driver::PushKernelArg::arg(&mut builder, &$arg); )*
        // SAFETY: the wrapper pushed the kernel's parameters in its declared order and types,
        // checked every length it can see against the shape, and the pools outlive the stream's
        // work (they are freed on the same stream).
        unsafe { builder.launch($crate::cuda::ops::config(&shape)) }
            .map(|_| ())
            .map_err($crate::cuda::device::driver_err)
    }};
}
pub(crate) use launch;

pub(crate) fn config(shape: &Shape) -> LaunchConfig {
    LaunchConfig { grid_dim: shape.grid, block_dim: shape.block, shared_mem_bytes: shape.smem }
}

impl CudaDevice {
    /// The kernel, with its dynamic shared memory limit raised when the shape needs more than the
    /// default.
    pub(crate) fn prepare(
        &self,
        id: KernelId,
        shape: &Shape,
    ) -> Result<&cudarc::driver::CudaFunction, BackendError> {
        let func = self.kernel(id);
        if shape.needs_smem_opt_in() {
            let attr = CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES;
            func.set_attribute(attr, shape.smem as i32).map_err(driver_err)?;
        }
        Ok(func)
    }
}

/// A failed host-side check of `kernel`'s arguments.
pub(crate) fn bad(kernel: KernelId, reason: impl Into<String>) -> BackendError {
    BackendError::BadLaunch { kernel: kernel.name(), reason: reason.into() }
}

/// `Ok` if `slice` holds at least `need` elements.
pub(crate) fn fits<T>(
    kernel: KernelId,
    what: &str,
    slice: &DevSlice<'_, T>,
    need: usize,
) -> Result<(), BackendError> {
    if slice.len() < need {
        return Err(bad(kernel, format!("{what} holds {} elements, needs {need}", slice.len())));
    }
    Ok(())
}

/// A size as the kernel's `int`, which must be positive.
pub(crate) fn int(kernel: KernelId, what: &str, v: usize) -> Result<i32, BackendError> {
    i32::try_from(v)
        .ok()
        .filter(|&v| v > 0)
        .ok_or_else(|| bad(kernel, format!("{what} = {v} is not a positive int")))
}

/// The shape, or the error saying the sizes exceed the launch limits.
pub(crate) fn shape(kernel: KernelId, shape: Option<Shape>) -> Result<Shape, BackendError> {
    shape.ok_or_else(|| bad(kernel, "the sizes exceed the kernel's launch limits"))
}

/// The address of an optional buffer (0 is the kernel's null).
pub(crate) fn addr_or_null<T>(slice: Option<DevSlice<'_, T>>) -> u64 {
    slice.map_or(0, |s| s.addr())
}
