//! The CUDA simulator: the kernels of `kernels/`, their own source, compiled by the host C++
//! compiler and run on the CPU with every CUDA thread as a fiber (`runtime.hpp`).
//!
//! It is what lets the GPU code run where there is no GPU (CI): the op tests compare each kernel
//! with its CPU reference bit for bit, and the CUDA worker serves whole models through the same
//! launch wrappers, pools and copies as on a device. It checks the kernels' logic (indexing,
//! reduction order, barriers, shuffles, what a block reads before writing) and the host code
//! around them; it does not check what only a device shows (the device's `expf`, the memory model,
//! races between blocks, speed), so a run on a GPU is still the test of those.
//!
//! A device opened with [`CudaDevice::simulated`](super::CudaDevice::simulated) launches here.
//! Its "device memory" is host memory; its streams are queues (`queue.rs`) whose launches and
//! copies run only once something waits for them, on the thread that waits, blocks one after
//! another, so a missing event or synchronisation shows as wrong data, as on a GPU.
//!
//! Each unit becomes one shared library, cached like the CUBINs (`<unit>-<key>.so`, the key a
//! hash of the generated source, the compiler's version and the flags). The compiler is `$CXX`,
//! else `c++`.

pub(crate) mod queue;

use super::{
    compile::{cache_dir, hash_fields, store, tmp_suffix},
    launch::Shape,
    source::{KernelId, KernelUnit, UNITS},
};
use crate::BackendError;
use queue::SimQueues;
use rayon::prelude::*;
use std::{
    ffi::{c_char, c_int, c_void},
    path::{Path, PathBuf},
    process::Command,
    sync::Arc,
};

/// The simulator's runtime, compiled in front of every unit.
const RUNTIME: &str = include_str!("runtime.hpp");

/// Flags of every build: optimised, position independent, and no contraction of a multiply and
/// an add into a fused one (the kernels' arithmetic rule; NVRTC gets `--fmad=false`).
const FLAGS: &[&str] =
    &["-std=c++17", "-O2", "-fPIC", "-shared", "-ffp-contract=off", "-fno-fast-math", "-w"];

/// The environment variable naming the C++ compiler (the usual one).
const CXX_ENV: &str = "CXX";

/// A launch shape as `runtime.hpp`'s `sim::Config`.
#[repr(C)]
struct SimConfig {
    grid: [u32; 3],
    block: [u32; 3],
    smem: u32,
    /// Blocks per cluster along x (1: no clusters).
    cluster: u32,
}

/// `routed_sim_<kernel>(config, args, err, err_len)`: 0, or 1 with a message in `err`.
type Entry = unsafe extern "C" fn(*const SimConfig, *mut *mut c_void, *mut c_char, usize) -> c_int;

/// Every kernel, built for the host and loaded, and the device's stream queues.
pub(crate) struct SimKernels {
    /// Indexed by [`KernelId::index`].
    entries: Arc<[Entry]>,
    /// The queues of this device's streams, shared with the devices of its group.
    queues: Arc<SimQueues>,
    /// This device's compute stream among `queues`.
    compute: usize,
    /// Its copy stream.
    copy: usize,
    /// Keeps the entries' code mapped (shared with the group's other devices).
    libraries: Arc<[libloading::Library]>,
}

impl Drop for SimKernels {
    fn drop(&mut self) {
        // Queued launches call into the libraries: run them while the code is mapped. A fault
        // here has nobody left to report to.
        let _ = self.queues.finish();
    }
}

impl std::fmt::Debug for SimKernels {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SimKernels").field("kernels", &self.entries.len()).finish()
    }
}

impl SimKernels {
    /// Builds (or finds in the cache) every unit and loads it.
    pub(crate) fn load() -> Result<Self, BackendError> {
        let compiler = Compiler::find()?;
        let dir = library_dir()?;
        let paths: Vec<PathBuf> =
            UNITS.par_iter().map(|unit| compiler.build(unit, &dir)).collect::<Result<_, _>>()?;
        let mut entries: Vec<Option<Entry>> = vec![None; KernelId::ALL.len()];
        let mut libraries = Vec::with_capacity(UNITS.len());
        for (unit, path) in UNITS.iter().zip(paths) {
            // SAFETY: the library is ours, built from the runtime and a kernel unit; its
            // initialisers only set up thread-local storage.
            let lib = unsafe { libloading::Library::new(&path) }
                .map_err(|e| BackendError::Simulator(format!("loading {}: {e}", path.display())))?;
            for id in unit.kernels() {
                let symbol = format!("routed_sim_{}", id.name());
                // SAFETY: `ROUTED_SIM_EXPORT` defines the symbol with exactly the `Entry` type.
                let entry = unsafe { lib.get::<Entry>(symbol.as_bytes()) }
                    .map_err(|e| BackendError::Simulator(format!("{symbol}: {e}")))?;
                entries[id.index()] = Some(*entry);
            }
            libraries.push(lib);
        }
        let entries = entries
            .into_iter()
            .zip(KernelId::ALL)
            .map(|(e, id)| {
                e.ok_or_else(|| BackendError::Simulator(format!("{} was not built", id.name())))
            })
            .collect::<Result<Vec<_>, _>>()?
            .into();
        Ok(Self::with_queues(entries, libraries.into(), SimQueues::new()))
    }

    fn with_queues(
        entries: Arc<[Entry]>,
        libraries: Arc<[libloading::Library]>,
        queues: Arc<SimQueues>,
    ) -> Self {
        let (compute, copy) = (queues.add_stream(), queues.add_stream());
        Self { entries, queues, compute, copy, libraries }
    }

    /// Another device with the same kernels whose streams share this one's queues, so that
    /// either can wait on the other's events: a GPU of the same group.
    pub(crate) fn peer(&self) -> Self {
        Self::with_queues(self.entries.clone(), self.libraries.clone(), self.queues.clone())
    }

    /// The queues of the device's streams (and its group's).
    pub(crate) fn queues(&self) -> &Arc<SimQueues> {
        &self.queues
    }

    /// The device's (compute, copy) streams among [`SimKernels::queues`].
    pub(crate) fn streams(&self) -> (usize, usize) {
        (self.compute, self.copy)
    }

    /// Queues kernel `id` over `shape` with `args` (pointers to each argument's value, in the
    /// kernel's parameter order, as for `cuLaunchKernel`; `sizes` are the values' sizes) on the
    /// compute stream, or, while this thread captures a graph, records it instead. Either way the
    /// values are copied now, as the driver does.
    ///
    /// # Safety
    /// `args` must match the kernel's parameters in number, order and type, and every device
    /// address among them must be host memory of the right size (a simulated arena's) that stays
    /// allocated until the launch has run.
    pub(crate) unsafe fn launch(
        &self,
        id: KernelId,
        shape: &Shape,
        args: &mut [*mut c_void],
        sizes: &[usize],
    ) -> Result<(), BackendError> {
        let values = args.iter().zip(sizes).map(|(&arg, &size)| {
            let mut words = vec![0u64; size.div_ceil(8)];
            // SAFETY: `arg` points at a value of `size` bytes (the caller's contract), and
            // `words` holds at least that many.
            unsafe {
                std::ptr::copy_nonoverlapping(arg.cast::<u8>(), words.as_mut_ptr().cast(), size)
            };
            words
        });
        let launch = RecordedLaunch { id, shape: *shape, args: values.collect() };
        let launch = RECORDING.with_borrow_mut(|recording| match recording.as_mut() {
            Some(launches) => {
                launches.push(launch);
                None
            }
            None => Some(launch),
        });
        if let Some(launch) = launch {
            let entries = self.entries.clone();
            // SAFETY: the caller's contract, which holds until the work has run.
            self.queues.push(self.compute, Box::new(move || unsafe { run(&entries, &launch) }));
        }
        Ok(())
    }

    /// Starts recording this thread's launches instead of running them (a graph capture).
    pub(crate) fn begin_capture(&self) -> Result<(), BackendError> {
        RECORDING.with_borrow_mut(|recording| match recording {
            Some(_) => Err(BackendError::Simulator("a capture is already under way".into())),
            None => {
                *recording = Some(Vec::new());
                Ok(())
            }
        })
    }

    /// Stops recording and returns what was recorded.
    pub(crate) fn end_capture(&self) -> Vec<RecordedLaunch> {
        RECORDING.with_borrow_mut(Option::take).unwrap_or_default()
    }

    /// Queues recorded launches on the compute stream, in order, with the argument values they
    /// had when recorded.
    pub(crate) fn replay(&self, launches: &Arc<[RecordedLaunch]>) {
        let (entries, launches) = (self.entries.clone(), launches.clone());
        self.queues.push(
            self.compute,
            Box::new(move || {
                launches.iter().try_for_each(|l| {
                    // SAFETY: the arguments were recorded from a launch that met `launch`'s
                    // contract, and the memory they address (an arena's) outlives the graph.
                    unsafe { run(&entries, l) }
                })
            }),
        );
    }
}

/// Runs a launch: its blocks (clusters) one after another, on the calling thread.
///
/// # Safety
/// As [`SimKernels::launch`]: the recorded values match the kernel's parameters and address live
/// host memory of the right sizes.
unsafe fn run(entries: &[Entry], l: &RecordedLaunch) -> Result<(), BackendError> {
    let mut args: Vec<*mut c_void> =
        l.args.iter().map(|words| words.as_ptr().cast_mut().cast()).collect();
    let config = SimConfig {
        grid: [l.shape.grid.0, l.shape.grid.1, l.shape.grid.2],
        block: [l.shape.block.0, l.shape.block.1, l.shape.block.2],
        smem: l.shape.smem,
        cluster: l.shape.cluster,
    };
    let mut err = [0u8; 512];
    // SAFETY: the caller's contract; `err` is writable for its length and comes back
    // NUL-terminated.
    let rc = unsafe {
        entries[l.id.index()](&config, args.as_mut_ptr(), err.as_mut_ptr().cast(), err.len())
    };
    if rc == 0 {
        return Ok(());
    }
    let end = err.iter().position(|&b| b == 0).unwrap_or(err.len());
    Err(BackendError::Simulator(String::from_utf8_lossy(&err[..end]).into_owned()))
}

/// A launch recorded while capturing a graph: the argument values copied then (each in 8-byte
/// words, so the runtime reads them aligned).
#[derive(Debug)]
pub(crate) struct RecordedLaunch {
    id: KernelId,
    shape: Shape,
    args: Vec<Vec<u64>>,
}

thread_local! {
    /// The launches of this thread's capture under way, like a stream capture in the driver's
    /// thread-local mode.
    static RECORDING: std::cell::RefCell<Option<Vec<RecordedLaunch>>> =
        const { std::cell::RefCell::new(None) };
}

/// Where the built units are kept: `sim/` in the kernel cache (a temporary folder without one).
fn library_dir() -> Result<PathBuf, BackendError> {
    let dir =
        cache_dir().unwrap_or_else(|| std::env::temp_dir().join("routed-kernels")).join("sim");
    std::fs::create_dir_all(&dir)
        .map_err(|e| BackendError::Simulator(format!("creating {}: {e}", dir.display())))?;
    Ok(dir)
}

/// The host C++ compiler and its version line (part of the cache key).
struct Compiler {
    program: String,
    version: String,
}

impl Compiler {
    fn find() -> Result<Self, BackendError> {
        let program = std::env::var(CXX_ENV).ok().filter(|s| !s.is_empty());
        let program = program.unwrap_or_else(|| "c++".to_owned());
        let out = Command::new(&program).arg("--version").output().map_err(|e| {
            BackendError::Simulator(format!(
                "no C++ compiler `{program}` ({e}); install g++ or set {CXX_ENV}"
            ))
        })?;
        let version = String::from_utf8_lossy(&out.stdout).lines().next().unwrap_or("").to_owned();
        Ok(Self { program, version })
    }

    /// The unit's library in `dir`, built unless the cache has it.
    fn build(&self, unit: &'static KernelUnit, dir: &Path) -> Result<PathBuf, BackendError> {
        let stem = unit.path.trim_end_matches(".cu").replace('/', "-");
        self.build_source(&stem, &unit_source(unit), dir)
    }

    /// `src` (the runtime and a unit) built as `dir/<stem>-<key>.so`, unless it is there.
    fn build_source(&self, stem: &str, src: &str, dir: &Path) -> Result<PathBuf, BackendError> {
        let fields = [src.as_bytes(), self.version.as_bytes()]
            .into_iter()
            .chain(FLAGS.iter().map(|f| f.as_bytes()));
        let key = hash_fields(fields);
        let lib = dir.join(format!("{stem}-{key:016x}.so"));
        if lib.is_file() {
            return Ok(lib);
        }
        // Kept beside the library: compiler messages point into it.
        let cpp = dir.join(format!("{stem}-{key:016x}.cpp"));
        store(&cpp, src.as_bytes());
        let tmp = lib.with_extension(format!("so.{}", tmp_suffix()));
        let out = Command::new(&self.program)
            .args(FLAGS)
            .arg("-o")
            .arg(&tmp)
            .arg(&cpp)
            .output()
            .map_err(|e| BackendError::Simulator(format!("running {}: {e}", self.program)))?;
        if !out.status.success() {
            let _ = std::fs::remove_file(&tmp);
            return Err(BackendError::Simulator(format!(
                "{} could not compile {stem} ({}):\n{}",
                self.program,
                cpp.display(),
                String::from_utf8_lossy(&out.stderr)
            )));
        }
        std::fs::rename(&tmp, &lib)
            .map_err(|e| BackendError::Simulator(format!("storing {}: {e}", lib.display())))?;
        Ok(lib)
    }
}

/// The runtime, the unit's source with its dynamic shared memory bound to the simulator's, and
/// an exported entry per kernel.
pub(crate) fn unit_source(unit: &'static KernelUnit) -> String {
    let mut src = String::from(RUNTIME);
    for line in unit.source().lines() {
        src.push_str(&bind_dynamic_smem(line).unwrap_or_else(|| line.to_owned()));
        src.push('\n');
    }
    for id in unit.kernels() {
        src.push_str(&format!("ROUTED_SIM_EXPORT({})\n", id.name()));
    }
    src
}

/// `extern __shared__ T name[];` becomes a pointer to the block's dynamic shared memory (C++ has
/// no unsized shared array); other lines are `None`.
fn bind_dynamic_smem(line: &str) -> Option<String> {
    let decl = line.trim().strip_prefix("extern __shared__ ")?.strip_suffix("[];")?;
    let (ty, name) = decl.rsplit_once(' ')?;
    let indent = &line[..line.len() - line.trim_start().len()];
    Some(format!("{indent}{ty}* {name} = ({ty}*)sim::dynamic_smem();"))
}

#[cfg(test)]
mod tests;
