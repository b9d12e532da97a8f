//! Running a burst of parallel regions on the thread pool with its workers kept awake.
//!
//! A model step is a few dozen parallel regions (one per matrix product) with short serial work
//! between them (norms, the Mamba scan, routing). An idle pool worker goes to sleep within
//! microseconds, and waking it for the next region costs 10-30 µs on a virtual machine: more than
//! many batch-1 products take. [`with_hot_workers`] keeps every other worker spinning on the pool's
//! queues while the burst runs, so each region starts at once, and lets them sleep as soon as it
//! ends.

use std::cell::Cell;
use std::sync::atomic::{AtomicBool, Ordering};

thread_local! {
    /// Whether this thread is running a burst or spinning for one. A spinner that lands on such a
    /// thread (stolen while the thread waits inside a burst or another spinner) returns at once:
    /// spinning there would hold up the frames beneath it, and two bursts could each hold the
    /// other's caller.
    static BUSY: Cell<bool> = const { Cell::new(false) };
}

/// Runs `f` on a thread of the current rayon pool while the pool's other workers spin, taking any
/// job the pool has, until `f` returns. Results and panics are `f`'s.
///
/// Called from outside the pool, `f` moves onto a pool thread (the caller blocks); called inside a
/// burst or a spinner it simply runs `f`.
pub fn with_hot_workers<R: Send>(f: impl FnOnce() -> R + Send) -> R {
    let done = AtomicBool::new(false);
    let done = &done;
    rayon::scope(|s| {
        if BUSY.get() {
            return f();
        }
        let caller = rayon::current_thread_index();
        for _ in 1..rayon::current_num_threads() {
            s.spawn(move |_| spin(caller, done));
        }
        BUSY.set(true);
        let _end = EndOfBurst(Some(done));
        f()
    })
}

/// Clears [`BUSY`] and releases the spinners (when it holds their flag) however the burst or the
/// spin ends, panics included: the scope waits for every spinner.
struct EndOfBurst<'a>(Option<&'a AtomicBool>);

impl Drop for EndOfBurst<'_> {
    fn drop(&mut self) {
        if let Some(done) = self.0 {
            done.store(true, Ordering::Release);
        }
        BUSY.set(false);
    }
}

/// Takes pool jobs (or spins) until `done`. Returns at once on the burst's own thread (which pops
/// an unstolen spinner when it waits) and on busy threads.
fn spin(caller: Option<usize>, done: &AtomicBool) {
    if rayon::current_thread_index() == caller || BUSY.get() {
        return;
    }
    BUSY.set(true);
    let _end = EndOfBurst(None);
    while !done.load(Ordering::Acquire) {
        if let Some(rayon::Yield::Idle) = rayon::yield_now() {
            std::hint::spin_loop();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rayon::prelude::*;

    #[test]
    fn returns_the_result_of_nested_parallel_work() {
        let pool = rayon::ThreadPoolBuilder::new().num_threads(3).build().unwrap();
        let sum = pool.install(|| {
            with_hot_workers(|| (0..10_000u64).into_par_iter().map(|i| i * i).sum::<u64>())
        });
        assert_eq!(sum, (0..10_000u64).map(|i| i * i).sum());
    }

    /// `x`, after enough work that a pool job lasts long enough to be stolen.
    fn slow(x: u64) -> u64 {
        (0..2_000u64).fold(x, |a, i| std::hint::black_box(a ^ i) ^ i)
    }

    #[test]
    fn concurrent_bursts_on_one_pool_all_finish() {
        // Each burst's spinners may be stolen by a thread running the other burst; neither may
        // wait for the other.
        let pool = rayon::ThreadPoolBuilder::new().num_threads(2).build().unwrap();
        let totals: Vec<u64> = std::thread::scope(|t| {
            let handles: Vec<_> = (0..4u64)
                .map(|b| {
                    let pool = &pool;
                    t.spawn(move || {
                        (0..200)
                            .map(|_| {
                                pool.install(|| {
                                    with_hot_workers(|| {
                                        (0..64u64).into_par_iter().map(|i| slow(i + b)).sum::<u64>()
                                    })
                                })
                            })
                            .sum()
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        for (b, total) in totals.into_iter().enumerate() {
            let one: u64 = (0..64u64).map(|i| slow(i + b as u64)).sum();
            assert_eq!(total, 200 * one);
        }
    }

    #[test]
    fn nested_bursts_run_inline() {
        let pool = rayon::ThreadPoolBuilder::new().num_threads(2).build().unwrap();
        let v = pool.install(|| with_hot_workers(|| with_hot_workers(|| 7)));
        assert_eq!(v, 7);
    }

    #[test]
    fn a_panic_in_the_burst_reaches_the_caller_and_clears_the_flag() {
        let pool = rayon::ThreadPoolBuilder::new().num_threads(2).build().unwrap();
        let caught = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            pool.install(|| with_hot_workers(|| panic!("boom")))
        }));
        assert!(caught.is_err());
        // Every worker is usable for a new burst afterwards.
        let sum = pool.install(|| with_hot_workers(|| (0..100u32).into_par_iter().sum::<u32>()));
        assert_eq!(sum, 4950);
    }
}
