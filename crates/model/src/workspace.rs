//! Buffers a forward reuses from step to step, so a steady stream of steps allocates no
//! activations: each buffer grows to the largest step seen and stays.

/// Scratch of one forward; [`crate::Model`] keeps a pool of them (one per concurrent forward).
#[derive(Default)]
pub(crate) struct Workspace {
    /// The residual stream, `[n, hidden]`.
    pub x: Vec<f32>,
    pub normed: Vec<f32>,
    /// A block's output before it joins the residual stream.
    pub branch: Vec<f32>,
    pub attention: AttentionWork,
    pub mamba: MambaWork,
    pub moe: MoeWork,
    /// A dense MLP's (or shared expert's) intermediate activations.
    pub mlp: MlpWork,
}

#[derive(Default)]
pub(crate) struct AttentionWork {
    pub q: Vec<f32>,
    pub k: Vec<f32>,
    pub v: Vec<f32>,
    /// Head outputs per (sequence, KV head) work item, then permuted into `heads`.
    pub by_item: Vec<f32>,
    pub heads: Vec<f32>,
}

#[derive(Default)]
pub(crate) struct MambaWork {
    pub proj: Vec<f32>,
    pub y: Vec<f32>,
    pub scan: ScanBuffers,
}

/// The buffers of one segment's scan.
#[derive(Default)]
pub(crate) struct ScanBuffers {
    /// `[token][conv_dim]`: the conv outputs after SiLU.
    pub xbc: Vec<f32>,
    /// `[head][token][head_dim]`: each head's outputs.
    pub by_head: Vec<f32>,
    /// `[head][state_size]`: `dt * B`, per head.
    pub dtb: Vec<f32>,
}

#[derive(Default)]
pub(crate) struct MoeWork {
    pub logits: Vec<f32>,
    pub ids: Vec<usize>,
    pub weights: Vec<f32>,
    /// Counting sort of (token, rank) pairs by expert.
    pub starts: Vec<usize>,
    pub fill: Vec<usize>,
    pub order: Vec<usize>,
    pub slot_of: Vec<usize>,
    /// Expert outputs in sorted-pair order, `[n * top_k, hidden]`.
    pub sorted_out: Vec<f32>,
    /// Each rank's range of `sorted_out` (expert parallelism).
    pub segments: Vec<std::ops::Range<usize>>,
    /// Expert intermediates in sorted-pair order, `[n * top_k, inter]`.
    pub mlp: MlpWork,
    pub shared_out: Vec<f32>,
}

#[derive(Default)]
pub(crate) struct MlpWork {
    pub up: Vec<f32>,
    pub gate: Vec<f32>,
}

/// `buf` as `len` zeros, reusing its allocation.
pub(crate) fn zeroed<T: Copy + Default>(buf: &mut Vec<T>, len: usize) -> &mut [T] {
    buf.clear();
    buf.resize(len, T::default());
    buf
}
