//! The exchange of expert rows between the GPUs of an expert-parallel group: straight between
//! the devices where they read each other's memory, else through page-locked host memory and the
//! group's collective.
//!
//! Every rank routes the same tokens to the same experts (the router and everything before it is
//! replicated and computed in the same order) and sorts the (token, rank) pairs the same way, so
//! the sorted rows of rank r's experts are one contiguous run on every rank. After its expert
//! products each rank fills in the other ranks' runs, so that every rank combines exactly the rows
//! one GPU would have computed, in the same order, and the result is bitwise that of a single GPU.
//!
//! * [`PeerExchange`]: a kernel copies the other runs from the peers' buffers. The host orders
//!   the ranks' streams and never waits for a device, but it meets the other ranks twice per MoE
//!   layer, so a group's steps still run eagerly rather than as CUDA graphs.
//! * [`HostExchange`]: the rank's run goes to the host at its own offset, the collective's
//!   all-gather fills in the others', and they go back to the device around it. The step waits
//!   on the host twice per MoE layer (for the run boundaries, then for the run).

use crate::error::{ModelError, Result};
use routed_backend::{
    BackendError,
    collective::Collective,
    cuda::{
        ArenaLayout, CudaDevice, DevSlice, DeviceArena, Span,
        host::PinnedBuffer,
        ops::ExpertShard,
        peer::{PeerLink, PeerPhase},
    },
};
use std::{ops::Range, sync::Arc};

/// How one rank gets the other ranks' expert rows.
pub(crate) enum Exchange {
    /// From the peers' device memory.
    Peer(PeerExchange),
    /// Through host memory.
    Host(HostExchange),
}

impl Exchange {
    /// The exchange of a rank whose expert rows are `expert_out` (`[num_pairs, hidden]`):
    /// between the devices if `dev` was linked to the other ranks' (which then read
    /// `expert_out`), else through host memory.
    pub fn new(
        dev: &CudaDevice,
        ranks: Arc<dyn Collective>,
        (num_experts, hidden): (usize, usize),
        expert_out: DevSlice<'_, f32>,
    ) -> Result<Self> {
        match dev.peer_link() {
            Some(link) => Ok(Self::Peer(PeerExchange::new(dev, ranks, link.clone(), expert_out)?)),
            None => {
                let rows = expert_out.len() / hidden.max(1);
                Ok(Self::Host(HostExchange::new(dev, ranks, num_experts, rows, hidden)?))
            }
        }
    }

    /// Fills the other ranks' rows of `expert_out` (sorted as `expert_starts` says, for a step of
    /// `num_pairs` (token, rank) pairs) once this rank's expert products for `shard` are queued
    /// on the compute stream, and returns with the combine free to be queued behind.
    pub fn all_gather(
        &mut self,
        dev: &CudaDevice,
        expert_starts: DevSlice<'_, i32>,
        expert_out: DevSlice<'_, f32>,
        (num_pairs, shard): (usize, ExpertShard),
        hidden: usize,
    ) -> Result<()> {
        match self {
            Self::Peer(p) => {
                p.all_gather(dev, expert_starts, expert_out, (num_pairs, shard), hidden)
            }
            Self::Host(h) => h.all_gather(dev, expert_starts, expert_out, shard, hidden),
        }
    }
}

/// The exchange between GPUs that read each other's memory.
///
/// Per MoE layer, on the compute stream: this rank signals that its rows are written, and once
/// every rank has signalled (a barrier on the host), waits for the others' signals, copies their
/// runs from their buffers (`moe_gather_peer_rows`), signals that it has read them, and once every
/// rank has done so, waits for the others' reads: a rank's next expert products, which overwrite
/// its rows, are queued behind every other rank's copy of them.
pub(crate) struct PeerExchange {
    ranks: Arc<dyn Collective>,
    link: PeerLink,
    /// The device addresses of every rank's expert rows, `[world_size]`.
    table: DeviceArena,
    table_span: Span<u64>,
    /// What `table` holds, and the addresses read now (the same but after a rank's pools were
    /// made again).
    uploaded: Vec<u64>,
    current: Vec<u64>,
}

impl PeerExchange {
    fn new(
        dev: &CudaDevice,
        ranks: Arc<dyn Collective>,
        link: PeerLink,
        expert_out: DevSlice<'_, f32>,
    ) -> Result<Self> {
        if (link.rank(), link.world_size()) != (ranks.rank(), ranks.world_size()) {
            return Err(ModelError::BadInput(format!(
                "the device is rank {} of a peer group of {}, the model rank {} of {}",
                link.rank(),
                link.world_size(),
                ranks.rank(),
                ranks.world_size()
            )));
        }
        link.publish(expert_out);
        let mut layout = ArenaLayout::new("peer expert rows");
        let table_span = layout.push::<u64>(link.world_size());
        Ok(Self {
            table: DeviceArena::new(dev, &layout)?,
            table_span,
            uploaded: Vec::with_capacity(link.world_size()),
            current: Vec::with_capacity(link.world_size()),
            link,
            ranks,
        })
    }

    fn all_gather(
        &mut self,
        dev: &CudaDevice,
        expert_starts: DevSlice<'_, i32>,
        expert_out: DevSlice<'_, f32>,
        (num_pairs, shard): (usize, ExpertShard),
        hidden: usize,
    ) -> Result<()> {
        let (rank, world) = (self.link.rank(), self.link.world_size());
        if shard.first != rank * shard.num_local {
            return Err(ModelError::BadInput(format!(
                "rank {rank} holds experts from {}, the exchange expects {}",
                shard.first,
                rank * shard.num_local
            )));
        }
        let stream = dev.compute_stream();
        self.link.signal(PeerPhase::Written, stream)?;
        self.ranks.barrier()?;
        self.link.wait_for_others(PeerPhase::Written, stream)?;
        // The sorted layout: a row per pair.
        self.link.buffers(num_pairs * hidden, &mut self.current)?;
        if self.current != self.uploaded {
            self.table.upload(self.table_span, &self.current)?;
            std::mem::swap(&mut self.uploaded, &mut self.current);
        }
        let peers = self.table.get(self.table_span)?;
        dev.moe_gather_peer_rows(
            expert_out,
            peers,
            expert_starts,
            (num_pairs, shard),
            (rank, world),
            hidden,
        )?;
        self.link.signal(PeerPhase::Read, stream)?;
        self.ranks.barrier()?;
        self.link.wait_for_others(PeerPhase::Read, stream)?;
        Ok(())
    }
}

/// The exchange through host memory: one rank's host buffers, sized for the largest step.
pub(crate) struct HostExchange {
    ranks: Arc<dyn Collective>,
    /// The sort's first row of every expert, and the end, `[num_experts + 1]`.
    starts: PinnedBuffer<i32>,
    /// The expert rows of the largest step, `[num_pairs, hidden]`.
    rows: PinnedBuffer<f32>,
    /// Each rank's run of `rows`, in elements.
    segments: Vec<Range<usize>>,
}

impl HostExchange {
    /// Host buffers for `num_experts` experts and up to `max_rows` sorted rows of `hidden`.
    fn new(
        dev: &CudaDevice,
        ranks: Arc<dyn Collective>,
        num_experts: usize,
        max_rows: usize,
        hidden: usize,
    ) -> Result<Self> {
        Ok(Self {
            starts: PinnedBuffer::new(dev, num_experts + 1)?,
            rows: PinnedBuffer::new(dev, max_rows * hidden)?,
            segments: Vec::with_capacity(ranks.world_size()),
            ranks,
        })
    }

    fn all_gather(
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
        ModelError::Device(BackendError::Memory(format!(
            "expert rows {range:?} past the buffer of {}",
            s.len()
        )))
    })
}
