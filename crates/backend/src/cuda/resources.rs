//! What ptxas gives each kernel (registers, spills, stack frame, static shared memory), read from
//! its verbose report, without a GPU.
//!
//! A kernel with a stack frame keeps an array in local memory: an index the compiler cannot
//! resolve at compile time, or an array passed by reference to a function it did not inline. On
//! a GPU every access to it goes through the caches, in a hot loop as slow as a global load
//! (the seeded sampler's per-way sums and the expert kernels' accumulators were there once).
//! `tests/cuda_kernels_compile.rs` holds every kernel to no spills and, but for a short list, no
//! stack frame.

use super::{
    compile::{Arch, compile_with},
    source::KernelUnit,
};
use crate::BackendError;

/// One kernel's resources as ptxas reports them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KernelResources {
    /// The kernel's symbol.
    pub name: String,
    /// Registers per thread.
    pub num_registers: u32,
    /// Bytes of registers spilled to local memory (stores).
    pub spill_store_bytes: u32,
    /// Bytes reloaded from spills.
    pub spill_load_bytes: u32,
    /// Bytes of local memory for arrays and spills per thread.
    pub stack_bytes: u32,
    /// Bytes of static shared memory per block.
    pub shared_bytes: u32,
}

/// Compiles `unit` for `arch` with ptxas's report and returns its kernels' resources.
pub fn unit_resources(
    unit: &'static KernelUnit,
    arch: &Arch,
) -> Result<Vec<KernelResources>, BackendError> {
    let (_, log) = compile_with(unit.path, &unit.source(), arch, &["--ptxas-options=-v"])?;
    Ok(parse_report(&log))
}

/// The kernels of a ptxas `-v` log, in its order. Each entry is a `Compiling entry function
/// 'name'` line, then a stack-frame-and-spills line for the kernel and one for each device
/// function it calls that was not inlined, then one with the registers and shared memory. A
/// kernel is charged the largest frame and spills among its own and its callees' (their local
/// memory is the kernel's too).
pub fn parse_report(log: &str) -> Vec<KernelResources> {
    let mut out = Vec::new();
    let mut current: Option<KernelResources> = None;
    for line in log.lines() {
        if let Some(name) = between(line, "Compiling entry function '", "'") {
            current = Some(KernelResources {
                name: name.to_owned(),
                num_registers: 0,
                spill_store_bytes: 0,
                spill_load_bytes: 0,
                stack_bytes: 0,
                shared_bytes: 0,
            });
        } else if let Some(k) = current.as_mut() {
            if line.contains("bytes stack frame") {
                k.stack_bytes = k.stack_bytes.max(number_before(line, " bytes stack frame"));
                let stores = number_before(line, " bytes spill stores");
                k.spill_store_bytes = k.spill_store_bytes.max(stores);
                let loads = number_before(line, " bytes spill loads");
                k.spill_load_bytes = k.spill_load_bytes.max(loads);
            } else if line.contains("Used ") && line.contains(" registers") {
                k.num_registers = number_after(line, "Used ");
                k.shared_bytes = number_before(line, " bytes smem");
                out.extend(current.take());
            }
        }
    }
    out
}

fn between<'a>(line: &'a str, start: &str, end: &str) -> Option<&'a str> {
    let rest = &line[line.find(start)? + start.len()..];
    Some(&rest[..rest.find(end)?])
}

/// The unsigned number ending right before `marker` (0 when the marker is absent).
fn number_before(line: &str, marker: &str) -> u32 {
    let Some(end) = line.find(marker) else { return 0 };
    let head = &line[..end];
    let start = head.rfind(|c: char| !c.is_ascii_digit()).map_or(0, |i| i + 1);
    head[start..].parse().unwrap_or(0)
}

/// The unsigned number starting right after `marker` (0 when absent).
fn number_after(line: &str, marker: &str) -> u32 {
    let Some(at) = line.find(marker) else { return 0 };
    let tail = &line[at + marker.len()..];
    let end = tail.find(|c: char| !c.is_ascii_digit()).unwrap_or(tail.len());
    tail[..end].parse().unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The shape of NVRTC 13's log for two kernels, the second with spills and a stack frame,
    /// and a third whose callee (not inlined) has the frame.
    #[test]
    fn the_report_is_read_per_kernel() {
        let log = "ptxas info    : 0 bytes gmem\n\
            ptxas info    : Compiling entry function 'a_f32' for 'sm_90'\n\
            ptxas info    : Function properties for a_f32\n\
            \x20   0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads\n\
            ptxas info    : Used 32 registers, used 0 barriers, 68 bytes smem\n\
            ptxas info    : Compiling entry function 'b_f32' for 'sm_90'\n\
            ptxas info    : Function properties for b_f32\n\
            \x20   208 bytes stack frame, 4 bytes spill stores, 8 bytes spill loads\n\
            ptxas info    : Used 128 registers, used 1 barriers, 3280 bytes smem\n\
            ptxas info    : Compiling entry function 'c_f32' for 'sm_90'\n\
            ptxas info    : Function properties for _Z6calleev\n\
            \x20   96 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads\n\
            ptxas info    : Function properties for c_f32\n\
            \x20   0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads\n\
            ptxas info    : Used 40 registers, used 0 barriers\n";
        let got = parse_report(log);
        assert_eq!(got.len(), 3);
        assert_eq!(
            (got[0].name.as_str(), got[0].num_registers, got[0].shared_bytes),
            ("a_f32", 32, 68)
        );
        assert_eq!((got[0].stack_bytes, got[0].spill_store_bytes), (0, 0));
        let b = &got[1];
        assert_eq!((b.stack_bytes, b.spill_store_bytes, b.spill_load_bytes), (208, 4, 8));
        assert_eq!((b.num_registers, b.shared_bytes), (128, 3280));
        assert_eq!(
            (got[2].name.as_str(), got[2].stack_bytes, got[2].num_registers),
            ("c_f32", 96, 40)
        );
    }
}
