//! Shared helpers of the GPU tests: the device (or the reason to skip), a seeded generator, device
//! buffers built from host data, and the tolerances.

use half::bf16;
use routed_backend::cuda::{ArenaLayout, CudaDevice, DevSlice, DeviceArena, DeviceElem, Span};
use std::sync::OnceLock;

/// The tolerances of the GPU ops against their CPU references, and why.
pub mod tol {
    // Ops whose every operation is an IEEE multiply, add, divide or square root in the CPU's
    // order (products, norms, rotary, conv, combine, activations, copies, argmax) have no
    // tolerance: `assert_bits` checks them.
    /// Attention, relative to the largest |value|: the scores sum head_dim products in another
    /// order than the CPU's 16-lane dot (a few ulp), and the online softmax rescales partial sums
    /// once per 32-key tile (one rounding each) where the CPU normalises once. For the lengths
    /// tested (under 64 tiles) both stay under about 1e-5 of the largest value.
    pub const ATTENTION: f32 = 5e-5;
    /// Router weights, relative: the device's expf is within 2 ulp of the host's libm expf, and
    /// the weights are a softmax or sigmoid of a few such values.
    pub const ROUTER_WEIGHT: f32 = 1e-5;
    /// Scan outputs, relative to the largest |y| of the sequence: softplus and exp of dt differ by
    /// up to 2 ulp per token, which the decay carries through the state (about one ulp per token
    /// of history: under 1e-5 for the 64 tokens tested).
    pub const SCAN: f32 = 1e-4;
    /// log_z, absolute: the device sums the exponentials in another fixed order and takes logf;
    /// relative errors of the sum (about 1e-6 for these vocabularies) become absolute ones of its
    /// log.
    pub const LOG_Z: f32 = 1e-4;
}

/// The device shared by every test of this binary: GPU 0, else the CUDA simulator (the kernels
/// built for the host), or `None` (with the reasons printed) when neither opens. Under `CI=true`
/// the simulator must open. `ROUTED_CUDA_SIM=1` takes the simulator even where a GPU is present.
pub fn gpu_or_skip(test: &str) -> Option<&'static CudaDevice> {
    static DEVICE: OnceLock<Result<CudaDevice, String>> = OnceLock::new();
    let dev = DEVICE.get_or_init(|| {
        let gpu = if std::env::var("ROUTED_CUDA_SIM").is_ok_and(|v| v == "1") {
            Err("ROUTED_CUDA_SIM=1".to_owned())
        } else {
            CudaDevice::open(0).map_err(|e| e.to_string())
        };
        gpu.or_else(|no_gpu| {
            let sim = CudaDevice::simulated();
            if std::env::var("CI").is_ok_and(|v| v == "true") {
                sim.as_ref().expect("CI runs the GPU tests on the CUDA simulator");
            }
            eprintln!("no GPU ({no_gpu}): the GPU tests run on the CUDA simulator");
            sim.map_err(|e| format!("no GPU ({no_gpu}), no simulator ({e})"))
        })
    });
    match dev {
        Ok(dev) => Some(dev),
        Err(why) => {
            eprintln!("skipping {test}: {why}");
            None
        }
    }
}

/// SplitMix64: small, seeded, no dependencies.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Self(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `[lo, hi)`.
    pub fn uniform(&mut self, lo: f32, hi: f32) -> f32 {
        lo + (hi - lo) * ((self.next_u64() >> 40) as f32 / (1u64 << 24) as f32)
    }

    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }

    pub fn vec(&mut self, n: usize, lo: f32, hi: f32) -> Vec<f32> {
        (0..n).map(|_| self.uniform(lo, hi)).collect()
    }

    /// Values exactly representable in bf16 (weights as checkpoints store them).
    pub fn bf16_vec(&mut self, n: usize, lo: f32, hi: f32) -> Vec<bf16> {
        (0..n).map(|_| bf16::from_f32(self.uniform(lo, hi))).collect()
    }

    pub fn shuffle<T>(&mut self, v: &mut [T]) {
        for i in (1..v.len()).rev() {
            v.swap(i, self.below(i + 1));
        }
    }
}

pub fn widen(v: &[bf16]) -> Vec<f32> {
    v.iter().map(|x| x.to_f32()).collect()
}

/// Writes a span's host contents once the arena exists.
type Fill = Box<dyn FnOnce(&mut DeviceArena)>;

/// Device buffers for one test: spans are declared with their host contents (or as outputs),
/// then allocated and filled in one arena.
pub struct Plan {
    dev: &'static CudaDevice,
    layout: ArenaLayout,
    fills: Vec<Fill>,
}

impl Plan {
    pub fn new(dev: &'static CudaDevice) -> Self {
        Self { dev, layout: ArenaLayout::new("test"), fills: Vec::new() }
    }

    pub fn input<T: DeviceElem>(&mut self, data: &[T]) -> Span<T> {
        let span = self.layout.push::<T>(data.len().max(1));
        let data = data.to_vec();
        self.fills.push(Box::new(move |a| a.upload(span, &data).expect("upload")));
        span
    }

    pub fn output<T: DeviceElem>(&mut self, len: usize) -> Span<T> {
        self.layout.push::<T>(len.max(1))
    }

    pub fn alloc(self) -> Mem {
        let mut arena = DeviceArena::new(self.dev, &self.layout).expect("alloc");
        for fill in self.fills {
            fill(&mut arena);
        }
        Mem { arena }
    }
}

/// The allocated buffers of a [`Plan`].
pub struct Mem {
    arena: DeviceArena,
}

impl Mem {
    pub fn get<T: DeviceElem>(&self, span: Span<T>) -> DevSlice<'_, T> {
        self.arena.get(span).expect("span of this arena")
    }

    /// The span's contents after the queued work.
    pub fn read<T: DeviceElem>(&self, span: Span<T>) -> Vec<T> {
        self.arena.download(span).expect("download")
    }

    pub fn write<T: DeviceElem>(&mut self, span: Span<T>, data: &[T]) {
        self.arena.upload(span, data).expect("upload")
    }
}

/// Asserts `got == want` bit for bit, naming the first difference.
pub fn assert_bits(what: &str, got: &[f32], want: &[f32]) {
    assert_eq!(got.len(), want.len(), "{what}: lengths");
    if let Some(i) = (0..got.len()).find(|&i| got[i].to_bits() != want[i].to_bits()) {
        panic!(
            "{what}: element {i} is {} (bits {:#x}), want {} ({:#x})",
            got[i],
            got[i].to_bits(),
            want[i],
            want[i].to_bits()
        );
    }
}

/// Asserts `|got - want| <= tol * scale` elementwise.
pub fn assert_close(what: &str, got: &[f32], want: &[f32], tol: f32, scale: f32) {
    assert_eq!(got.len(), want.len(), "{what}: lengths");
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        assert!(
            (g - w).abs() <= tol * scale,
            "{what}: element {i} is {g}, want {w} (tolerance {})",
            tol * scale
        );
    }
}

/// The largest absolute value.
pub fn max_abs(v: &[f32]) -> f32 {
    v.iter().fold(0.0f32, |m, x| m.max(x.abs()))
}

/// Batch sizes the row-invariance tests run: singles, odd sizes, tile edges, the largest.
pub const BATCHES: [usize; 10] = [1, 2, 3, 5, 16, 17, 64, 100, 255, 512];
