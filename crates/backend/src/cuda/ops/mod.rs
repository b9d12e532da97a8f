//! Typed launch wrappers, one per kernel, as methods of [`CudaDevice`](super::CudaDevice). Each
//! checks the sizes it can see on the host (buffer lengths against the shape, limits of the
//! kernel) and then makes the single launch; the argument order of a kernel is written down only
//! in its wrapper. Every launch goes on the compute stream.
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

pub use attention::{
    AttentionBuffers, AttentionParams, AttentionSplit, QkvHeadsBuffers, QkvHeadsParams,
};
pub use gemm::GemmTiling;
pub use moe::{ExpertActivation, ExpertShard, MoeSortBuffers, RouterKind, RouterParams};
pub use ssm::{ConvParams, MambaSeqs, ScanParams, ScanWeights};

use super::{DevSlice, KernelId, launch::Shape};
use crate::BackendError;
use cudarc::driver::LaunchConfig;

/// Launches `$kernel` with `$shape` and the given argument variables, pushed in order, on the
/// device's compute stream or in the simulator. The arguments must be variables (the launch
/// reads them through pointers).
macro_rules! launch {
    ($dev:expr, $kernel:expr, $shape:expr, [$($arg:ident),* $(,)?]) => {{
        let shape = $shape;
        match $dev.engine() {
            $crate::cuda::device::Engine::Driver(driver) if shape.cluster > 1 => {
                let func = driver.prepare($kernel, &shape)?;
                let mut args = [$( (&$arg as *const _) as *mut std::ffi::c_void ),*];
                // SAFETY: as below; `args` point at the wrapper's variables, which outlive the
                // call (the driver copies the values).
                unsafe { driver.launch_clusters(func, &shape, &mut args) }
            }
            $crate::cuda::device::Engine::Driver(driver) => {
                let func = driver.prepare($kernel, &shape)?;
                let mut builder = driver.compute.launch_builder(func);
                $( cudarc::driver::PushKernelArg::arg(&mut builder, &$arg); )*
                // SAFETY: the wrapper pushed the kernel's parameters in its declared order and
                // types, checked every length it can see against the shape, and the pools
                // outlive the stream's work (they are freed on the same stream).
                unsafe { builder.launch($crate::cuda::ops::config(&shape)) }
                    .map(|_| ())
                    .map_err($crate::cuda::device::driver_err)
            }
            $crate::cuda::device::Engine::Sim(sim) => {
                let mut args = [$( (&$arg as *const _) as *mut std::ffi::c_void ),*];
                let sizes = [$( std::mem::size_of_val(&$arg) ),*];
                // SAFETY: as above, and a simulated device's addresses are host memory of its
                // arenas.
                unsafe { sim.launch($kernel, &shape, &mut args, &sizes) }
            }
        }
    }};
}
pub(crate) use launch;

pub(crate) fn config(shape: &Shape) -> LaunchConfig {
    LaunchConfig { grid_dim: shape.grid, block_dim: shape.block, shared_mem_bytes: shape.smem }
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

/// Weights in either storage the kernels read, bf16 (as checkpoints usually store them) or f32
/// (f32 and f16 checkpoints, which the loader keeps in f32), and the arithmetic of their products.
/// Kernels that take weights come in one variant each: the CPU's arithmetic after the load for
/// either storage, or bf16 precision on tensor cores.
#[derive(Clone, Copy, Debug)]
pub enum Weights<'a> {
    /// bf16 values, products in `f32` (the weights widened exactly, the CPU's order and bits).
    Bf16(DevSlice<'a, half::bf16>),
    /// bf16 values, products in bf16 precision (`--matmul-precision bf16`): the inputs rounded to
    /// bf16, multiplied on tensor cores with `f32` sums, in an order fixed per output but not the
    /// CPU's. Needs bf16 tensor cores ([`CudaDevice::has_bf16_mma`]).
    ///
    /// [`CudaDevice::has_bf16_mma`]: super::CudaDevice::has_bf16_mma
    Bf16Mma(DevSlice<'a, half::bf16>),
    /// f32 values.
    F32(DevSlice<'a, f32>),
}

impl Weights<'_> {
    /// Elements.
    pub fn len(&self) -> usize {
        match self {
            Self::Bf16(s) | Self::Bf16Mma(s) => s.len(),
            Self::F32(s) => s.len(),
        }
    }

    /// Whether it holds no element.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The device address.
    pub fn addr(&self) -> u64 {
        match self {
            Self::Bf16(s) | Self::Bf16Mma(s) => s.addr(),
            Self::F32(s) => s.addr(),
        }
    }

    /// The kernel variant for this storage and arithmetic, of the variants `[bf16, bf16 on
    /// tensor cores, f32]`.
    fn kernel(&self, [bf16, mma, f32]: [KernelId; 3]) -> KernelId {
        match self {
            Self::Bf16(_) => bf16,
            Self::Bf16Mma(_) => mma,
            Self::F32(_) => f32,
        }
    }

    /// `Ok` if it holds at least `need` elements.
    fn fits(&self, kernel: KernelId, what: &str, need: usize) -> Result<(), BackendError> {
        if self.len() < need {
            return Err(bad(kernel, format!("{what} holds {} elements, needs {need}", self.len())));
        }
        Ok(())
    }
}

/// The address of an optional buffer (0 is the kernel's null).
pub(crate) fn addr_or_null<T>(slice: Option<DevSlice<'_, T>>) -> u64 {
    slice.map_or(0, |s| s.addr())
}
