//! The simulator's streams: queues of work that run only when something has to see their result.
//!
//! A GPU runs a stream's work after the host queued it, at a time the host does not know; only
//! an event or a synchronisation says that it is done. The simulator keeps each stream's launches
//! and copies in a queue and runs them as late as that contract allows: when the host waits for a
//! stream or an event (and only up to the point it waits for), when it reads device memory, or
//! when a stream that waits on an event must get past the wait. Code that forgot a wait therefore
//! sees what a GPU would show it at its worst: a host buffer read before the copy into it ran, a
//! device buffer overwritten by a later launch before the copy that reads it, inputs a copy reads
//! after the host wrote the next step's.
//!
//! Every queue of a device sits behind one lock, and the work runs on whichever thread makes it
//! run, under that lock: one stream's work runs in its order, and work waited for on another
//! stream runs first. The devices of an expert-parallel group share one set of queues, so a
//! stream of one device can wait on an event of another, as GPUs that read each other's memory
//! do. A launch that fails reports its error to the wait that ran it (as a GPU reports a kernel's
//! fault at the next synchronisation).

use crate::BackendError;
use std::{
    collections::VecDeque,
    sync::{Arc, Mutex, MutexGuard},
};

/// Work queued on a simulated stream: a launch or a copy, run later on some host thread.
pub(crate) type Work = Box<dyn FnOnce() -> Result<(), BackendError> + Send>;

/// A point in a stream's work: everything queued there before an event was recorded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Mark {
    stream: usize,
    /// How many items had been queued on the stream.
    seq: u64,
}

enum Item {
    Run(Work),
    /// Wait until the other stream has done the work before the mark.
    Wait(Mark),
}

#[derive(Default)]
struct Queue {
    pending: VecDeque<Item>,
    /// Items run (or passed, for waits) since the device opened.
    num_done: u64,
}

impl Queue {
    fn num_queued(&self) -> u64 {
        self.num_done + self.pending.len() as u64
    }
}

/// The streams of a simulated device (compute and copy), or of every device of a group.
pub(crate) struct SimQueues {
    queues: Mutex<Vec<Queue>>,
}

impl std::fmt::Debug for SimQueues {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let q = self.lock();
        let pending: Vec<usize> = q.iter().map(|q| q.pending.len()).collect();
        f.debug_struct("SimQueues").field("pending", &pending).finish()
    }
}

impl SimQueues {
    /// No streams yet ([`SimQueues::add_stream`] makes them).
    pub(crate) fn new() -> Arc<Self> {
        Arc::new(Self { queues: Mutex::new(Vec::new()) })
    }

    /// A new stream, empty; returns its index.
    pub(crate) fn add_stream(&self) -> usize {
        let mut queues = self.lock();
        queues.push(Queue::default());
        queues.len() - 1
    }

    fn lock(&self) -> MutexGuard<'_, Vec<Queue>> {
        // Work never panics while the lock is held (a kernel's fault is its error), but a test
        // thread may; the queues stay consistent either way.
        self.queues.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Queues `work` on `stream`.
    pub(crate) fn push(&self, stream: usize, work: Work) {
        self.lock()[stream].pending.push_back(Item::Run(work));
    }

    /// Makes the work queued on `stream` from now on wait for `mark`.
    pub(crate) fn push_wait(&self, stream: usize, mark: Mark) {
        if mark.stream != stream {
            self.lock()[stream].pending.push_back(Item::Wait(mark));
        }
    }

    /// The point after the work queued on `stream` so far.
    pub(crate) fn mark(&self, stream: usize) -> Mark {
        Mark { stream, seq: self.lock()[stream].num_queued() }
    }

    /// Runs `stream`'s work up to `mark` (and the other stream's that it waits for).
    pub(crate) fn run_to(&self, mark: Mark) -> Result<(), BackendError> {
        let mut queues = self.lock();
        let mut first_error = None;
        run_to(&mut queues, mark, &mut first_error);
        first_error.map_or(Ok(()), Err)
    }

    /// Runs everything queued on `stream`.
    pub(crate) fn synchronize(&self, stream: usize) -> Result<(), BackendError> {
        self.run_to(self.mark(stream))
    }

    /// Runs everything queued on every stream (before memory the work addresses is freed).
    pub(crate) fn finish(&self) -> Result<(), BackendError> {
        let mut queues = self.lock();
        let mut first_error = None;
        for stream in 0..queues.len() {
            let mark = Mark { stream, seq: queues[stream].num_queued() };
            run_to(&mut queues, mark, &mut first_error);
        }
        first_error.map_or(Ok(()), Err)
    }
}

/// Runs items of `mark.stream` until its mark. A wait runs the other stream up to its own mark
/// first; waits only ever point at work queued before them, so this never cycles.
fn run_to(queues: &mut [Queue], mark: Mark, first_error: &mut Option<BackendError>) {
    while queues[mark.stream].num_done < mark.seq {
        let q = &mut queues[mark.stream];
        let item = q.pending.pop_front().expect("a mark never passes the queued work");
        match item {
            Item::Run(work) => {
                if let Err(e) = work() {
                    first_error.get_or_insert(e);
                }
            }
            Item::Wait(other) => run_to(queues, other, first_error),
        }
        queues[mark.stream].num_done += 1;
    }
}

/// An address that queued work reads or writes later; the queue's user keeps the memory alive
/// until the work has run (a device synchronises before freeing it).
#[derive(Clone, Copy)]
pub(crate) struct SendPtr<T>(pub(crate) *mut T);

impl<T> SendPtr<T> {
    /// The address (a method, so that a closure captures the whole `SendPtr`, not its field).
    pub(crate) fn get(self) -> *mut T {
        self.0
    }
}

// SAFETY: the pointer is only dereferenced by the queued work, under the queues' lock, while the
// memory is kept alive by its owner (who finishes the queues before freeing it).
unsafe impl<T> Send for SendPtr<T> {}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU32, Ordering};

    /// A device's two streams on `q`: (compute, copy).
    fn device(q: &SimQueues) -> (usize, usize) {
        (q.add_stream(), q.add_stream())
    }

    fn note(log: &Arc<Mutex<Vec<&'static str>>>, what: &'static str) -> Work {
        let log = log.clone();
        Box::new(move || {
            log.lock().unwrap().push(what);
            Ok(())
        })
    }

    #[test]
    fn work_runs_only_when_waited_for_and_only_that_far() {
        let q = SimQueues::new();
        let (compute, _) = device(&q);
        let log = Arc::new(Mutex::new(Vec::new()));
        q.push(compute, note(&log, "a"));
        let after_a = q.mark(compute);
        q.push(compute, note(&log, "b"));
        assert!(log.lock().unwrap().is_empty(), "queued work waits");
        q.run_to(after_a).unwrap();
        assert_eq!(*log.lock().unwrap(), ["a"]);
        q.run_to(after_a).unwrap();
        q.synchronize(compute).unwrap();
        assert_eq!(*log.lock().unwrap(), ["a", "b"]);
    }

    #[test]
    fn a_wait_runs_the_other_stream_to_its_mark_first() {
        let q = SimQueues::new();
        let (compute, copy) = device(&q);
        let log = Arc::new(Mutex::new(Vec::new()));
        q.push(compute, note(&log, "forward"));
        let forward_done = q.mark(compute);
        q.push(compute, note(&log, "next forward"));
        q.push(copy, note(&log, "early copy"));
        q.push_wait(copy, forward_done);
        q.push(copy, note(&log, "copy"));
        q.synchronize(copy).unwrap();
        assert_eq!(*log.lock().unwrap(), ["early copy", "forward", "copy"]);
        q.synchronize(compute).unwrap();
        assert_eq!(log.lock().unwrap().last(), Some(&"next forward"));
    }

    #[test]
    fn devices_sharing_queues_wait_on_each_others_streams() {
        // Two ranks' compute streams, each waiting on the other's earlier work: rank 1 reads
        // rank 0's rows, then rank 0 may overwrite them once rank 1 has read them.
        let q = SimQueues::new();
        let ((rank0, _), (rank1, _)) = (device(&q), device(&q));
        let log = Arc::new(Mutex::new(Vec::new()));
        q.push(rank0, note(&log, "rank 0 writes layer 1"));
        let written = q.mark(rank0);
        q.push_wait(rank1, written);
        q.push(rank1, note(&log, "rank 1 reads layer 1"));
        let read = q.mark(rank1);
        q.push_wait(rank0, read);
        q.push(rank0, note(&log, "rank 0 writes layer 2"));
        q.push(rank1, note(&log, "rank 1 combines"));
        q.synchronize(rank0).unwrap();
        assert_eq!(
            *log.lock().unwrap(),
            ["rank 0 writes layer 1", "rank 1 reads layer 1", "rank 0 writes layer 2"]
        );
        q.synchronize(rank1).unwrap();
        assert_eq!(log.lock().unwrap().last(), Some(&"rank 1 combines"));
    }

    #[test]
    fn a_failed_launch_is_the_error_of_the_wait_that_ran_it() {
        let q = SimQueues::new();
        let (compute, _) = device(&q);
        let ran = Arc::new(AtomicU32::new(0));
        q.push(compute, Box::new(|| Err(BackendError::Simulator("fault".into()))));
        let counter = ran.clone();
        q.push(
            compute,
            Box::new(move || {
                counter.fetch_add(1, Ordering::SeqCst);
                Ok(())
            }),
        );
        let err = q.synchronize(compute).unwrap_err();
        assert!(err.to_string().contains("fault"), "{err}");
        assert_eq!(ran.load(Ordering::SeqCst), 1, "later work still runs");
        q.synchronize(compute).unwrap();
    }

    #[test]
    fn finish_runs_every_stream() {
        let q = SimQueues::new();
        let ((compute, copy), (peer, _)) = (device(&q), device(&q));
        let log = Arc::new(Mutex::new(Vec::new()));
        q.push(copy, note(&log, "copy"));
        q.push(compute, note(&log, "launch"));
        q.push(peer, note(&log, "peer launch"));
        q.finish().unwrap();
        assert_eq!(log.lock().unwrap().len(), 3);
    }
}
