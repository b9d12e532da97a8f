//! Per-block row buffers and the two loops that touch every id: the scatter of a step's rows into
//! blocks and the gather of a request's rows out of them.
//!
//! A block's buffer is allocated on its first accepted write and dropped with its rows, so the
//! memory held tracks the blocks that actually carry routing.

use routed_types::ExpertId;

use crate::width::{IdWidth, StoredId};

/// Verdict on one listed block for the step being stored.
pub(crate) const MARK_NONE: u8 = 0;
/// Listed in the step, not yet judged.
pub(crate) const MARK_LISTED: u8 = 1;
/// Rows for this block are written.
pub(crate) const MARK_ACCEPT: u8 = 2;
/// Rows for this block are dropped (stale, freed, lost or refused).
pub(crate) const MARK_DROP: u8 = 3;

/// Sizes shared by every block.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Geometry {
    /// Token slots per block.
    pub(crate) block_size: usize,
    /// MoE layers per row.
    pub(crate) num_moe_layers: usize,
    /// Ids per layer.
    pub(crate) top_k: usize,
    /// 64-bit words of the per-block filled bitmap.
    pub(crate) words_per_block: usize,
}

impl Geometry {
    /// Ids per row.
    pub(crate) fn row_len(&self) -> usize {
        self.num_moe_layers * self.top_k
    }
}

/// One step's rows as the device produced them: `(L, N, K)` int16.
pub(crate) struct StepRows<'a> {
    pub(crate) ids: &'a [i16],
    pub(crate) slot_mapping: &'a [usize],
}

/// What the scatter did, in rows.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct ScatterCount {
    pub(crate) written: usize,
    pub(crate) dropped: usize,
}

/// Every block's buffer, at the store-wide width.
#[derive(Debug)]
pub(crate) enum Buffers {
    Narrow(Vec<Option<Box<[u8]>>>),
    Wide(Vec<Option<Box<[u16]>>>),
}

impl Buffers {
    /// No buffers yet for `num_blocks` blocks.
    pub(crate) fn new(width: IdWidth, num_blocks: usize) -> Self {
        match width {
            IdWidth::U8 => Self::Narrow(vec![None; num_blocks]),
            IdWidth::U16 => Self::Wide(vec![None; num_blocks]),
        }
    }

    /// Gives block `b` a zeroed buffer of `len` ids. Zeros are never read as rows: the filled
    /// bitmap gates every read.
    pub(crate) fn allocate(&mut self, b: usize, len: usize) {
        match self {
            Self::Narrow(v) => v[b] = Some(vec![0; len].into_boxed_slice()),
            Self::Wide(v) => v[b] = Some(vec![0; len].into_boxed_slice()),
        }
    }

    /// Drops block `b`'s buffer; returns whether it had one.
    pub(crate) fn release(&mut self, b: usize) -> bool {
        match self {
            Self::Narrow(v) => v[b].take().is_some(),
            Self::Wide(v) => v[b].take().is_some(),
        }
    }

    /// Drops every buffer.
    pub(crate) fn clear(&mut self) {
        match self {
            Self::Narrow(v) => v.iter_mut().for_each(|b| *b = None),
            Self::Wide(v) => v.iter_mut().for_each(|b| *b = None),
        }
    }

    /// Writes each token of `step` whose block is marked [`MARK_ACCEPT`] and has a buffer.
    pub(crate) fn scatter(
        &mut self,
        geom: Geometry,
        step: &StepRows<'_>,
        marks: &[u8],
        filled: &mut [u64],
    ) -> ScatterCount {
        match self {
            Self::Narrow(v) => scatter(v, geom, step, marks, filled),
            Self::Wide(v) => scatter(v, geom, step, marks, filled),
        }
    }

    /// Appends the rows at offsets `from..to` of block `b` to `out`. The caller checked that the
    /// block has a buffer and that those rows are filled.
    pub(crate) fn gather(
        &self,
        geom: Geometry,
        b: usize,
        from: usize,
        to: usize,
        out: &mut Vec<ExpertId>,
    ) {
        match self {
            Self::Narrow(v) => gather(v, geom, b, from, to, out),
            Self::Wide(v) => gather(v, geom, b, from, to, out),
        }
    }
}

fn scatter<T: StoredId>(
    bufs: &mut [Option<Box<[T]>>],
    geom: Geometry,
    step: &StepRows<'_>,
    marks: &[u8],
    filled: &mut [u64],
) -> ScatterCount {
    let (k, row_len) = (geom.top_k, geom.row_len());
    let num_tokens = step.slot_mapping.len();
    let layer_stride = num_tokens * k;
    let mut count = ScatterCount::default();
    for (n, &slot) in step.slot_mapping.iter().enumerate() {
        let (b, offset) = (slot / geom.block_size, slot % geom.block_size);
        let buf = match (marks[b], bufs[b].as_deref_mut()) {
            (MARK_ACCEPT, Some(buf)) => buf,
            _ => {
                count.dropped += 1;
                continue;
            }
        };
        let dst = &mut buf[offset * row_len..(offset + 1) * row_len];
        let src_token = &step.ids[n * k..];
        for (l, dst_layer) in dst.chunks_exact_mut(k).enumerate() {
            let src = &src_token[l * layer_stride..l * layer_stride + k];
            for (d, &s) in dst_layer.iter_mut().zip(src) {
                *d = T::narrow(s);
            }
        }
        filled[b * geom.words_per_block + offset / 64] |= 1 << (offset % 64);
        count.written += 1;
    }
    count
}

fn gather<T: StoredId>(
    bufs: &[Option<Box<[T]>>],
    geom: Geometry,
    b: usize,
    from: usize,
    to: usize,
    out: &mut Vec<ExpertId>,
) {
    let row_len = geom.row_len();
    let buf = bufs[b].as_deref().expect("caller checked the block has a buffer");
    out.extend(buf[from * row_len..to * row_len].iter().map(|&id| id.widen()));
}
