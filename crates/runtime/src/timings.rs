//! Cumulative time spent in each part of the step pipeline, written by the actors that do the
//! work (each on its own thread) and read with the stats. Relaxed atomics: the figures are for
//! benchmarks and logs, not for synchronisation.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// Nanoseconds spent per pipeline stage since the engine started.
#[derive(Debug, Default)]
pub struct Timings {
    /// Model forward + sampling in rank 0's runner (the worker's wall time).
    pub forward_ns: AtomicU64,
    /// The device's clock between events around those steps' work (GPU workers only).
    pub device_ns: AtomicU64,
    /// The runner's routing hand-off (queueing the copy, slot mapping, message to the copy
    /// worker).
    pub capture_ns: AtomicU64,
    /// The runner waiting for a free routing slot because every slot was in flight.
    pub slot_wait_ns: AtomicU64,
    /// The copy worker's device-to-host copy.
    pub copy_ns: AtomicU64,
    /// The routing host-cache's scatter into per-block rows.
    pub store_ns: AtomicU64,
}

impl Timings {
    /// Adds `d` to `counter`.
    pub fn add(counter: &AtomicU64, d: Duration) {
        counter.fetch_add(d.as_nanos() as u64, Ordering::Relaxed);
    }

    /// Adds one step's worker wall time and, where the device measured it, its device time.
    pub fn add_step(&self, wall: Duration, device: Option<Duration>) {
        Self::add(&self.forward_ns, wall);
        if let Some(device) = device {
            Self::add(&self.device_ns, device);
        }
    }

    /// Reads a counter in seconds.
    pub fn seconds(counter: &AtomicU64) -> f64 {
        counter.load(Ordering::Relaxed) as f64 * 1e-9
    }
}
