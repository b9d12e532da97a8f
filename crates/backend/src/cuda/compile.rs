//! Compiling the kernel units with NVRTC to CUBIN, with an on-disk cache.
//!
//! CUBIN, not PTX: a CUBIN built by any 13.x NVRTC loads on any 13.x driver, whereas PTX from an
//! NVRTC newer than the driver does not load at all. cudarc's `compile_ptx*` only returns PTX, so
//! this goes through `nvrtc::result` and the raw `nvrtcGetCUBIN`.
//!
//! The cache key hashes everything the CUBIN depends on: the unit's full source, the options, the
//! NVRTC version and the architecture. Files live in `$XDG_CACHE_HOME/routed/kernels/` (else
//! `~/.cache/routed/kernels/`); `ROUTED_KERNEL_CACHE` overrides the folder. A cache that cannot be
//! read or written only costs a compile.

use super::{libs, source::KernelUnit};
use crate::BackendError;
use cudarc::nvrtc::{result, sys};
use std::{ffi::CString, path::PathBuf};

/// Options every unit is compiled with. `--fmad=false` keeps `a * b + c` two rounded operations
/// (the CPU kernels never contract), and the precise division and square root are the IEEE ones the
/// CPU uses; the defaults say the same, but they are part of the cache key, so they are spelled out.
pub const COMPILE_OPTIONS: &[&str] =
    &["--std=c++17", "--fmad=false", "--ftz=false", "--prec-div=true", "--prec-sqrt=true"];

/// The environment variable that overrides the kernel cache folder.
pub const CACHE_DIR_ENV: &str = "ROUTED_KERNEL_CACHE";

/// A real architecture name NVRTC turns into CUBIN: `sm_90` for compute capability 9.0.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Arch(String);

impl Arch {
    /// The architecture of a device of compute capability `major.minor`.
    pub fn from_capability(major: i32, minor: i32) -> Self {
        Self(format!("sm_{major}{minor}"))
    }

    /// The simulator's label (never given to NVRTC).
    pub fn simulator() -> Self {
        Self("sim".to_owned())
    }

    /// Whether it has bf16 tensor cores (`mma.sync` with bf16 inputs: sm_80 and later). The
    /// simulator has them.
    pub fn has_bf16_mma(&self) -> bool {
        self.major().map_or(self.0 == "sim", |v| v >= 80)
    }

    /// The number of `sm_<number>[suffix]` (90 for `sm_90a`); `None` for the simulator.
    fn major(&self) -> Option<u32> {
        let digits = self.0.strip_prefix("sm_")?;
        let end = digits.find(|c: char| !c.is_ascii_digit()).unwrap_or(digits.len());
        digits[..end].parse().ok()
    }

    /// Whether it has thread block clusters (sm_90 and later): a row's sampling may then span
    /// several blocks ([`sample_blocks_per_row`]). The simulator has them.
    ///
    /// [`sample_blocks_per_row`]: super::launch::sample_blocks_per_row
    pub fn has_clusters(&self) -> bool {
        self.major().map_or(self.0 == "sim", |v| v >= 90)
    }

    /// The name, as NVRTC's `--gpu-architecture` takes it.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// Compiles `unit` for `arch`, from the cache when a CUBIN for the same key is there.
pub fn cubin(unit: &'static KernelUnit, arch: &Arch) -> Result<Vec<u8>, BackendError> {
    let nvrtc = libs::nvrtc_version()?;
    let src = unit.source();
    let path =
        cache_dir().map(|d| d.join(cache_file_name(unit.path, &cache_key(&src, arch, nvrtc))));
    if let Some(bin) = path.as_ref().and_then(|p| std::fs::read(p).ok())
        && looks_like_cubin(&bin)
    {
        return Ok(bin);
    }
    let bin = compile(unit.path, &src, arch)?;
    if let Some(path) = path {
        store(&path, &bin);
    }
    Ok(bin)
}

/// Compiles a source to CUBIN without the cache. NVRTC must be present
/// ([`libs::CudaLibrary::require`]).
pub fn compile(name: &'static str, src: &str, arch: &Arch) -> Result<Vec<u8>, BackendError> {
    compile_with(name, src, arch, &[]).map(|(bin, _)| bin)
}

/// Compiles a source to CUBIN with options beyond [`COMPILE_OPTIONS`]; returns the CUBIN and
/// NVRTC's log (where `--ptxas-options=-v` puts its resource report).
pub(crate) fn compile_with(
    name: &'static str,
    src: &str,
    arch: &Arch,
    extra: &[&str],
) -> Result<(Vec<u8>, String), BackendError> {
    let fail = |log: String| BackendError::Compile { unit: name, arch: arch.0.clone(), log };
    let c_src = CString::new(src).map_err(|_| fail("the source holds a NUL byte".into()))?;
    let c_name = CString::new(name).map_err(|_| fail("the name holds a NUL byte".into()))?;
    let prog = result::create_program(&c_src, Some(&c_name)).map_err(|e| fail(e.to_string()))?;
    let mut options: Vec<String> = vec![format!("--gpu-architecture={}", arch.0)];
    options.extend(COMPILE_OPTIONS.iter().chain(extra).map(|o| o.to_string()));
    // SAFETY: `prog` was just created and is destroyed exactly once, below.
    let compiled = unsafe { result::compile_program(prog, &options) };
    let out = match compiled {
        // SAFETY: as above; the program compiled.
        Ok(()) => unsafe { get_cubin(prog) }
            .map(|bin| (bin, unsafe { program_log(prog) }))
            .map_err(|e| fail(e.to_string())),
        // SAFETY: as above.
        Err(e) => Err(fail(format!("{e}\n{}", unsafe { program_log(prog) }))),
    };
    // SAFETY: as above. A failure to free the program leaks it, nothing worse.
    let _ = unsafe { result::destroy_program(prog) };
    out
}

/// # Safety
/// `prog` is a live, compiled program.
unsafe fn get_cubin(prog: sys::nvrtcProgram) -> Result<Vec<u8>, result::NvrtcError> {
    let mut size = 0usize;
    // SAFETY: the caller's contract; the calls write the size, then that many bytes.
    unsafe { sys::nvrtcGetCUBINSize(prog, &mut size) }.result()?;
    let mut bin = vec![0u8; size];
    // SAFETY: as above; `bin` holds `size` bytes.
    unsafe { sys::nvrtcGetCUBIN(prog, bin.as_mut_ptr().cast()) }.result()?;
    Ok(bin)
}

/// # Safety
/// `prog` is a live program.
unsafe fn program_log(prog: sys::nvrtcProgram) -> String {
    // SAFETY: the caller's contract.
    match unsafe { result::get_program_log(prog) } {
        Ok(log) => {
            let bytes: Vec<u8> = log.iter().map(|&c| c as u8).take_while(|&b| b != 0).collect();
            String::from_utf8_lossy(&bytes).into_owned()
        }
        Err(e) => format!("(no log: {e})"),
    }
}

/// A CUBIN is an ELF file; anything else in the cache (a torn write) is recompiled.
fn looks_like_cubin(bin: &[u8]) -> bool {
    bin.len() > 64 && bin.starts_with(b"\x7fELF")
}

/// FNV-1a over every input of the compile, each field length-prefixed so that no two different
/// inputs concatenate to the same bytes. Stable across builds and toolchains, unlike std's hasher.
pub fn cache_key(src: &str, arch: &Arch, nvrtc: (i32, i32)) -> u64 {
    let mut h = Fnv::new();
    h.field(src.as_bytes());
    h.field(arch.0.as_bytes());
    for option in COMPILE_OPTIONS {
        h.field(option.as_bytes());
    }
    h.field(&nvrtc.0.to_le_bytes());
    h.field(&nvrtc.1.to_le_bytes());
    h.0
}

/// FNV-1a over length-prefixed fields (the simulator's cache keys use it too).
pub(crate) fn hash_fields<'a>(fields: impl IntoIterator<Item = &'a [u8]>) -> u64 {
    let mut h = Fnv::new();
    for f in fields {
        h.field(f);
    }
    h.0
}

struct Fnv(u64);

impl Fnv {
    fn new() -> Self {
        Self(0xcbf2_9ce4_8422_2325)
    }

    fn bytes(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 ^= b as u64;
            self.0 = self.0.wrapping_mul(0x0000_0100_0000_01b3);
        }
    }

    fn field(&mut self, bytes: &[u8]) {
        self.bytes(&(bytes.len() as u64).to_le_bytes());
        self.bytes(bytes);
    }
}

/// `common/norm.cu` with key `k` -> `common-norm-<k>.cubin`.
pub fn cache_file_name(unit: &str, key: &u64) -> String {
    let stem = unit.trim_end_matches(".cu").replace('/', "-");
    format!("{stem}-{key:016x}.cubin")
}

/// The cache folder, if the environment names a home for it.
pub fn cache_dir() -> Option<PathBuf> {
    cache_dir_from(|name| std::env::var_os(name))
}

/// [`cache_dir`] over any environment (tests pass their own).
pub fn cache_dir_from(env: impl Fn(&str) -> Option<std::ffi::OsString>) -> Option<PathBuf> {
    let nonempty = |name: &str| env(name).filter(|v| !v.is_empty()).map(PathBuf::from);
    if let Some(dir) = nonempty(CACHE_DIR_ENV) {
        return Some(dir);
    }
    let base = nonempty("XDG_CACHE_HOME").or_else(|| nonempty("HOME").map(|h| h.join(".cache")))?;
    Some(base.join("routed").join("kernels"))
}

/// A temporary file extension no other writer uses at the same time: threads of one process, as
/// well as processes, may build the same file at once.
pub(crate) fn tmp_suffix() -> String {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    format!("tmp{}-{n}", std::process::id())
}

/// Writes the CUBIN under a temporary name and renames it into place, so a reader never sees a
/// torn file; a failure leaves the cache without it.
pub(crate) fn store(path: &std::path::Path, bin: &[u8]) {
    let Some(dir) = path.parent() else { return };
    if std::fs::create_dir_all(dir).is_err() {
        return;
    }
    let tmp = path.with_extension(tmp_suffix());
    if std::fs::write(&tmp, bin).is_ok() && std::fs::rename(&tmp, path).is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::ffi::OsString;

    #[test]
    fn the_key_changes_with_every_input() {
        let arch = Arch::from_capability(9, 0);
        let base = cache_key("src", &arch, (13, 0));
        assert_eq!(base, cache_key("src", &arch, (13, 0)));
        assert_ne!(base, cache_key("src ", &arch, (13, 0)));
        assert_ne!(base, cache_key("src", &Arch::from_capability(8, 0), (13, 0)));
        assert_ne!(base, cache_key("src", &arch, (13, 1)));
        assert_ne!(base, cache_key("src", &arch, (12, 0)));
        assert_eq!(arch.as_str(), "sm_90");
    }

    #[test]
    fn bf16_tensor_cores_from_sm_80() {
        let has = |major, minor| Arch::from_capability(major, minor).has_bf16_mma();
        assert!(!has(7, 5) && has(8, 0) && has(8, 6) && has(9, 0) && has(10, 0) && has(12, 0));
        assert!(Arch::simulator().has_bf16_mma());
        assert!(Arch("sm_90a".into()).has_bf16_mma() && !Arch("compute_75".into()).has_bf16_mma());
    }

    #[test]
    fn clusters_from_sm_90() {
        let has = |major, minor| Arch::from_capability(major, minor).has_clusters();
        assert!(!has(8, 0) && !has(8, 9) && has(9, 0) && has(10, 0) && has(12, 0));
        assert!(Arch::simulator().has_clusters() && Arch("sm_90a".into()).has_clusters());
    }

    #[test]
    fn file_names_are_flat_and_carry_the_key() {
        assert_eq!(cache_file_name("common/norm.cu", &0xab), "common-norm-00000000000000ab.cubin");
    }

    #[test]
    fn the_cache_folder_follows_the_environment() {
        let env = |pairs: &'static [(&'static str, &'static str)]| {
            move |name: &str| pairs.iter().find(|(k, _)| *k == name).map(|(_, v)| OsString::from(v))
        };
        assert_eq!(
            cache_dir_from(env(&[(CACHE_DIR_ENV, "/c"), ("HOME", "/h")])),
            Some("/c".into())
        );
        assert_eq!(
            cache_dir_from(env(&[("XDG_CACHE_HOME", "/x"), ("HOME", "/h")])),
            Some("/x/routed/kernels".into())
        );
        assert_eq!(
            cache_dir_from(env(&[("XDG_CACHE_HOME", ""), ("HOME", "/h")])),
            Some("/h/.cache/routed/kernels".into())
        );
        assert_eq!(cache_dir_from(env(&[])), None);
    }

    #[test]
    fn only_elf_files_count_as_cached_cubins() {
        let mut elf = b"\x7fELF".to_vec();
        elf.resize(100, 0);
        assert!(looks_like_cubin(&elf));
        assert!(!looks_like_cubin(b"\x7fELF"));
        assert!(!looks_like_cubin(&[0u8; 100]));
    }
}
