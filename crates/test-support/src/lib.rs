//! Test-only helpers: the golden-file loader ([`Golden`]), [`Driver`], which runs a model on
//! private block tables without the engine, for model-level tests, and [`run_python`] for the
//! Python client scripts; [`write_other_policy`] derives a second set of weights from a golden
//! checkpoint; [`SplitMix64`] seeds the randomised tests; [`Counting`] counts heap allocations; [`json_object_prefix`]
//! reads a constrained answer.

mod alloc_count;
mod checkpoint;
mod driver;
mod golden;
mod python;

pub use alloc_count::{Counting, num_allocations, num_allocations_here};
pub use checkpoint::write_other_policy;
pub use driver::{Driver, Prefill, Seq};
pub use golden::{Golden, golden_root};
pub use python::{repo_root, run_python};

/// Whether `text` is one JSON object (`Some(true)`), a proper prefix of one (`Some(false)`), or
/// neither (`None`), as serde_json reads it: what a `json_object` response format promises.
pub fn json_object_prefix(text: &str) -> Option<bool> {
    let body = text.trim_start();
    if body.is_empty() {
        return Some(false);
    }
    if !body.starts_with('{') {
        return None;
    }
    // Read without building the value: `1e999` is JSON, out of an f64's range.
    match serde_json::from_str::<serde::de::IgnoredAny>(text) {
        Ok(_) => Some(true),
        Err(e) if e.is_eof() => Some(false),
        Err(_) => None,
    }
}

/// Largest absolute difference between two equally long slices.
pub fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len(), "length mismatch");
    a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0.0, f32::max)
}

/// SplitMix64: a small seeded generator for randomised tests (the same sequence on every
/// machine).
#[derive(Clone, Debug)]
pub struct SplitMix64(pub u64);

impl SplitMix64 {
    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A number in `0..n` (`n > 0`).
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }

    /// Fewer than `most` places to cut `text` into pieces for a stream, in order, each inside
    /// the text and on a character boundary (`text` has at least two characters).
    pub fn cuts(&mut self, text: &str, most: usize) -> Vec<usize> {
        let boundaries: Vec<usize> =
            (1..text.len()).filter(|&i| text.is_char_boundary(i)).collect();
        let mut cuts: Vec<usize> =
            (0..self.below(most)).map(|_| boundaries[self.below(boundaries.len())]).collect();
        cuts.sort_unstable();
        cuts.dedup();
        cuts
    }
}
