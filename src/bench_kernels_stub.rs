//! `routed bench kernels` in a build without CUDA: there is no device kernel to time.

use anyhow::{Result, bail};
use routed_backend::DeviceSpec;
use serde_json::Value;
use std::path::Path;

/// Refuses: the kernels exist only in a build with `--features cuda`.
pub fn run(
    _spec: DeviceSpec,
    _dir: &Path,
    _batch_sizes: &[usize],
    _repeats: usize,
) -> Result<Vec<Value>> {
    bail!("the kernels scenario needs a build with --features cuda")
}
