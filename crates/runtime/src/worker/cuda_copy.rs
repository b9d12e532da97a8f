//! The D2H copy of a CUDA worker's routing buffer (feature `cuda`): a step's rows go from the
//! device buffer `(L, N, K)` into page-locked host slots on the copy stream, ordered behind the
//! forward by an event, and the next forward waits on the slot's event before it writes the buffer
//! again (see the CUDA worker's module docs).

use super::{WorkerError, cuda::device_err};
use crate::routing_ring::{CopyEngine, CopyError, SlotId};
use routed_backend::{
    BackendError,
    cuda::{
        CudaDevice, Event,
        host::{HostWait, PinnedBuffer},
    },
};
use routed_model::gpu::RoutingSource;
use std::sync::Mutex;

/// Copies a step's routing rows from the device routing buffer into page-locked host slots on
/// the copy stream (see the module docs for the ordering).
pub(super) struct CudaCopyEngine {
    dev: CudaDevice,
    /// The routing buffer, `None` while the pools are released. Pools allocated again bring a new
    /// buffer of the same shape; the slots stay.
    source: Mutex<Option<RoutingSource>>,
    /// The buffer's shape: MoE layers, rows, experts per row.
    dims: (usize, usize, usize),
    slots: Vec<Mutex<PinnedBuffer<i16>>>,
    /// Recorded on the compute stream behind each forward; the copy stream waits on it.
    forward_done: Event,
}

impl CudaCopyEngine {
    pub(super) fn new(
        dev: CudaDevice,
        source: RoutingSource,
        num_slots: usize,
    ) -> Result<Self, WorkerError> {
        let b = &source.buffer;
        let dims = (b.num_layers, b.max_tokens, b.top_k);
        let len = b.num_layers * b.max_tokens * b.top_k;
        // The copy worker's thread only waits for these: it sleeps rather than hold a core.
        let slots = (0..num_slots)
            .map(|_| PinnedBuffer::with_wait(&dev, len, HostWait::Sleep).map(Mutex::new))
            .collect::<Result<_, BackendError>>()
            .map_err(device_err)?;
        let forward_done = dev.new_event().map_err(device_err)?;
        Ok(Self { dev, source: Mutex::new(Some(source)), dims, slots, forward_done })
    }

    /// Copies from `source` from now on (the pools were allocated again, in the same shape).
    pub(super) fn attach(&self, source: RoutingSource) {
        *self.source.lock().unwrap_or_else(|e| e.into_inner()) = Some(source);
    }

    /// Lets go of the routing buffer, so that the pools' memory can be freed.
    pub(super) fn detach(&self) {
        self.source.lock().unwrap_or_else(|e| e.into_inner()).take();
    }

    fn slot(
        &self,
        slot: SlotId,
    ) -> Result<std::sync::MutexGuard<'_, PinnedBuffer<i16>>, CopyError> {
        let s = self.slots.get(slot.0).ok_or(CopyError::NoSuchSlot(slot.0))?;
        Ok(s.lock().unwrap_or_else(|e| e.into_inner()))
    }

    fn queue(&self, slot: SlotId, num_tokens: usize) -> Result<(), BackendError> {
        let source = self.source.lock().unwrap_or_else(|e| e.into_inner());
        let Some(source) = source.as_ref() else {
            return Err(BackendError::Memory("the routing buffer is released".into()));
        };
        let (compute, copy) = (self.dev.compute_stream(), self.dev.copy_stream());
        self.forward_done.record(compute)?;
        copy.wait(&self.forward_done)?;
        let (num_layers, max_tokens, top_k) = self.dims;
        let mut pinned = self.slot(slot).map_err(|e| BackendError::Memory(e.to_string()))?;
        // The step's rows of every plane, packed layer after layer, in one strided copy.
        let runs = (num_layers, num_tokens * top_k, max_tokens * top_k);
        pinned.queue_copy_rows_from(source.arena.get(source.buffer.ids)?, runs, copy)?;
        pinned.record(copy)?;
        // The next forward writes the buffer only after this copy has read it.
        compute.wait(pinned.event())
    }
}

impl CopyEngine for CudaCopyEngine {
    fn num_slots(&self) -> usize {
        self.slots.len()
    }

    fn submit(&self, slot: SlotId, num_tokens: usize) -> Result<(), CopyError> {
        let max_tokens = self.dims.1;
        if num_tokens > max_tokens {
            return Err(CopyError::TooManyTokens { num_tokens, max_tokens });
        }
        self.queue(slot, num_tokens).map_err(|e| CopyError::Device(e.to_string()))
    }

    fn wait(&self, slot: SlotId) -> Result<(), CopyError> {
        let pinned = self.slot(slot)?;
        pinned.wait().map(drop).map_err(|e| CopyError::Device(e.to_string()))
    }

    fn read(&self, slot: SlotId, num_tokens: usize, out: &mut Vec<i16>) -> Result<(), CopyError> {
        let (num_layers, _, top_k) = self.dims;
        let pinned = self.slot(slot)?;
        let ids = pinned.wait().map_err(|e| CopyError::Device(e.to_string()))?;
        out.extend_from_slice(&ids[..num_layers * num_tokens * top_k]);
        Ok(())
    }
}
