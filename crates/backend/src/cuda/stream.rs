//! Streams and events of a device: the driver's, or the simulator's.
//!
//! The simulator's streams are queues that run their work only when it is waited for
//! (`sim/queue.rs`), so code written against these types must order its work with events
//! and synchronisations exactly as on a GPU: a missing wait shows on the simulator too.

use super::{
    device::driver_err,
    sim::queue::{Mark, SimQueues, Work},
};
use crate::BackendError;
use cudarc::driver::{CudaEvent, CudaStream};
use std::sync::{Arc, Mutex};

/// A stream: the device's compute stream or its copy stream.
#[derive(Clone, Debug)]
pub struct Stream(StreamKind);

#[derive(Clone, Debug)]
enum StreamKind {
    Driver(Arc<CudaStream>),
    Sim(SimStream),
}

/// One of a simulated device's queues.
#[derive(Clone, Debug)]
pub(crate) struct SimStream {
    queues: Arc<SimQueues>,
    index: usize,
}

impl SimStream {
    /// Queues `work` (a launch or a copy) behind the stream's earlier work.
    pub(crate) fn push(&self, work: Work) {
        self.queues.push(self.index, work);
    }

    /// Runs everything queued on the stream.
    pub(crate) fn synchronize(&self) -> Result<(), BackendError> {
        self.queues.synchronize(self.index)
    }

    /// Runs everything queued on every stream of the device (before memory that queued work may
    /// address is freed).
    pub(crate) fn finish_device(&self) -> Result<(), BackendError> {
        self.queues.finish()
    }
}

impl Stream {
    pub(crate) fn driver(stream: Arc<CudaStream>) -> Self {
        Self(StreamKind::Driver(stream))
    }

    pub(crate) fn sim(queues: Arc<SimQueues>, index: usize) -> Self {
        Self(StreamKind::Sim(SimStream { queues, index }))
    }

    /// The driver's stream, or `None` on the simulator.
    pub(crate) fn cuda(&self) -> Option<&Arc<CudaStream>> {
        match &self.0 {
            StreamKind::Driver(s) => Some(s),
            StreamKind::Sim(_) => None,
        }
    }

    /// The simulator's queue, or `None` on a GPU.
    pub(crate) fn simulated(&self) -> Option<&SimStream> {
        match &self.0 {
            StreamKind::Driver(_) => None,
            StreamKind::Sim(s) => Some(s),
        }
    }

    /// Makes the work queued on this stream from now on wait for `event` (for the work recorded
    /// before it; an event never recorded is no wait).
    pub fn wait(&self, event: &Event) -> Result<(), BackendError> {
        match (&self.0, &event.0) {
            (StreamKind::Driver(s), EventKind::Driver(e)) => s.wait(e).map_err(driver_err),
            (StreamKind::Sim(s), EventKind::Sim(mark, queues))
                if Arc::ptr_eq(queues, &s.queues) =>
            {
                if let Some(mark) = *mark.lock().unwrap_or_else(|e| e.into_inner()) {
                    s.queues.push_wait(s.index, mark);
                }
                Ok(())
            }
            _ => Err(mixed()),
        }
    }

    /// Blocks until everything queued on the stream is done.
    pub fn synchronize(&self) -> Result<(), BackendError> {
        match &self.0 {
            StreamKind::Driver(s) => s.synchronize().map_err(driver_err),
            StreamKind::Sim(s) => s.synchronize(),
        }
    }
}

/// An event: recorded on one stream, waited on by another stream or by the host.
#[derive(Debug)]
pub struct Event(EventKind);

#[derive(Debug)]
enum EventKind {
    Driver(CudaEvent),
    /// The point of the stream it was last recorded on, and that stream's queues.
    Sim(Mutex<Option<Mark>>, Arc<SimQueues>),
}

impl Event {
    pub(crate) fn driver(event: CudaEvent) -> Self {
        Self(EventKind::Driver(event))
    }

    pub(crate) fn sim(queues: Arc<SimQueues>) -> Self {
        Self(EventKind::Sim(Mutex::new(None), queues))
    }

    /// Records the event after the work queued on `stream` so far.
    pub fn record(&self, stream: &Stream) -> Result<(), BackendError> {
        match (&self.0, &stream.0) {
            (EventKind::Driver(e), StreamKind::Driver(s)) => e.record(s).map_err(driver_err),
            (EventKind::Sim(mark, queues), StreamKind::Sim(s))
                if Arc::ptr_eq(queues, &s.queues) =>
            {
                *mark.lock().unwrap_or_else(|e| e.into_inner()) = Some(queues.mark(s.index));
                Ok(())
            }
            _ => Err(mixed()),
        }
    }

    /// Blocks the calling thread until the recorded work is done (at once for an event never
    /// recorded).
    pub fn synchronize(&self) -> Result<(), BackendError> {
        match &self.0 {
            EventKind::Driver(e) => e.synchronize().map_err(driver_err),
            EventKind::Sim(mark, queues) => {
                let mark = *mark.lock().unwrap_or_else(|e| e.into_inner());
                mark.map_or(Ok(()), |m| queues.run_to(m))
            }
        }
    }
}

impl Event {
    /// Seconds of device time from `start` to this event, both recorded and done, made with
    /// [`super::CudaDevice::new_timing_event`]; `None` on the simulator, which has no device
    /// clock (its work runs on the host when waited for).
    pub fn seconds_since(&self, start: &Event) -> Result<Option<f64>, BackendError> {
        match (&self.0, &start.0) {
            (EventKind::Driver(end), EventKind::Driver(start)) => {
                start.elapsed_ms(end).map(|ms| Some(f64::from(ms) * 1e-3)).map_err(driver_err)
            }
            (EventKind::Sim(..), EventKind::Sim(..)) => Ok(None),
            _ => Err(mixed()),
        }
    }
}

fn mixed() -> BackendError {
    BackendError::Driver("a stream or event used with another device's".into())
}
