//! The simulator's own tests: how units are bound, and probe kernels that exercise the runtime
//! (shuffles, barriers, block and thread orders, the faults it reports).

use super::*;

#[test]
fn dynamic_shared_memory_binds_to_the_block_buffer() {
    assert_eq!(
        bind_dynamic_smem("    extern __shared__ float smem[];").as_deref(),
        Some("    float* smem = (float*)sim::dynamic_smem();")
    );
    assert_eq!(bind_dynamic_smem("    __shared__ float s[32];"), None);
}

#[test]
fn every_unit_binds_its_dynamic_shared_memory_and_exports_its_kernels() {
    for unit in UNITS {
        let src = unit_source(unit);
        assert!(!src.contains("extern __shared__"), "{}", unit.path);
        for id in unit.kernels() {
            assert!(src.contains(&format!("ROUTED_SIM_EXPORT({})", id.name())));
        }
    }
}

/// Kernels that exercise the runtime itself: shuffles with every `width` rule, a block
/// reduction through static shared memory, and the faults it must report.
const PROBES: &str = r#"
extern "C" __global__ void shuffles(int* out) {
int t = threadIdx.x, lane = t % 32;
out[t * 4 + 0] = __shfl_xor_sync(0xffffffffu, t, 1);
out[t * 4 + 1] = __shfl_down_sync(0xffffffffu, t, 4, 16);
out[t * 4 + 2] = __shfl_sync(0xffffffffu, t, 3, 8);
out[t * 4 + 3] = __shfl_xor_sync(0xffffffffu, t, 16, 16);
(void)lane;
}

extern "C" __global__ void block_sum(const float* x, float* out) {
__shared__ float part[8];
float v = x[blockIdx.x * blockDim.x + threadIdx.x];
for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
if (threadIdx.x % 32 == 0) part[threadIdx.x / 32] = v;
__syncthreads();
if (threadIdx.x == 0) {
    float s = 0.0f;
    for (int w = 0; w < (int)blockDim.x / 32; ++w) s += part[w];
    out[blockIdx.x] = s;
}
}

extern "C" __global__ void exited_lane(int* out) {
if (threadIdx.x >= 16) return;
out[threadIdx.x] = __shfl_xor_sync(0xffffffffu, (int)threadIdx.x, 1);
}

extern "C" __global__ void divergent_barrier(int* out) {
if (threadIdx.x % 2) __syncthreads();
else __syncwarp();
out[threadIdx.x] = 1;
}

extern "C" __global__ void unwritten_smem(float* out) {
extern __shared__ float smem[];
out[threadIdx.x] = smem[threadIdx.x];
}

// Thread 0 of each block broadcasts a value through shared memory, with or without the barrier
// the readers need.
extern "C" __global__ void broadcast(int* out, int with_barrier) {
extern __shared__ float smem[];
if (threadIdx.x == 0) smem[0] = 7.0f;
if (with_barrier) __syncthreads();
out[blockIdx.x * blockDim.x + threadIdx.x] = smem[0] == 7.0f;
}

// Thread 0 of warp 0 gathers the warps' values, with or without the barrier before it reads.
extern "C" __global__ void gather(int* out, int with_barrier) {
extern __shared__ float smem[];
if (threadIdx.x % 32 == 0) smem[threadIdx.x / 32] = 1.0f;
if (with_barrier) __syncthreads();
if (threadIdx.x == 0) {
    float s = 0.0f;
    for (unsigned w = 0; w < blockDim.x / 32; ++w) s += smem[w];
    out[blockIdx.x] = s == (float)(blockDim.x / 32);
}
}

// Each block of a cluster publishes its rank + 1 in its shared memory and every thread sums the
// cluster's through cluster_map: `mode` 0 with the cluster barriers, 1 without the one between the
// writes and the reads, 2 without the one that keeps a block from leaving while others read it.
extern "C" __global__ void cluster_exchange(int* out, int mode) {
extern __shared__ int mine[];
if (threadIdx.x == 0) mine[0] = (int)blockIdx.x + 1;
if (mode == 1) __syncthreads();
else cluster_sync();
int s = 0;
for (unsigned r = 0; r < gridDim.x; ++r) s += *cluster_map(&mine[0], r);
out[blockIdx.x * blockDim.x + threadIdx.x] = s;
if (mode != 2) cluster_sync();
}

// Each block reads what the block before it wrote in the same launch (which no GPU orders).
extern "C" __global__ void reads_lower_block(int* flags, int* out) {
if (threadIdx.x != 0) return;
flags[blockIdx.x] = 1;
if (blockIdx.x > 0) out[blockIdx.x] = flags[blockIdx.x - 1];
}
"#;

const PROBE_KERNELS: [&str; 9] = [
    "shuffles",
    "block_sum",
    "exited_lane",
    "divergent_barrier",
    "unwritten_smem",
    "broadcast",
    "gather",
    "reads_lower_block",
    "cluster_exchange",
];

struct Probes {
    lib: libloading::Library,
}

impl Probes {
    fn build() -> Self {
        let compiler = Compiler::find().expect("the simulator's tests need a C++ compiler");
        let mut src = String::from(RUNTIME);
        for line in PROBES.lines() {
            src.push_str(&bind_dynamic_smem(line).unwrap_or_else(|| line.to_owned()));
            src.push('\n');
        }
        for k in PROBE_KERNELS {
            src.push_str(&format!("ROUTED_SIM_EXPORT({k})\n"));
        }
        let path = compiler.build_source("probes", &src, &library_dir().unwrap()).unwrap();
        // SAFETY: our own library of probe kernels.
        Self { lib: unsafe { libloading::Library::new(path) }.unwrap() }
    }

    /// Runs `kernel` on a grid of `blocks` x `threads` with one buffer argument (and the
    /// input, if any, before it).
    fn run<T>(
        &self,
        kernel: &str,
        blocks: u32,
        threads: u32,
        smem: u32,
        bufs: &mut [*mut T],
    ) -> Result<(), String> {
        let mut args: Vec<*mut c_void> =
            bufs.iter_mut().map(|p| (p as *mut *mut T).cast()).collect();
        self.run_args(kernel, (blocks, threads, smem), &mut args)
    }

    /// Runs `kernel` with `args` pointing at its arguments' values.
    fn run_args(
        &self,
        kernel: &str,
        (blocks, threads, smem): (u32, u32, u32),
        args: &mut [*mut c_void],
    ) -> Result<(), String> {
        self.run_clusters(kernel, (blocks, threads, smem, 1), args)
    }

    /// Runs `kernel` in clusters of `cluster` blocks along x.
    fn run_clusters(
        &self,
        kernel: &str,
        (blocks, threads, smem, cluster): (u32, u32, u32, u32),
        args: &mut [*mut c_void],
    ) -> Result<(), String> {
        let config = SimConfig { grid: [blocks, 1, 1], block: [threads, 1, 1], smem, cluster };
        let mut err = [0u8; 512];
        // SAFETY: the probe's export has the `Entry` type and takes these buffers.
        let rc = unsafe {
            let entry = self.lib.get::<Entry>(format!("routed_sim_{kernel}").as_bytes()).unwrap();
            entry(&config, args.as_mut_ptr(), err.as_mut_ptr().cast(), err.len())
        };
        let end = err.iter().position(|&b| b == 0).unwrap();
        if rc == 0 { Ok(()) } else { Err(String::from_utf8_lossy(&err[..end]).into_owned()) }
    }
}

#[test]
fn shuffles_follow_the_cuda_width_rules() {
    let probes = Probes::build();
    let mut out = vec![-1i32; 64 * 4];
    probes.run("shuffles", 1, 64, 0, &mut [out.as_mut_ptr()]).unwrap();
    for t in 0..64i32 {
        let lane = t % 32;
        let base = t - lane;
        let seg16 = lane / 16 * 16;
        let down = if lane % 16 + 4 >= 16 { t } else { t + 4 };
        let xor16 = if (lane ^ 16) >= seg16 + 16 { t } else { base + (lane ^ 16) };
        let want = [t ^ 1, down, base + lane / 8 * 8 + 3, xor16];
        assert_eq!(out[t as usize * 4..t as usize * 4 + 4], want, "thread {t}");
    }
}

#[test]
fn barriers_order_a_block_reduction() {
    let probes = Probes::build();
    let x: Vec<f32> = (0..3 * 256).map(|i| (i % 7) as f32).collect();
    let mut out = vec![0.0f32; 3];
    let mut bufs = [x.as_ptr().cast_mut(), out.as_mut_ptr()];
    probes.run("block_sum", 3, 256, 0, &mut bufs).unwrap();
    for (b, got) in out.iter().enumerate() {
        let want: f32 = x[b * 256..(b + 1) * 256].iter().sum();
        assert_eq!(*got, want, "block {b}");
    }
}

#[test]
fn faults_are_reported_not_hung() {
    let probes = Probes::build();
    let mut out = vec![0i32; 32];
    let err = probes.run("exited_lane", 1, 32, 0, &mut [out.as_mut_ptr()]).unwrap_err();
    assert!(err.contains("exited_lane") && err.contains("deadlocks"), "{err}");
    let err = probes.run("divergent_barrier", 1, 64, 0, &mut [out.as_mut_ptr()]).unwrap_err();
    assert!(err.contains("divergent_barrier") && err.contains("__syncthreads"), "{err}");
}

/// Runs a probe whose second argument is `with_barrier`, over `blocks` blocks of 64 threads.
fn run_with_barrier(probes: &Probes, kernel: &str, blocks: u32, with: bool) -> Vec<i32> {
    let mut out = vec![-1i32; blocks as usize * 64];
    let (mut ptr, mut flag) = (out.as_mut_ptr(), i32::from(with));
    let mut args: [*mut c_void; 2] =
        [(&mut ptr as *mut *mut i32).cast(), (&mut flag as *mut i32).cast()];
    probes.run_args(kernel, (blocks, 64, 64 * 4), &mut args).unwrap();
    out
}

#[test]
fn threads_between_barriers_run_in_both_orders() {
    let probes = Probes::build();
    // Two blocks: one runs its threads in reverse, where readers of a broadcast come before
    // thread 0; the other in order, where thread 0 gathers before the other warps wrote.
    for (kernel, outputs) in [("broadcast", 2 * 64), ("gather", 2)] {
        let with = run_with_barrier(&probes, kernel, 2, true);
        assert!(with[..outputs].iter().all(|&v| v == 1), "{kernel} with its barrier: {with:?}");
        let without = run_with_barrier(&probes, kernel, 2, false);
        assert!(without[..outputs].contains(&0), "{kernel} without its barrier went unnoticed");
    }
}

#[test]
fn blocks_run_last_first() {
    let probes = Probes::build();
    let (mut flags, mut out) = (vec![0i32; 4], vec![-1i32; 4]);
    probes.run("reads_lower_block", 4, 32, 0, &mut [flags.as_mut_ptr(), out.as_mut_ptr()]).unwrap();
    assert_eq!(out[1..], [0, 0, 0], "every block ran before the one below it");
}

#[test]
fn dynamic_shared_memory_starts_as_nan() {
    let probes = Probes::build();
    let mut out = vec![0.0f32; 32];
    probes.run("unwritten_smem", 1, 32, 32 * 4, &mut [out.as_mut_ptr()]).unwrap();
    assert!(out.iter().all(|v| v.is_nan()));
}

/// `cluster_exchange` over one cluster of `blocks` blocks of 64 threads in `mode`.
fn cluster_exchange(probes: &Probes, blocks: u32, mode: i32) -> Result<Vec<i32>, String> {
    let mut out = vec![-1i32; blocks as usize * 64];
    let (mut ptr, mut mode) = (out.as_mut_ptr(), mode);
    let mut args: [*mut c_void; 2] =
        [(&mut ptr as *mut *mut i32).cast(), (&mut mode as *mut i32).cast()];
    probes.run_clusters("cluster_exchange", (blocks, 64, 4, blocks), &mut args)?;
    Ok(out)
}

#[test]
fn a_clusters_blocks_meet_only_at_cluster_barriers() {
    let probes = Probes::build();
    let sum = (1..=4).sum::<i32>();
    let with = cluster_exchange(&probes, 4, 0).unwrap();
    assert!(with.iter().all(|&s| s == sum), "with the barriers: {with:?}");
    // A block reads another's shared memory before it is written, or after that block has left.
    for mode in [1, 2] {
        let without = cluster_exchange(&probes, 4, mode).unwrap();
        assert!(without.iter().any(|&s| s != sum), "mode {mode} went unnoticed");
    }
    let err = probes
        .run_clusters("cluster_exchange", (6, 64, 4, 4), &mut [])
        .expect_err("a grid that is no whole number of clusters");
    assert!(err.contains("clusters of 4 blocks"), "{err}");
}
