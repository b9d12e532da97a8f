//! Finding the CUDA libraries before cudarc touches them.
//!
//! cudarc loads each library lazily by name and panics when it is missing or lacks a symbol, so
//! every entry point here probes first and turns absence into a [`BackendError`].
//!
//! NVRTC is looked up as `libnvrtc.so`, `libnvrtc.so.13`, ... through the dynamic loader's search
//! path (`LD_LIBRARY_PATH`, the loader cache). `ROUTED_NVRTC_LIB` may name the library file
//! instead (for example the one the `nvidia-cuda-nvrtc` Python wheel ships): it is loaded first and
//! kept loaded, and the loader then resolves cudarc's lookup of `libnvrtc.so.13` to it by its
//! soname. (cudarc tries the unversioned `libnvrtc.so` first: one on the loader's path still wins.)

use crate::BackendError;
use cudarc::{cublas, cublaslt, driver, nvrtc};
use std::sync::OnceLock;

/// The environment variable that may name the NVRTC library file.
pub const NVRTC_LIB_ENV: &str = "ROUTED_NVRTC_LIB";

/// The oldest driver the `cuda-13000` bindings can call without missing symbols.
pub const MIN_DRIVER_VERSION: i32 = 13000;

/// A CUDA library the backend may load.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CudaLibrary {
    /// `libcuda`, the driver.
    Driver,
    /// `libnvrtc`, the run-time compiler of the kernels.
    Nvrtc,
    /// `libcublas`.
    Cublas,
    /// `libcublasLt`.
    CublasLt,
}

impl CudaLibrary {
    /// The library's name as errors report it.
    pub fn name(self) -> &'static str {
        match self {
            Self::Driver => "libcuda",
            Self::Nvrtc => "libnvrtc",
            Self::Cublas => "libcublas",
            Self::CublasLt => "libcublasLt",
        }
    }

    /// Whether the library can be loaded on this machine.
    pub fn is_present(self) -> bool {
        if self == Self::Nvrtc {
            preload_nvrtc();
        }
        // SAFETY: these only try to open the shared library and close it again.
        unsafe {
            match self {
                Self::Driver => driver::sys::is_culib_present(),
                Self::Nvrtc => nvrtc::sys::is_culib_present(),
                Self::Cublas => cublas::sys::is_culib_present(),
                Self::CublasLt => cublaslt::sys::is_culib_present(),
            }
        }
    }

    /// `Ok` if the library can be loaded, else the error that says how to provide it.
    pub fn require(self) -> Result<(), BackendError> {
        if self.is_present() {
            return Ok(());
        }
        if self == Self::Driver {
            return Err(BackendError::NoCudaDriver);
        }
        let mut hint = String::from("put its directory on LD_LIBRARY_PATH");
        if self == Self::Nvrtc {
            hint.push_str(&format!(" or name the file in {NVRTC_LIB_ENV}"));
            if let Some(err) = preload_error() {
                hint.push_str(&format!(" ({NVRTC_LIB_ENV}: {err})"));
            }
        }
        Err(BackendError::MissingLibrary { name: self.name(), hint })
    }
}

/// The outcome of loading `ROUTED_NVRTC_LIB`: the library kept loaded for the process, or why it
/// could not be loaded; `None` when the variable is unset.
fn preloaded() -> &'static Option<Result<libloading::Library, String>> {
    static NVRTC: OnceLock<Option<Result<libloading::Library, String>>> = OnceLock::new();
    NVRTC.get_or_init(|| {
        let path = std::env::var_os(NVRTC_LIB_ENV)?;
        // SAFETY: loading NVRTC runs no initialisers with preconditions of ours.
        Some(unsafe { libloading::Library::new(&path) }.map_err(|e| format!("{path:?}: {e}")))
    })
}

fn preload_nvrtc() {
    let _ = preloaded();
}

fn preload_error() -> Option<&'static str> {
    match preloaded() {
        Some(Err(e)) => Some(e),
        _ => None,
    }
}

/// The driver's CUDA version (`13000` for 13.0). The driver library must be present.
pub fn driver_version() -> Result<i32, BackendError> {
    CudaLibrary::Driver.require()?;
    let mut version = 0;
    // SAFETY: the library is present and the symbol is in every driver; it writes one int.
    unsafe { driver::sys::cuDriverGetVersion(&mut version) }
        .result()
        .map_err(|e| BackendError::Driver(e.to_string()))?;
    Ok(version)
}

/// The NVRTC version as `(major, minor)`. NVRTC must be present.
pub fn nvrtc_version() -> Result<(i32, i32), BackendError> {
    CudaLibrary::Nvrtc.require()?;
    let (mut major, mut minor) = (0, 0);
    // SAFETY: the library is present; the call writes two ints.
    unsafe { nvrtc::sys::nvrtcVersion(&mut major, &mut minor) }.result().map_err(|e| {
        BackendError::MissingLibrary { name: "libnvrtc", hint: format!("nvrtcVersion failed: {e}") }
    })?;
    Ok((major, minor))
}

/// Checks that the driver is present and at least [`MIN_DRIVER_VERSION`].
pub fn check_driver() -> Result<i32, BackendError> {
    let found = driver_version()?;
    if found < MIN_DRIVER_VERSION {
        return Err(BackendError::DriverTooOld { found, required: MIN_DRIVER_VERSION });
    }
    Ok(found)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn probing_a_library_never_panics_and_require_agrees() {
        for lib in
            [CudaLibrary::Driver, CudaLibrary::Nvrtc, CudaLibrary::Cublas, CudaLibrary::CublasLt]
        {
            match lib.require() {
                Ok(()) => assert!(lib.is_present()),
                Err(BackendError::NoCudaDriver) => assert_eq!(lib, CudaLibrary::Driver),
                Err(BackendError::MissingLibrary { name, hint }) => {
                    assert_eq!(name, lib.name());
                    assert!(hint.contains("LD_LIBRARY_PATH"));
                }
                Err(e) => panic!("unexpected error for {}: {e}", lib.name()),
            }
        }
    }

    #[test]
    fn versions_are_errors_without_the_libraries() {
        match driver_version() {
            Ok(v) => assert!(v > 0),
            Err(e) => assert!(matches!(e, BackendError::NoCudaDriver), "{e}"),
        }
        match nvrtc_version() {
            Ok((major, _)) => assert!(major >= 11),
            Err(e) => assert!(matches!(e, BackendError::MissingLibrary { .. }), "{e}"),
        }
    }
}
