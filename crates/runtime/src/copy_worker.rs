//! The D2H copy worker actor.
//!
//! Each step's routing reaches the host through a [`SlotRing`](crate::routing_ring::SlotRing):
//! rank 0's runner takes a free host slot, queues the copy of the step's rows `(L, N, K)` into it
//! after the forward and hands the slot ([`InFlight`]) to this worker with
//! [`CopyWorkerHandle::copy`]. The worker blocks on the slot's event on its own thread (on a GPU,
//! the copy runs on the copy stream meanwhile, and the runner goes on with the next step), reads
//! the rows, returns the slot and sends the rows to the routing host-cache. A slot is never reused
//! before it was read, and one that is not handed off (the step failed or panicked) goes back by
//! itself.
//!
//! The worker runs on its own OS thread with a crossbeam inbox (it blocks on the copies' events).
//! When the worker is gone, a hand-off fails and gives the message back, and a runner waiting for
//! a slot stops waiting: the step fails instead of hanging.

use crate::{
    routing_cache::{RoutingCacheActor, StoreStep},
    routing_ring::InFlight,
    timings::Timings,
};
use actix::Addr;
use crossbeam_channel::{Receiver, Sender};
use routed_types::{BlockRef, StepId};
use std::{
    panic::{AssertUnwindSafe, catch_unwind},
    sync::Arc,
    thread::JoinHandle,
    time::Instant,
};

/// Runner -> copy worker: a step's routing slot, its copy queued, with the step's slot mapping
/// and the blocks it wrote. The worker waits for the copy, reads the rows, returns the slot and
/// sends the rows to the routing host-cache (a [`StoreStep`]). No reply; when the worker is gone
/// the hand-off fails and the message comes back (see [`CopyWorkerHandle::copy`]); dropping it
/// returns the slot.
#[derive(Debug)]
pub struct CopyRouting {
    /// The step the rows belong to.
    pub step_id: StepId,
    /// The host slot the step's rows are being copied into.
    pub routing: InFlight,
    /// KV slot of each of the step's tokens.
    pub slot_mapping: Vec<usize>,
    /// Every block the step wrote to, with its generation.
    pub blocks: Vec<BlockRef>,
    /// Whether each token sat at a prompt position (for the expert-load counts).
    pub is_prompt: Vec<bool>,
}

/// Sends routing slots to the copy worker. Cloneable; the worker's thread ends when the last
/// handle is dropped.
#[derive(Clone)]
pub struct CopyWorkerHandle {
    inbox: Sender<CopyRouting>,
    /// Disconnects when the worker thread ends.
    alive: Receiver<()>,
}

impl CopyWorkerHandle {
    /// Starts the worker: it stores rows in `routing`.
    pub fn spawn(
        routing: Addr<RoutingCacheActor>,
        timings: Arc<Timings>,
    ) -> std::io::Result<(Self, JoinHandle<()>)> {
        let (inbox, rx) = crossbeam_channel::unbounded::<CopyRouting>();
        let (alive_tx, alive) = crossbeam_channel::bounded::<()>(0);
        let worker = CopyWorker { routing, timings };
        let thread =
            std::thread::Builder::new().name("routed-d2h-copy".into()).spawn(move || {
                let _alive = alive_tx;
                for msg in rx {
                    // A bug in one copy must not end the worker: the runner would then fail every
                    // later step. The message's slot goes back as it unwinds.
                    if catch_unwind(AssertUnwindSafe(|| worker.copy(msg))).is_err() {
                        tracing::error!("the routing copy of a step panicked; its rows are lost");
                    }
                }
            })?;
        Ok((Self { inbox, alive }, thread))
    }

    /// Hands a step's slot to the worker; when the worker is gone, the message comes back.
    #[allow(clippy::result_large_err)]
    pub fn copy(&self, msg: CopyRouting) -> Result<(), CopyRouting> {
        self.inbox.send(msg).map_err(|e| e.into_inner())
    }

    /// A channel that disconnects when the worker thread ends (for
    /// [`SlotRing::acquire`](crate::routing_ring::SlotRing::acquire)).
    pub fn alive(&self) -> &Receiver<()> {
        &self.alive
    }
}

struct CopyWorker {
    routing: Addr<RoutingCacheActor>,
    timings: Arc<Timings>,
}

impl CopyWorker {
    fn copy(&self, msg: CopyRouting) {
        let started = Instant::now();
        let mut ids = Vec::with_capacity(0);
        // The slot is free again once its rows are read (or the copy failed).
        if let Err(e) = msg.routing.complete(&mut ids) {
            // The store is still told about the step (with no rows), so its watermark moves on
            // and reading these rows fails with an error naming them instead of waiting.
            tracing::error!(
                step = msg.step_id.0,
                "the routing copy failed, its rows are lost: {e}"
            );
            ids.clear();
        }
        Timings::add(&self.timings.copy_ns, started.elapsed());
        self.routing.do_send(StoreStep {
            step_id: msg.step_id,
            ids,
            slot_mapping: msg.slot_mapping,
            blocks: msg.blocks,
            is_prompt: msg.is_prompt,
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::routing_ring::{HostCopyEngine, SlotRing};
    use routed_model::RoutingBuffer;

    fn gone_worker() -> CopyWorkerHandle {
        let (inbox, rx) = crossbeam_channel::unbounded();
        let (alive_tx, alive) = crossbeam_channel::bounded::<()>(0);
        drop((rx, alive_tx));
        CopyWorkerHandle { inbox, alive }
    }

    #[test]
    fn a_hand_off_to_a_gone_worker_gives_the_message_back_and_its_slot_returns() {
        let mut buffer = RoutingBuffer::new(1, 1, 4);
        assert!(buffer.begin_step(1));
        let ring = SlotRing::new(Arc::new(HostCopyEngine::new(1, buffer)));
        let copy = gone_worker();
        let (lease, _) = ring.acquire(copy.alive()).expect("the free slot");
        let msg = CopyRouting {
            step_id: StepId(3),
            routing: lease.submit(1).unwrap(),
            slot_mapping: vec![0],
            blocks: Vec::new(),
            is_prompt: vec![true],
        };
        let back = copy.copy(msg).expect_err("nobody receives");
        assert_eq!(back.step_id, StepId(3));
        // With the one slot in the returned message and nobody to read it, waiting fails at once.
        assert!(ring.acquire(copy.alive()).is_err());
        drop(back);
        assert_eq!(ring.num_free(), 1);
    }
}
