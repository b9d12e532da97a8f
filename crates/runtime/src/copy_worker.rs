//! The D2H copy worker actor and the routing buffers it shares with rank 0's runner.
//!
//! Routing buffers circulate: the runner leases one per step from a [`BufferPool`], the model
//! writes the step's expert ids into it, the runner hands it to the copy worker with
//! [`CopyWorkerHandle::copy`], and the worker copies the ids to host memory, returns the buffer to
//! the pool and sends the rows to the routing host-cache while the runner goes on with the next
//! step. A buffer is never overwritten while it is being read, and a lease that is not handed off
//! (the step failed or panicked) returns its buffer when dropped.
//!
//! The worker runs on its own OS thread with a crossbeam inbox (it blocks on copies; on a GPU, on
//! the copy's event). On the CPU backend the "device" buffer is host memory, so the copy is a
//! plain one; the protocol is the one a GPU uses with pinned staging buffers and events. When the
//! worker is gone, a hand-off fails and gives the message back, and a runner waiting for a buffer
//! stops waiting: the step fails instead of hanging.

use crate::{
    routing_cache::{RoutingCacheActor, StoreStep},
    timings::Timings,
};
use actix::Addr;
use crossbeam_channel::{Receiver, Sender};
use routed_model::RoutingBuffer;
use routed_types::{BlockRef, StepId};
use std::{
    panic::{AssertUnwindSafe, catch_unwind},
    sync::Arc,
    thread::JoinHandle,
    time::Instant,
};

/// Runner -> copy worker: a step's routing buffer `(L, N, K)` with the step's slot mapping and the
/// blocks it wrote. The worker copies the ids, returns the buffer to the pool and sends the rows
/// to the routing host-cache (a [`StoreStep`]). No reply; when the worker is gone the hand-off
/// fails and the message comes back (see [`CopyWorkerHandle::copy`]).
#[derive(Debug)]
pub struct CopyRouting {
    /// The step the rows belong to.
    pub step_id: StepId,
    /// The device routing buffer (host memory on the CPU backend).
    pub buffer: RoutingBuffer,
    /// KV slot of each of the step's tokens.
    pub slot_mapping: Vec<usize>,
    /// Every block the step wrote to, with its generation.
    pub blocks: Vec<BlockRef>,
    /// Whether each token sat at a prompt position (for the expert-load counts).
    pub is_prompt: Vec<bool>,
}

/// The routing buffers rank 0's runner leases, one per step.
#[derive(Clone)]
pub struct BufferPool {
    free: Receiver<RoutingBuffer>,
    returns: Sender<RoutingBuffer>,
}

impl BufferPool {
    /// A pool of `count` buffers made by `make`.
    pub fn new(count: usize, make: impl Fn() -> RoutingBuffer) -> Self {
        let (returns, free) = crossbeam_channel::bounded(count);
        for _ in 0..count {
            returns.send(make()).expect("the pool has room for its own buffers");
        }
        Self { free, returns }
    }

    /// Where buffers go back to (the copy worker's side).
    pub fn returns(&self) -> Sender<RoutingBuffer> {
        self.returns.clone()
    }

    /// Waits for a free buffer. Fails, instead of waiting forever, once the copy worker that
    /// would return the buffers in flight is gone.
    pub fn lease(&self, copy: &CopyWorkerHandle) -> Result<Lease, CopyWorkerGone> {
        let buffer = crossbeam_channel::select! {
            recv(self.free) -> b => b.map_err(|_| CopyWorkerGone)?,
            // Never sent on: it fires only when the worker thread ends and drops its end.
            recv(copy.alive) -> _ => match self.free.try_recv() {
                Ok(b) => b,
                Err(_) => return Err(CopyWorkerGone),
            },
        };
        Ok(Lease { buffer: Some(buffer), returns: self.returns.clone() })
    }
}

/// The copy worker has stopped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CopyWorkerGone;

/// A buffer taken from the pool for one step; goes back to the pool when dropped unless handed to
/// the copy worker with [`Lease::take`].
pub struct Lease {
    buffer: Option<RoutingBuffer>,
    returns: Sender<RoutingBuffer>,
}

impl Lease {
    /// The buffer, for the step to write into.
    pub fn buffer_mut(&mut self) -> &mut RoutingBuffer {
        self.buffer.as_mut().expect("a lease holds its buffer until taken")
    }

    /// Hands the buffer on; whoever takes it returns it to the pool.
    pub fn take(mut self) -> RoutingBuffer {
        self.buffer.take().expect("a lease holds its buffer until taken")
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        if let Some(buffer) = self.buffer.take() {
            // Fails only if the pool itself is gone, and then nobody needs the buffer.
            let _ = self.returns.send(buffer);
        }
    }
}

/// Sends routing buffers to the copy worker. Cloneable; the worker's thread ends when the last
/// handle is dropped.
#[derive(Clone)]
pub struct CopyWorkerHandle {
    inbox: Sender<CopyRouting>,
    /// Disconnects when the worker thread ends.
    alive: Receiver<()>,
}

impl CopyWorkerHandle {
    /// Starts the worker: it returns buffers to `returns` and stores rows in `routing`.
    pub fn spawn(
        returns: Sender<RoutingBuffer>,
        routing: Addr<RoutingCacheActor>,
        timings: Arc<Timings>,
    ) -> std::io::Result<(Self, JoinHandle<()>)> {
        let (inbox, rx) = crossbeam_channel::unbounded::<CopyRouting>();
        let (alive_tx, alive) = crossbeam_channel::bounded::<()>(0);
        let worker = CopyWorker { returns, routing, timings };
        let thread =
            std::thread::Builder::new().name("routed-d2h-copy".into()).spawn(move || {
                let _alive = alive_tx;
                for msg in rx {
                    // A bug in one copy must not end the worker: the runner would then fail every
                    // later step.
                    if catch_unwind(AssertUnwindSafe(|| worker.copy(msg))).is_err() {
                        tracing::error!("the routing copy of a step panicked; its rows are lost");
                    }
                }
            })?;
        Ok((Self { inbox, alive }, thread))
    }

    /// Hands a step's buffer to the worker; when the worker is gone, the message comes back.
    #[allow(clippy::result_large_err)]
    pub fn copy(&self, msg: CopyRouting) -> Result<(), CopyRouting> {
        self.inbox.send(msg).map_err(|e| e.into_inner())
    }
}

struct CopyWorker {
    returns: Sender<RoutingBuffer>,
    routing: Addr<RoutingCacheActor>,
    timings: Arc<Timings>,
}

impl CopyWorker {
    fn copy(&self, msg: CopyRouting) {
        let started = Instant::now();
        let ids = msg.buffer.ids().to_vec();
        Timings::add(&self.timings.copy_ns, started.elapsed());
        // The buffer is free again only now that its contents are copied.
        let _ = self.returns.send(msg.buffer);
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

    fn gone_worker() -> CopyWorkerHandle {
        let (inbox, rx) = crossbeam_channel::unbounded();
        let (alive_tx, alive) = crossbeam_channel::bounded::<()>(0);
        drop((rx, alive_tx));
        CopyWorkerHandle { inbox, alive }
    }

    #[test]
    fn a_dropped_lease_returns_its_buffer() {
        let pool = BufferPool::new(1, || RoutingBuffer::new(1, 1, 4));
        let (_keep, alive) = crossbeam_channel::bounded::<()>(0);
        let (inbox, _rx) = crossbeam_channel::unbounded();
        let copy = CopyWorkerHandle { inbox, alive };
        for _ in 0..10 {
            // Each lease drops (as on a failed or panicking step) and the single buffer comes back.
            let mut lease = pool.lease(&copy).expect("a free buffer");
            lease.buffer_mut();
        }
    }

    #[test]
    fn waiting_for_a_buffer_fails_once_the_copy_worker_is_gone() {
        let pool = BufferPool::new(1, || RoutingBuffer::new(1, 1, 4));
        let copy = gone_worker();
        // The one free buffer is still handed out...
        let lease = pool.lease(&copy).expect("the free buffer");
        // ...but with it in flight and nobody to return it, a second lease fails at once.
        let buffer = lease.take();
        assert!(pool.lease(&copy).is_err());
        drop(buffer);
    }

    #[test]
    fn a_hand_off_to_a_gone_worker_gives_the_message_back() {
        let copy = gone_worker();
        let msg = CopyRouting {
            step_id: StepId(3),
            buffer: RoutingBuffer::new(1, 1, 4),
            slot_mapping: vec![0],
            blocks: Vec::new(),
            is_prompt: vec![true],
        };
        let back = copy.copy(msg).expect_err("nobody receives");
        assert_eq!(back.step_id, StepId(3));
    }
}
