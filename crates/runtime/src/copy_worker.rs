//! The D2H copy worker actor (dedicated OS thread): copies each step's routing buffer to host
//! memory, returns the buffer to the runner's pool and hands the rows to the routing host-cache,
//! while the runner goes on with the next step. On the CPU backend the "device" buffer is already
//! host memory, so the copy is a plain one; the protocol is the one the GPU uses with pinned
//! staging buffers and events.

use crate::{
    messages::{CopyRouting, StoreStep},
    routing_cache::RoutingCacheActor,
    timings::Timings,
};
use actix::{Actor, Addr, Handler, SyncContext};
use crossbeam_channel::Sender;
use routed_model::RoutingBuffer;
use std::{sync::Arc, time::Instant};

/// Copies routing off the device.
pub struct CopyWorkerActor {
    returns: Sender<RoutingBuffer>,
    routing: Addr<RoutingCacheActor>,
    timings: Arc<Timings>,
}

impl CopyWorkerActor {
    /// A worker returning buffers to `returns` and storing rows in `routing`.
    pub fn new(
        returns: Sender<RoutingBuffer>,
        routing: Addr<RoutingCacheActor>,
        timings: Arc<Timings>,
    ) -> Self {
        Self { returns, routing, timings }
    }
}

impl Actor for CopyWorkerActor {
    type Context = SyncContext<Self>;
}

impl Handler<CopyRouting> for CopyWorkerActor {
    type Result = ();

    fn handle(&mut self, msg: CopyRouting, _: &mut SyncContext<Self>) {
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
        });
    }
}
