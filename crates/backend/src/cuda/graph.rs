//! CUDA graphs: the launches of a step captured once and replayed as one, so a decode step costs
//! one launch on the host instead of one per kernel.
//!
//! Capture fixes every kernel argument: the grid, the sizes and the addresses. What changes from
//! one replay to the next must therefore live in device memory at a fixed address (the packed
//! step inputs, the routing buffer, the pools), and the sizes must be those of the captured batch
//! (a decode batch padded to the graph's size). On the simulator a capture records the launches
//! with their argument values and a replay runs them again, so the same rule holds there and the
//! tests that compare replays with eager steps check it.

use super::{
    CudaDevice,
    device::{Engine, driver_err},
    sim::RecordedLaunch,
};
use crate::BackendError;
use cudarc::driver::{
    CudaGraph,
    sys::{CUgraphInstantiate_flags, CUstreamCaptureMode},
};
use std::sync::Arc;

/// A captured sequence of launches on the compute stream.
pub struct Graph(GraphKind);

enum GraphKind {
    Driver(DriverGraph),
    Sim(Arc<[RecordedLaunch]>),
}

struct DriverGraph(CudaGraph);

// SAFETY: an instantiated graph is a driver handle that any thread may launch once the context
// is current on it, which cudarc's `launch` makes so; the graph is launched by one owner at a time
// (`&Graph` replays only queue work on the stream).
unsafe impl Send for DriverGraph {}
// SAFETY: as above; replays only read the handle.
unsafe impl Sync for DriverGraph {}

impl std::fmt::Debug for Graph {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.0 {
            GraphKind::Driver(_) => f.write_str("Graph(driver)"),
            GraphKind::Sim(l) => write!(f, "Graph(simulated, {} launches)", l.len()),
        }
    }
}

impl CudaDevice {
    /// Captures the launches `record` queues on the compute stream as a graph, without running
    /// them. `record` must only launch kernels (no copy, no synchronisation, no allocation).
    pub fn capture<E: From<BackendError>>(
        &self,
        record: impl FnOnce() -> Result<(), E>,
    ) -> Result<Graph, E> {
        match self.engine() {
            Engine::Driver(d) => {
                let stream = &d.compute;
                // Thread-local mode: only this thread's calls are checked for what a capture
                // forbids; the copy worker's thread goes on with its own stream.
                let mode = CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL;
                stream.begin_capture(mode).map_err(driver_err)?;
                let recorded = record();
                // The capture ends whatever `record` did, so the stream is usable again.
                let flags = CUgraphInstantiate_flags(0);
                let graph = stream.end_capture(flags).map_err(driver_err)?;
                recorded?;
                let graph = graph
                    .ok_or_else(|| BackendError::Driver("the capture recorded no launch".into()))?;
                Ok(Graph(GraphKind::Driver(DriverGraph(graph))))
            }
            Engine::Sim(sim) => {
                sim.begin_capture()?;
                let recorded = record();
                let launches = sim.end_capture();
                recorded?;
                Ok(Graph(GraphKind::Sim(launches.into())))
            }
        }
    }

    /// Queues the graph's launches on the compute stream, as they were captured.
    pub fn replay(&self, graph: &Graph) -> Result<(), BackendError> {
        match (self.engine(), &graph.0) {
            (Engine::Driver(_), GraphKind::Driver(g)) => g.0.launch().map_err(driver_err),
            (Engine::Sim(sim), GraphKind::Sim(launches)) => {
                sim.replay(launches);
                Ok(())
            }
            _ => Err(BackendError::Driver("a graph replayed on another kind of device".into())),
        }
    }
}
