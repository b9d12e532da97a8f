//! The CUDA device, through cudarc with dynamic loading: the binary builds and starts on machines
//! without CUDA, and only opening a device needs the driver and NVRTC.
//!
//! * `device`: opening a device (probes first, then context, streams, kernels).
//! * [`libs`]: finding the driver, NVRTC and cuBLAS without letting cudarc panic.
//! * [`source`] and [`compile`]: the embedded `kernels/` sources, the [`KernelId`] table, NVRTC to
//!   CUBIN with an on-disk cache.
//! * [`arena`] and [`pools`]: device memory allocated once per pool, carved into typed spans.
//! * [`launch`]: launch shapes as plain arithmetic.
//! * [`ops`]: a typed launch wrapper per kernel, as methods of [`CudaDevice`].
//! * [`host`]: pinned host buffers and host-side tables the kernels read.
//! * [`graph`]: CUDA graphs, a step's launches captured once and replayed.
//! * [`stream`]: the streams and events that order work between streams and with the host.
//! * [`peer`]: the GPUs of an expert-parallel group reading each other's memory.
//! * [`sim`]: the CUDA simulator, the same kernels built for the host (CI has no GPU).
//!
//! Determinism: every kernel reduces in one fixed order whatever the batch (no split-K, attention
//! tiles aligned at absolute position 0, one sequential scan for prefill and decode), and where the
//! CPU reference only multiplies, adds, divides and takes square roots, the GPU performs the same
//! operations in the same order, so its results are the CPU's bit for bit. `docs/gpu.md` lists the
//! rule and the tolerance of every op.

pub mod arena;
pub mod compile;
mod device;
pub mod graph;
pub mod host;
pub mod launch;
pub mod libs;
pub mod ops;
pub mod peer;
pub mod pools;
pub mod resources;
pub mod sim;
pub mod source;
pub mod stream;

pub use arena::{ArenaLayout, DevSlice, DeviceArena, DeviceElem, Span};
pub use device::{CudaDevice, SIM_MEMORY_BYTES};
pub use graph::Graph;
pub use source::KernelId;
pub use stream::{Event, Stream};
