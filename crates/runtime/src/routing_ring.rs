//! The ring of host slots each step's routing ids are copied into, between rank 0's runner and
//! the D2H copy worker.
//!
//! The forward writes every MoE layer's expert ids into one routing buffer `(L, N, K)` that stays
//! at a fixed address (device memory on a GPU, which CUDA graphs need). After the forward the
//! runner takes a free slot ([`SlotRing::acquire`]) and queues the copy of the step's rows into
//! it ([`SlotLease::submit`]): on a GPU the copy runs on the copy stream after an event recorded
//! behind the forward, the slot's own event is recorded after the copy, and the compute stream
//! waits on that event before the next forward writes the buffer again, so the device buffer is
//! never overwritten while read and compute never waits on the host. The runner hands the slot
//! ([`InFlight`]) to the copy worker, which blocks on the slot's event on its own thread, reads
//! the rows and returns the slot ([`InFlight::complete`]).
//!
//! The ring has a fixed number of slots. When every slot is in flight the runner waits for one
//! (the wait is measured, and shows in the engine's stats): a slot is never reused before its
//! rows were read. A slot goes back on every path: a lease dropped before submitting (the step
//! failed or panicked), a submit that failed, an in-flight slot dropped unread (the copy worker
//! stopped with it in its inbox): the last two first wait for the slot's copy, so a returned slot
//! never has a copy landing in it later.
//!
//! What a copy and an event are is the [`CopyEngine`]'s business: [`HostCopyEngine`] for the CPU
//! backend (the "device" buffer is host memory and a copy is done when submitted), the CUDA
//! worker's engine for pinned host slots and a copy stream. The ring and its tests are the same
//! for both.

use crossbeam_channel::{Receiver, Sender};
use routed_model::RoutingBuffer;
use std::{
    sync::{Arc, Mutex, MutexGuard},
    time::{Duration, Instant},
};

/// One host slot of a ring, by index.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct SlotId(pub usize);

impl SlotId {
    /// The slot's index.
    pub fn index(self) -> usize {
        self.0
    }
}

/// Why a routing copy failed.
#[derive(Debug, thiserror::Error)]
pub enum CopyError {
    /// The step has more tokens than the routing buffer or a slot holds.
    #[error("{num_tokens} tokens do not fit a routing buffer of {max_tokens}")]
    TooManyTokens {
        /// Tokens asked for.
        num_tokens: usize,
        /// What the buffer holds.
        max_tokens: usize,
    },
    /// The step to copy is not the one in the buffer (a submit without a forward before it).
    #[error("the routing buffer holds {held} tokens, the copy asked for {asked}")]
    WrongStep {
        /// Tokens of the step in the buffer.
        held: usize,
        /// Tokens the copy asked for.
        asked: usize,
    },
    /// No such slot.
    #[error("slot {0} does not exist")]
    NoSuchSlot(usize),
    /// The device failed the copy or its event.
    #[error("device: {0}")]
    Device(String),
}

/// A device-to-host copy engine: the routing buffer the forward writes, a fixed set of host slots
/// and a completion event per slot. Shared by the runner thread (which submits) and the copy
/// worker thread (which waits and reads); the ring guarantees that a slot is used by one of them
/// at a time.
pub trait CopyEngine: Send + Sync {
    /// Host slots; fixed for the engine's life.
    fn num_slots(&self) -> usize;

    /// Runner thread, after the forward: queues the copy of the first `num_tokens` rows of every
    /// layer of the routing buffer into `slot` and records the slot's event after it. Must not
    /// wait for the forward or the copy. The engine orders the next forward's writes to the
    /// routing buffer after this copy.
    fn submit(&self, slot: SlotId, num_tokens: usize) -> Result<(), CopyError>;

    /// Copy worker thread: blocks until the last copy submitted into `slot` has landed.
    fn wait(&self, slot: SlotId) -> Result<(), CopyError>;

    /// After [`CopyEngine::wait`]: appends the slot's ids, `(L, num_tokens, K)` row-major, to
    /// `out`.
    fn read(&self, slot: SlotId, num_tokens: usize, out: &mut Vec<i16>) -> Result<(), CopyError>;
}

/// The party that returns slots (the copy worker) is gone, and no slot is free: waiting would
/// never end.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("every routing slot is in flight and the copy worker that would return them is gone")]
pub struct RingClosed;

/// The free list of an engine's slots. Cloneable; clones share the slots.
#[derive(Clone)]
pub struct SlotRing {
    engine: Arc<dyn CopyEngine>,
    free: Receiver<SlotId>,
    returns: Sender<SlotId>,
}

impl SlotRing {
    /// A ring over every slot of `engine`, all free.
    pub fn new(engine: Arc<dyn CopyEngine>) -> Self {
        let n = engine.num_slots();
        let (returns, free) = crossbeam_channel::bounded(n.max(1));
        for i in 0..n {
            returns.send(SlotId(i)).expect("the free list has room for every slot");
        }
        Self { engine, free, returns }
    }

    /// Slots in the ring.
    pub fn num_slots(&self) -> usize {
        self.engine.num_slots()
    }

    /// Slots free right now.
    pub fn num_free(&self) -> usize {
        self.free.len()
    }

    /// Takes a free slot, waiting while every slot is in flight, and says how long it waited.
    /// `consumer` is a channel that disconnects when the party returning slots (the copy worker)
    /// is gone: then a free slot is still handed out, but with none free the wait fails instead
    /// of never ending.
    pub fn acquire(&self, consumer: &Receiver<()>) -> Result<(SlotLease, Duration), RingClosed> {
        let started = Instant::now();
        let slot = crossbeam_channel::select! {
            recv(self.free) -> s => s.map_err(|_| RingClosed)?,
            // Never sent on: it fires only when the consumer drops its end.
            recv(consumer) -> _ => self.free.try_recv().map_err(|_| RingClosed)?,
        };
        Ok((self.lease(slot), started.elapsed()))
    }

    /// A free slot if there is one, without waiting.
    pub fn try_acquire(&self) -> Option<SlotLease> {
        self.free.try_recv().ok().map(|s| self.lease(s))
    }

    fn lease(&self, slot: SlotId) -> SlotLease {
        SlotLease {
            held: Some(Held { slot, engine: self.engine.clone(), returns: self.returns.clone() }),
        }
    }
}

/// A slot owned by one side of the ring; returns to the free list when dropped.
struct Held {
    slot: SlotId,
    engine: Arc<dyn CopyEngine>,
    returns: Sender<SlotId>,
}

impl Held {
    /// Waits for any copy into the slot, so nothing lands in it after it is free.
    fn settle(&self) {
        if let Err(e) = self.engine.wait(self.slot) {
            tracing::warn!(
                slot = self.slot.0,
                "waiting for a routing copy before freeing its slot: {e}"
            );
        }
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        // Fails only if the ring itself is gone, and then nobody needs the slot.
        let _ = self.returns.send(self.slot);
    }
}

/// A free slot taken for one step. Dropped unsubmitted (the step failed), it goes straight back.
pub struct SlotLease {
    held: Option<Held>,
}

impl SlotLease {
    /// The slot.
    pub fn slot(&self) -> SlotId {
        self.held.as_ref().expect("a lease holds its slot until submitted").slot
    }

    /// Queues the copy of the step's `num_tokens` rows into the slot. On success the slot is in
    /// flight until read or dropped; on failure it goes back to the ring once anything already
    /// queued into it has landed.
    pub fn submit(mut self, num_tokens: usize) -> Result<InFlight, CopyError> {
        let held = self.held.take().expect("a lease holds its slot until submitted");
        match held.engine.submit(held.slot, num_tokens) {
            Ok(()) => Ok(InFlight { held: Some(held), num_tokens }),
            Err(e) => {
                held.settle();
                Err(e)
            }
        }
    }
}

/// A slot whose copy is queued, on its way to the copy worker. Dropped unread, it waits for its
/// copy and goes back to the ring.
pub struct InFlight {
    held: Option<Held>,
    num_tokens: usize,
}

impl std::fmt::Debug for InFlight {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("InFlight")
            .field("slot", &self.held.as_ref().map(|h| h.slot))
            .field("num_tokens", &self.num_tokens)
            .finish()
    }
}

impl InFlight {
    /// The slot.
    pub fn slot(&self) -> SlotId {
        self.held.as_ref().expect("an in-flight slot is held until completed").slot
    }

    /// Tokens of the step.
    pub fn num_tokens(&self) -> usize {
        self.num_tokens
    }

    /// Copy worker: blocks until the copy has landed, appends the rows `(L, N, K)` to `out` and
    /// returns the slot to the ring, whether or not the wait and the read succeeded.
    pub fn complete(mut self, out: &mut Vec<i16>) -> Result<(), CopyError> {
        let held = self.held.take().expect("an in-flight slot is held until completed");
        held.engine.wait(held.slot)?;
        held.engine.read(held.slot, self.num_tokens, out)
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        if let Some(held) = self.held.take() {
            held.settle();
        }
    }
}

/// The copy engine of the CPU backend. Its "device" buffer is host memory that the forward writes
/// (through [`HostCopyEngine::source`]) on the runner thread; a copy is a plain one made when
/// submitted, so its event is complete at once. Slots are allocated up front and reused.
pub struct HostCopyEngine {
    source: Mutex<RoutingBuffer>,
    slots: Vec<Mutex<Vec<i16>>>,
    /// `L * K`: ids per token. Kept apart so a read never waits for the source, which the runner
    /// holds for a whole forward.
    ids_per_token: usize,
}

impl HostCopyEngine {
    /// An engine with `num_slots` slots over the routing buffer `source`.
    pub fn new(num_slots: usize, source: RoutingBuffer) -> Self {
        let ids_per_token = source.num_moe_layers() * source.top_k();
        let capacity = ids_per_token * source.max_tokens();
        let slots = (0..num_slots).map(|_| Mutex::new(Vec::with_capacity(capacity))).collect();
        Self { source: Mutex::new(source), slots, ids_per_token }
    }

    /// The routing buffer, for the forward to write. Only the runner thread takes it, so it is
    /// never contended; a forward that panicked leaves it usable.
    pub fn source(&self) -> MutexGuard<'_, RoutingBuffer> {
        self.source.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn slot(&self, slot: SlotId) -> Result<MutexGuard<'_, Vec<i16>>, CopyError> {
        let s = self.slots.get(slot.0).ok_or(CopyError::NoSuchSlot(slot.0))?;
        Ok(s.lock().unwrap_or_else(|e| e.into_inner()))
    }
}

impl CopyEngine for HostCopyEngine {
    fn num_slots(&self) -> usize {
        self.slots.len()
    }

    fn submit(&self, slot: SlotId, num_tokens: usize) -> Result<(), CopyError> {
        let source = self.source();
        if num_tokens > source.max_tokens() {
            return Err(CopyError::TooManyTokens { num_tokens, max_tokens: source.max_tokens() });
        }
        if num_tokens != source.num_tokens() {
            return Err(CopyError::WrongStep { held: source.num_tokens(), asked: num_tokens });
        }
        let mut dst = self.slot(slot)?;
        dst.clear();
        dst.extend_from_slice(source.ids());
        Ok(())
    }

    fn wait(&self, slot: SlotId) -> Result<(), CopyError> {
        self.slot(slot).map(drop)
    }

    fn read(&self, slot: SlotId, num_tokens: usize, out: &mut Vec<i16>) -> Result<(), CopyError> {
        let src = self.slot(slot)?;
        let per_token = self.ids_per_token;
        if src.len() != per_token * num_tokens {
            let held = src.len() / per_token.max(1);
            return Err(CopyError::WrongStep { held, asked: num_tokens });
        }
        out.extend_from_slice(&src);
        Ok(())
    }
}

#[cfg(test)]
#[path = "routing_ring_tests.rs"]
mod tests;
