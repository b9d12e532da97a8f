//! The building blocks the model families are assembled from.

pub(crate) mod attention;
pub(crate) mod mamba;
pub(crate) mod mlp;
pub(crate) mod moe;
pub(crate) mod router;

/// Per-token facts of a step that every layer may need.
pub(crate) struct StepTokens {
    /// Absolute position of each token in its sequence.
    pub positions: Vec<usize>,
    /// Index of each token's sequence in the batch.
    pub seq_of: Vec<usize>,
    /// KV slot of each token.
    pub slots: Vec<usize>,
    /// For each sequence, the range of its tokens in the step.
    pub seq_ranges: Vec<std::ops::Range<usize>>,
}
