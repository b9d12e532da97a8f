//! Which device a model runner computes on.

use crate::{BackendError, cuda};
use std::{fmt, str::FromStr};

/// A device as named on the command line: `cpu`, `cuda:N`, or `cuda-sim` (the CUDA simulator: the
/// CUDA worker and kernels run on the host, for checking the GPU path without a GPU; slow).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum DeviceSpec {
    /// The CPU reference backend.
    #[default]
    Cpu,
    /// CUDA device with this ordinal.
    Cuda(usize),
    /// The CUDA simulator (`cuda::sim`).
    CudaSim,
}

impl FromStr for DeviceSpec {
    type Err = BackendError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "cpu" => Ok(Self::Cpu),
            "cuda" => Ok(Self::Cuda(0)),
            "cuda-sim" => Ok(Self::CudaSim),
            _ => s
                .strip_prefix("cuda:")
                .and_then(|n| n.parse().ok())
                .map(Self::Cuda)
                .ok_or_else(|| BackendError::BadDeviceSpec(s.to_owned())),
        }
    }
}

impl DeviceSpec {
    /// The device of rank `rank` of an expert-parallel group whose rank 0 is on `self`: the GPUs
    /// after a CUDA device (`cuda:2` -> `cuda:3` for rank 1), a simulator of its own for each
    /// rank, the CPU for every CPU rank.
    pub fn for_rank(self, rank: usize) -> Self {
        match self {
            Self::Cuda(ordinal) => Self::Cuda(ordinal + rank),
            other => other,
        }
    }
}

impl fmt::Display for DeviceSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Cpu => f.write_str("cpu"),
            Self::Cuda(n) => write!(f, "cuda:{n}"),
            Self::CudaSim => f.write_str("cuda-sim"),
        }
    }
}

/// An opened device.
#[derive(Clone, Debug)]
pub enum Device {
    /// The CPU.
    Cpu,
    /// A CUDA device (a stub type when built without the `cuda` feature).
    Cuda(cuda::CudaDevice),
}

impl Device {
    /// Opens the device named by `spec`. A CUDA device on a machine without a driver or GPU, or
    /// in a build without CUDA, is an error, never a panic.
    pub fn open(spec: DeviceSpec) -> Result<Self, BackendError> {
        match spec {
            DeviceSpec::Cpu => Ok(Self::Cpu),
            DeviceSpec::Cuda(ordinal) => cuda::CudaDevice::open(ordinal).map(Self::Cuda),
            DeviceSpec::CudaSim => cuda::CudaDevice::simulated().map(Self::Cuda),
        }
    }

    /// Whether this is the CPU.
    pub fn is_cpu(&self) -> bool {
        matches!(self, Self::Cpu)
    }
}

impl fmt::Display for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Cpu => f.write_str("cpu"),
            Self::Cuda(d) if d.is_simulated() => f.write_str("cuda-sim"),
            Self::Cuda(d) => write!(f, "cuda:{} ({})", d.ordinal(), d.name()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_device_specs() {
        assert_eq!("cpu".parse::<DeviceSpec>().unwrap(), DeviceSpec::Cpu);
        assert_eq!("cuda:1".parse::<DeviceSpec>().unwrap(), DeviceSpec::Cuda(1));
        assert_eq!("cuda".parse::<DeviceSpec>().unwrap(), DeviceSpec::Cuda(0));
        assert_eq!("cuda-sim".parse::<DeviceSpec>().unwrap(), DeviceSpec::CudaSim);
        assert_eq!(DeviceSpec::CudaSim.to_string(), "cuda-sim");
        assert!("gpu".parse::<DeviceSpec>().is_err());
        assert!("cuda:x".parse::<DeviceSpec>().is_err());
    }

    #[test]
    fn ranks_take_the_gpus_after_the_first() {
        assert_eq!(DeviceSpec::Cuda(2).for_rank(0), DeviceSpec::Cuda(2));
        assert_eq!(DeviceSpec::Cuda(2).for_rank(3), DeviceSpec::Cuda(5));
        assert_eq!(DeviceSpec::CudaSim.for_rank(1), DeviceSpec::CudaSim);
        assert_eq!(DeviceSpec::Cpu.for_rank(1), DeviceSpec::Cpu);
    }

    #[test]
    fn cuda_without_gpu_is_an_error_not_a_panic() {
        // CI machines have no NVIDIA driver; this must come back as an error either way (no
        // driver, or no CUDA in this build). On a GPU machine with the feature it may succeed.
        match Device::open(DeviceSpec::Cuda(0)) {
            Ok(dev) => assert!(!dev.is_cpu()),
            Err(e) => assert!(!e.to_string().is_empty()),
        }
    }
}
