//! Opening a CUDA device: every failure an error, never a panic.
//!
//! Order matters: the libraries and the driver version are probed before cudarc's first call
//! (cudarc panics on a missing library or symbol); event tracking is switched off before any
//! stream or allocation exists (cudarc only applies the switch to buffers created after it, and
//! with tracking on every launch would record and wait on events, which also breaks graph
//! capture); then the compute and copy streams are made and every kernel is compiled (or read
//! from the cache) and loaded.
//!
//! [`CudaDevice::simulated`] opens the CUDA simulator instead: the same kernels, launch wrappers,
//! pools and copies, run on the host.

use super::{
    compile::{self, Arch},
    launch::Shape,
    libs::{self, CudaLibrary},
    peer::PeerLink,
    sim::SimKernels,
    source::{KernelId, UNITS},
    stream::{Event, Stream},
};
use crate::BackendError;
use cudarc::driver::{CudaContext, CudaFunction, CudaStream, sys::CUfunction_attribute};
use rayon::prelude::*;
use std::sync::{Arc, OnceLock};

/// Memory a simulated device reports as its own (what sizes the KV pool when no block count is
/// given); the simulator's pools are host memory.
pub const SIM_MEMORY_BYTES: usize = 2 << 30;

/// An opened CUDA device, or the CUDA simulator: a compute stream, a copy stream and the loaded
/// kernels. Cheap to clone.
#[derive(Clone)]
pub struct CudaDevice {
    inner: Arc<Inner>,
}

struct Inner {
    ordinal: usize,
    name: String,
    arch: Arch,
    /// `arch.has_bf16_mma()`, taken once: every tensor-core launch asks.
    bf16_mma: bool,
    driver_version: i32,
    compute: Stream,
    copy: Stream,
    engine: Engine,
    /// The expert-parallel group whose devices this one reads, once linked
    /// ([`super::peer::link_peers`]).
    peers: OnceLock<PeerLink>,
}

/// What runs the launches.
pub(crate) enum Engine {
    /// A GPU through the driver.
    Driver(Driver),
    /// The kernels built for the host ([`super::sim`]).
    Sim(SimKernels),
}

/// The driver's side of an opened device.
pub(crate) struct Driver {
    ctx: Arc<CudaContext>,
    pub(crate) compute: Arc<CudaStream>,
    /// Indexed by [`KernelId::index`].
    kernels: Vec<CudaFunction>,
}

impl Driver {
    /// The kernel, with its dynamic shared memory limit raised when the shape needs more than the
    /// default.
    pub(crate) fn prepare(
        &self,
        id: KernelId,
        shape: &Shape,
    ) -> Result<&CudaFunction, BackendError> {
        let func = &self.kernels[id.index()];
        if shape.needs_smem_opt_in() {
            let attr = CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES;
            func.set_attribute(attr, shape.smem as i32).map_err(driver_err)?;
        }
        Ok(func)
    }

    /// Launches `func` over `shape` in thread block clusters of `shape.cluster` blocks along x
    /// (`cuLaunchKernelEx`; the cluster size is the launch's, not the kernel's), on the compute
    /// stream.
    ///
    /// # Safety
    /// `args` point at the kernel's parameters, in its declared order and types, and every
    /// buffer they address outlives the stream's work, as for any launch.
    pub(crate) unsafe fn launch_clusters(
        &self,
        func: &CudaFunction,
        shape: &Shape,
        args: &mut [*mut std::ffi::c_void],
    ) -> Result<(), BackendError> {
        use cudarc::driver::sys;
        let mut cluster = sys::CUlaunchAttribute {
            id: sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION,
            pad: [0; 4],
            value: sys::CUlaunchAttributeValue {
                clusterDim: sys::CUlaunchAttributeValue_union__bindgen_ty_1 {
                    x: shape.cluster,
                    y: 1,
                    z: 1,
                },
            },
        };
        let config = sys::CUlaunchConfig {
            gridDimX: shape.grid.0,
            gridDimY: shape.grid.1,
            gridDimZ: shape.grid.2,
            blockDimX: shape.block.0,
            blockDimY: shape.block.1,
            blockDimZ: shape.block.2,
            sharedMemBytes: shape.smem,
            hStream: self.compute.cu_stream(),
            attrs: &mut cluster,
            numAttrs: 1,
        };
        self.ctx.bind_to_thread().map_err(driver_err)?;
        // SAFETY: the configuration and its one attribute live across the call, the function is
        // this context's, and `args` is the caller's contract.
        unsafe {
            sys::cuLaunchKernelEx(
                &config,
                func.cu_function(),
                args.as_mut_ptr(),
                std::ptr::null_mut(),
            )
        }
        .result()
        .map_err(driver_err)
    }
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
        let inner = Inner {
            ordinal,
            name,
            bf16_mma: arch.has_bf16_mma(),
            arch,
            driver_version,
            compute: Stream::driver(compute.clone()),
            copy: Stream::driver(copy),
            engine: Engine::Driver(Driver { ctx, compute, kernels }),
            peers: OnceLock::new(),
        };
        Ok(Self { inner: Arc::new(inner) })
    }

    /// The CUDA simulator ([`super::sim`]): every kernel built for the host by its C++ compiler,
    /// launches and copies queued per stream and run when waited for. Fails (naming the
    /// compiler) when no compiler can build them.
    pub fn simulated() -> Result<Self, BackendError> {
        Ok(Self::from_sim(SimKernels::load()?, 0))
    }

    /// Another simulated device beside this one (which must be simulated), the next ordinal,
    /// whose streams share this one's queues: either can wait on the other's events, so the two
    /// can join a peer group ([`super::peer::link_peers`]) as GPUs with peer access do.
    pub fn simulated_peer(&self) -> Result<Self, BackendError> {
        match &self.inner.engine {
            Engine::Sim(sim) => Ok(Self::from_sim(sim.peer(), self.inner.ordinal + 1)),
            Engine::Driver(_) => {
                Err(BackendError::Simulator("a simulated peer of a GPU was asked for".into()))
            }
        }
    }

    fn from_sim(kernels: SimKernels, ordinal: usize) -> Self {
        let queues = kernels.queues().clone();
        let (compute, copy) = kernels.streams();
        let inner = Inner {
            ordinal,
            name: "CUDA simulator".to_owned(),
            arch: Arch::simulator(),
            bf16_mma: Arch::simulator().has_bf16_mma(),
            driver_version: 0,
            compute: Stream::sim(queues.clone(), compute),
            copy: Stream::sim(queues, copy),
            engine: Engine::Sim(kernels),
            peers: OnceLock::new(),
        };
        Self { inner: Arc::new(inner) }
    }

    /// Joins `devices` (rank r at index r) into a group whose kernels read each other's memory
    /// ([`super::peer::link_peers`]); `Ok(false)` when they cannot, and the ranks exchange
    /// through host memory.
    pub fn link_peers(devices: &[Self]) -> Result<bool, BackendError> {
        super::peer::link_peers(devices)
    }

    /// The peer group this device reads the memory of, if it was linked into one.
    pub fn peer_link(&self) -> Option<&PeerLink> {
        self.inner.peers.get()
    }

    pub(crate) fn set_peer_link(&self, link: PeerLink) -> Result<(), BackendError> {
        self.inner
            .peers
            .set(link)
            .map_err(|_| BackendError::Driver("a device is already in a peer group".into()))
    }

    /// Whether this is the simulator rather than a GPU.
    pub fn is_simulated(&self) -> bool {
        matches!(self.inner.engine, Engine::Sim(_))
    }

    /// The device ordinal.
    pub fn ordinal(&self) -> usize {
        self.inner.ordinal
    }

    /// The device's marketing name.
    pub fn name(&self) -> &str {
        &self.inner.name
    }

    /// The architecture the kernels were compiled for (`sm_90` on an H100, `sim` for the
    /// simulator).
    pub fn arch(&self) -> &str {
        self.inner.arch.as_str()
    }

    /// Whether the products in bf16 precision can run (bf16 tensor cores: sm_80 and later).
    pub fn has_bf16_mma(&self) -> bool {
        self.inner.bf16_mma
    }

    /// Blocks (a thread block cluster) per row of `vocab` logits in the row-wide sampling
    /// kernels ([`sample_blocks_per_row`](super::launch::sample_blocks_per_row)).
    pub fn sample_blocks_per_row(&self, vocab: usize) -> usize {
        super::launch::sample_blocks_per_row(vocab, self.inner.arch.has_clusters())
    }

    /// The driver's CUDA version (`13000` for 13.0; 0 for the simulator).
    pub fn driver_version(&self) -> i32 {
        self.inner.driver_version
    }

    /// Free and total device memory in bytes ([`SIM_MEMORY_BYTES`] both for the simulator).
    pub fn mem_get_info(&self) -> Result<(usize, usize), BackendError> {
        match &self.inner.engine {
            Engine::Driver(d) => d.ctx.mem_get_info().map_err(driver_err),
            Engine::Sim(_) => Ok((SIM_MEMORY_BYTES, SIM_MEMORY_BYTES)),
        }
    }

    /// The stream every kernel runs on.
    pub fn compute_stream(&self) -> &Stream {
        &self.inner.compute
    }

    /// The stream of device-to-host copies that overlap the next step (routing rows).
    pub fn copy_stream(&self) -> &Stream {
        &self.inner.copy
    }

    /// A new event without timing, for ordering work between the streams (recorded on one,
    /// waited on by the other) or waiting for it on the host.
    pub fn new_event(&self) -> Result<Event, BackendError> {
        self.event_with(None)
    }

    /// A new event that times: [`Event::seconds_since`] reads the device's time between two of
    /// them (the driver's `CU_EVENT_DEFAULT`; the simulator has no device clock).
    pub fn new_timing_event(&self) -> Result<Event, BackendError> {
        self.event_with(Some(cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT))
    }

    /// A new event with the driver's `flags`.
    pub(crate) fn event_with(
        &self,
        flags: Option<cudarc::driver::sys::CUevent_flags>,
    ) -> Result<Event, BackendError> {
        match &self.inner.engine {
            Engine::Driver(d) => d.ctx.new_event(flags).map(Event::driver).map_err(driver_err),
            Engine::Sim(sim) => Ok(Event::sim(sim.queues().clone())),
        }
    }

    /// Waits for everything queued on the compute stream.
    pub fn synchronize(&self) -> Result<(), BackendError> {
        self.inner.compute.synchronize()
    }

    /// What runs this device's launches.
    pub(crate) fn engine(&self) -> &Engine {
        &self.inner.engine
    }

    /// The driver's context, or `None` on the simulator.
    pub(crate) fn cuda_context(&self) -> Option<&Arc<CudaContext>> {
        match &self.inner.engine {
            Engine::Driver(d) => Some(&d.ctx),
            Engine::Sim(_) => None,
        }
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
