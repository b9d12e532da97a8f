//! Streams and events of a device: the driver's, or the simulator's.
//!
//! The simulator does the work of a launch or a copy when it is queued, so its streams have
//! nothing to wait for and its events are complete as soon as they are recorded; code written
//! against these types orders its work the same way on both.

use super::device::driver_err;
use crate::BackendError;
use cudarc::driver::{CudaEvent, CudaStream};
use std::sync::Arc;

/// A stream: the device's compute stream or its copy stream.
#[derive(Clone, Debug)]
pub struct Stream(StreamKind);

#[derive(Clone, Debug)]
enum StreamKind {
    Driver(Arc<CudaStream>),
    Sim,
}

impl Stream {
    pub(crate) fn driver(stream: Arc<CudaStream>) -> Self {
        Self(StreamKind::Driver(stream))
    }

    pub(crate) fn sim() -> Self {
        Self(StreamKind::Sim)
    }

    /// The driver's stream, or `None` on the simulator.
    pub(crate) fn cuda(&self) -> Option<&Arc<CudaStream>> {
        match &self.0 {
            StreamKind::Driver(s) => Some(s),
            StreamKind::Sim => None,
        }
    }

    /// Makes the work queued on this stream from now on wait for `event`.
    pub fn wait(&self, event: &Event) -> Result<(), BackendError> {
        match (&self.0, &event.0) {
            (StreamKind::Driver(s), Some(e)) => s.wait(e).map_err(driver_err),
            (StreamKind::Sim, None) => Ok(()),
            _ => Err(mixed()),
        }
    }

    /// Blocks until everything queued on the stream is done.
    pub fn synchronize(&self) -> Result<(), BackendError> {
        match &self.0 {
            StreamKind::Driver(s) => s.synchronize().map_err(driver_err),
            StreamKind::Sim => Ok(()),
        }
    }
}

/// An event: recorded on one stream, waited on by another stream or by the host.
#[derive(Debug)]
pub struct Event(Option<CudaEvent>);

impl Event {
    pub(crate) fn driver(event: CudaEvent) -> Self {
        Self(Some(event))
    }

    pub(crate) fn sim() -> Self {
        Self(None)
    }

    /// Records the event after the work queued on `stream` so far.
    pub fn record(&self, stream: &Stream) -> Result<(), BackendError> {
        match (&self.0, &stream.0) {
            (Some(e), StreamKind::Driver(s)) => e.record(s).map_err(driver_err),
            (None, StreamKind::Sim) => Ok(()),
            _ => Err(mixed()),
        }
    }

    /// Blocks the calling thread until the recorded work is done.
    pub fn synchronize(&self) -> Result<(), BackendError> {
        match &self.0 {
            Some(e) => e.synchronize().map_err(driver_err),
            None => Ok(()),
        }
    }
}

fn mixed() -> BackendError {
    BackendError::Driver("a simulated stream or event used with a device's".into())
}
