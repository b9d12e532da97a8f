//! Every kernel compiles with NVRTC to CUBIN for the architectures routed targets, without a GPU:
//! only `libnvrtc` is needed. CI installs it (the `nvidia-cuda-nvrtc` wheel) and points
//! `ROUTED_NVRTC_LIB` at it; under `CI=true` a missing library fails the test instead of skipping.
#![cfg(feature = "cuda")]

use routed_backend::cuda::{
    compile::{Arch, compile},
    libs::{self, CudaLibrary},
    resources::unit_resources,
    source::{KernelUnit, UNITS},
};

/// Ampere (A100) and Hopper (H100, H200).
const ARCHS: [(i32, i32); 2] = [(8, 0), (9, 0)];

fn nvrtc_or_skip() -> bool {
    if CudaLibrary::Nvrtc.is_present() {
        return true;
    }
    let why = format!(
        "libnvrtc not found: install the nvidia-cuda-nvrtc wheel and set {} to its libnvrtc.so.13",
        libs::NVRTC_LIB_ENV
    );
    if std::env::var("CI").is_ok_and(|v| v == "true") {
        panic!("{why} (CI must compile every kernel)");
    }
    eprintln!("skipping the NVRTC compile test: {why}");
    false
}

fn check_unit(unit: &'static KernelUnit, arch: &Arch) {
    let bin = compile(unit.path, &unit.source(), arch).unwrap_or_else(|e| panic!("{e}"));
    assert!(bin.starts_with(b"\x7fELF"), "{} for {}: not a CUBIN", unit.path, arch.as_str());
    for kernel in unit.kernels() {
        let name = kernel.name().as_bytes();
        assert!(
            bin.windows(name.len()).any(|w| w == name),
            "{} for {}: no symbol {}",
            unit.path,
            arch.as_str(),
            kernel.name()
        );
    }
}

#[test]
fn every_kernel_compiles_to_cubin_for_sm80_and_sm90() {
    if !nvrtc_or_skip() {
        return;
    }
    let (major, minor) = libs::nvrtc_version().expect("NVRTC reports its version");
    eprintln!("NVRTC {major}.{minor}: compiling {} units for {ARCHS:?}", UNITS.len());
    let jobs: Vec<(&'static KernelUnit, Arch)> = UNITS
        .iter()
        .flat_map(|&u| ARCHS.iter().map(move |&(ma, mi)| (u, Arch::from_capability(ma, mi))))
        .collect();
    // Two compiles at a time: CI has two cores.
    std::thread::scope(|s| {
        for half in jobs.chunks(jobs.len().div_ceil(2)) {
            s.spawn(move || half.iter().for_each(|(u, a)| check_unit(u, a)));
        }
    });
}

#[test]
fn a_kernel_that_does_not_compile_is_an_error_with_the_log() {
    if !nvrtc_or_skip() {
        return;
    }
    let err = compile(
        "broken.cu",
        "extern \"C\" __global__ void k() { undefined_thing(); }",
        &Arch::from_capability(9, 0),
    )
    .expect_err("an undefined identifier does not compile");
    let msg = err.to_string();
    assert!(msg.contains("broken.cu") && msg.contains("undefined_thing"), "{msg}");
}

/// No kernel spills registers or keeps arrays in local memory (`routed_backend::cuda::resources`
/// says why that matters), on the H100's architecture. With
/// `--nocapture` it prints every kernel's registers, spills, stack and shared memory.
#[test]
fn no_kernel_spills_or_keeps_its_arrays_in_local_memory() {
    if !nvrtc_or_skip() {
        return;
    }
    let arch = Arch::from_capability(9, 0);
    let mut bad = Vec::new();
    eprintln!(
        "{:32} {:>5} {:>9} {:>9} {:>6} {:>6}",
        "kernel", "regs", "spill st", "spill ld", "stack", "smem"
    );
    for unit in UNITS {
        let kernels = unit_resources(unit, &arch).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(kernels.len(), unit.kernels().count(), "{}: a report per kernel", unit.path);
        for k in kernels {
            eprintln!(
                "{:32} {:5} {:9} {:9} {:6} {:6}",
                k.name,
                k.num_registers,
                k.spill_store_bytes,
                k.spill_load_bytes,
                k.stack_bytes,
                k.shared_bytes
            );
            if k.spill_store_bytes + k.spill_load_bytes > 0 || k.stack_bytes > 0 {
                bad.push(format!(
                    "{} ({} stack, {} spilled)",
                    k.name, k.stack_bytes, k.spill_store_bytes
                ));
            }
        }
    }
    assert!(bad.is_empty(), "kernels with local memory: {bad:?}");
}
