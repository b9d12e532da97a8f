//! The compute seam of `routed`.
//!
//! * [`cpu`] holds the reference kernels. They are always built, and every model runs on them.
//! * [`collective`] joins the ranks of an expert-parallel group (in-process threads on the CPU).
//! * [`step_inputs`] packs a step's inputs into one buffer of words with a fixed offsets table,
//!   uploaded as far as the step changed it (block tables stay on the device), with
//!   [`logit_edits`], a row's bias and penalties as per-token edits. Plain host code, always
//!   built.
//! * [`cuda`] is the GPU device, behind the `cuda` cargo feature. Without the feature a stub
//!   module of the same shape stands in, so call sites never need `cfg`: asking for a CUDA device
//!   then returns [`BackendError::CudaNotCompiled`].
//!
//! # Determinism
//!
//! Every CPU kernel reduces over its inner dimension in one fixed order whatever the number of
//! rows, and splits work across threads by output rows or columns only. A token's result therefore
//! does not depend on which other tokens share its batch or how its prompt was chunked, which is
//! what makes routing replay bitwise reproducible.

pub mod collective;
pub mod cpu;

#[cfg(feature = "cuda")]
pub mod cuda;
#[cfg(not(feature = "cuda"))]
#[path = "cuda_stub.rs"]
pub mod cuda;

mod device;
pub mod logit_edits;
pub mod step_inputs;

pub use device::{Device, DeviceSpec};

/// Errors of the compute backend.
#[derive(Debug, thiserror::Error)]
pub enum BackendError {
    /// The binary was built without the `cuda` feature.
    #[error("this build of routed has no CUDA support (rebuild with `--features cuda`)")]
    CudaNotCompiled,
    /// The CUDA driver library could not be loaded: no NVIDIA driver on this machine.
    #[error("no CUDA driver found (libcuda could not be loaded); use --device cpu")]
    NoCudaDriver,
    /// The driver loaded but the requested device does not exist.
    #[error("CUDA device {ordinal} requested but {count} device(s) are present")]
    NoSuchDevice {
        /// The ordinal asked for.
        ordinal: usize,
        /// Devices present.
        count: usize,
    },
    /// A CUDA driver call failed.
    #[error("CUDA driver error: {0}")]
    Driver(String),
    /// A device string could not be parsed.
    #[error("unknown device {0:?}: expected `cpu` or `cuda:N`")]
    BadDeviceSpec(String),
    /// The driver is older than the CUDA version the bindings were built for.
    #[error(
        "CUDA driver version {found} is older than the required {required}; update the NVIDIA driver"
    )]
    DriverTooOld {
        /// The driver's CUDA version (e.g. 12040).
        found: i32,
        /// The oldest version the bindings work with.
        required: i32,
    },
    /// A CUDA library the device needs could not be loaded.
    #[error("the CUDA library {name} could not be loaded: {hint}")]
    MissingLibrary {
        /// The library (e.g. `libnvrtc.so.13`).
        name: &'static str,
        /// How to make it available.
        hint: String,
    },
    /// NVRTC rejected a kernel source (the log says why) or failed to run.
    #[error("NVRTC could not compile {unit} for {arch}: {log}")]
    Compile {
        /// The compilation unit (a file under `kernels/`).
        unit: &'static str,
        /// The target architecture (e.g. `sm_90`).
        arch: String,
        /// NVRTC's log.
        log: String,
    },
    /// A kernel launch was asked for with arguments that do not fit the kernel.
    #[error("bad launch of {kernel}: {reason}")]
    BadLaunch {
        /// The kernel.
        kernel: &'static str,
        /// What does not fit.
        reason: String,
    },
    /// A device buffer access outside its pool, or a copy whose lengths differ.
    #[error("device memory: {0}")]
    Memory(String),
    /// The CUDA simulator could not build a kernel unit with the host C++ compiler, or a
    /// simulated launch failed (a deadlock at a barrier, a shuffle outside its mask).
    #[error("CUDA simulator: {0}")]
    Simulator(String),
}
