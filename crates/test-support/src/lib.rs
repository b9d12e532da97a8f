//! Test-only helpers: the golden-file loader ([`Golden`]), [`Driver`], which runs a model on
//! private block tables without the engine, for model-level tests, and [`run_python`] for the
//! Python client scripts; [`write_other_policy`] derives a second set of weights from a golden
//! checkpoint.

mod checkpoint;
mod driver;
mod golden;
mod python;

pub use checkpoint::write_other_policy;
pub use driver::{Driver, Prefill, Seq};
pub use golden::{Golden, golden_root};
pub use python::{repo_root, run_python};

/// Largest absolute difference between two equally long slices.
pub fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len(), "length mismatch");
    a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0.0, f32::max)
}
