//! Counting heap allocations, for the tests that hold a hot path to allocating nothing (or only
//! so much). A test binary installs [`Counting`] as its global allocator:
//!
//! ```ignore
//! #[global_allocator]
//! static GLOBAL: routed_test_support::Counting = routed_test_support::Counting;
//! ```
//!
//! and reads [`num_allocations`] (every thread) or [`num_allocations_here`] (this thread only,
//! so tests running side by side do not see each other's) around the code it measures.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::atomic::{AtomicU64, Ordering};

static NUM_ALLOCATIONS: AtomicU64 = AtomicU64::new(0);

thread_local! {
    static NUM_ALLOCATIONS_HERE: Cell<u64> = const { Cell::new(0) };
}

/// The system allocator, counting allocations and reallocations (a zeroed allocation is an
/// allocation): in total and per thread.
pub struct Counting;

fn count() {
    NUM_ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
    // A const-initialised thread-local without a destructor: reading it never allocates. Once
    // the thread is being torn down it may be gone; those allocations count in the total only.
    let _ = NUM_ALLOCATIONS_HERE.try_with(|n| n.set(n.get() + 1));
}

// SAFETY: every call is passed on to `System` unchanged; counting touches an atomic and a
// thread-local that never allocates.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        count();
        // SAFETY: the caller's contract is `System`'s.
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        count();
        // SAFETY: as above.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: as above.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        count();
        // SAFETY: as above.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

/// Allocations so far, on every thread (0 unless [`Counting`] is the global allocator).
pub fn num_allocations() -> u64 {
    NUM_ALLOCATIONS.load(Ordering::Relaxed)
}

/// Allocations so far on this thread.
pub fn num_allocations_here() -> u64 {
    NUM_ALLOCATIONS_HERE.with(Cell::get)
}
