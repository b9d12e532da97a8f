//! Test-only helpers: the golden-file loader ([`Golden`]) and [`Driver`], which runs a model on
//! private block tables without the engine, for model-level tests.

mod driver;
mod golden;

pub use driver::{Driver, Prefill, Seq};
pub use golden::{Golden, golden_root};

/// Largest absolute difference between two equally long slices.
pub fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len(), "length mismatch");
    a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0.0, f32::max)
}
