//! The exchange of expert rows between the GPUs of an expert-parallel group, through page-locked
//! host memory and the group's collective.
//!
//! Every rank routes the same tokens to the same experts (the router and everything before it is
//! replicated and computed in the same order) and sorts the (token, rank) pairs the same way, so
//! the sorted rows of rank r's experts are one contiguous run on every rank. After its expert
//! products a rank copies its run to the host at the run's own offset, the collective's
//! all-gather fills in the other runs, and they go back to the device around its own: every rank
//! then combines exactly the rows one GPU would have computed, in the same order, and the result
//! is bitwise that of a single GPU. The step waits on the host twice per MoE layer (for the
//! run boundaries, then for the run), which is why decode steps of a group run eagerly rather
//! than as CUDA graphs.

use crate::error::Result;
use routed_backend::{
    collective::Collective,
    cuda::{CudaDevice, DevSlice, host::PinnedBuffer, ops::ExpertShard},
};
use std::{ops::Range, sync::Arc};

/// One rank's host buffers for the exchange, sized for the largest step.
pub(crate) struct Exchange {
    ranks: Arc<dyn Collective>,
    /// The sort's padded row starts of every expert, and the end, `[num_experts + 1]`.
    starts: PinnedBuffer<i32>,
    /// The expert rows of the largest step, `[max_sorted_rows, hidden]`.
    rows: PinnedBuffer<f32>,
    /// Each rank's run of `rows`, in elements.
    segments: Vec<Range<usize>>,
}

impl Exchange {
    /// Host buffers for `num_experts` experts and up to `max_sorted_rows` rows of `hidden`.
    pub fn new(
        dev: &CudaDevice,
        ranks: Arc<dyn Collective>,
        num_experts: usize,
        max_sorted_rows: usize,
        hidden: usize,
    ) -> Result<Self> {
        Ok(Self {
            starts: PinnedBuffer::new(dev, num_experts + 1)?,
            rows: PinnedBuffer::new(dev, max_sorted_rows * hidden)?,
            segments: Vec::with_capacity(ranks.world_size()),
            ranks,
        })
    }

    /// Fills the other ranks' rows of `expert_out` (`[max_sorted_rows, hidden]`, sorted as
    /// `expert_starts` says) once this rank's expert products for `shard` are queued on the
    /// compute stream, and returns with the other ranks' rows queued back behind them.
    pub fn all_gather(
        &mut self,
        dev: &CudaDevice,
        expert_starts: DevSlice<'_, i32>,
        expert_out: DevSlice<'_, f32>,
        shard: ExpertShard,
        hidden: usize,
    ) -> Result<()> {
        let stream = dev.compute_stream();
        self.starts.copy_from(expert_starts, stream)?;
        let starts = self.starts.wait()?;
        // Rank r holds experts r * per .. (r + 1) * per (the loader's split).
        let per = shard.num_local;
        self.segments.clear();
        self.segments.extend((0..self.ranks.world_size()).map(|r| {
            let row = |e: usize| starts[e] as usize * hidden;
            row(r * per)..row((r + 1) * per)
        }));
        let own = self.segments[self.ranks.rank()].clone();
        let end = self.segments.last().map_or(0, |s| s.end);
        let run = |range: &Range<usize>| slice(expert_out, range);
        self.rows.copy_from_at(run(&own)?, own.start, stream)?;
        let rows = self.rows.host_mut()?;
        self.ranks.all_gather(&mut rows[..end], &self.segments)?;
        self.rows.copy_to_at(run(&(0..own.start))?, 0, stream)?;
        self.rows.copy_to_at(run(&(own.end..end))?, own.end, stream)?;
        Ok(())
    }
}

fn slice<'a>(s: DevSlice<'a, f32>, range: &Range<usize>) -> Result<DevSlice<'a, f32>> {
    s.sub(range.start, range.len()).ok_or_else(|| {
        crate::error::ModelError::Device(routed_backend::BackendError::Memory(format!(
            "expert rows {range:?} past the buffer of {}",
            s.len()
        )))
    })
}
