//! Collectives between the ranks of an expert-parallel group.
//!
//! Under expert parallelism every rank holds a slice of each MoE layer's experts and computes the
//! rest of the model itself. After a rank has run its experts, [`Collective::all_gather`] hands
//! every rank every other rank's expert outputs, so each rank combines a token's experts in the
//! same order as a single rank would. Work is grouped into *lockstep units* (an engine step or a
//! dummy forward), numbered by the executor and begun together ([`Collective::begin`]); a rank
//! whose part of a unit fails calls [`Collective::abort`] so that no other rank waits for it.
//!
//! [`SingleRank`] is the trivial group of one. [`InProcessGroup`] joins ranks that run as threads
//! of one process (the CPU runners, and the GPU runners through page-locked host copies), through
//! shared buffers and a barrier. A NCCL group for GPU ranks would implement the same trait.

use std::fmt;
use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// Why a collective did not complete.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum CollectiveError {
    /// Another rank failed its part of this unit (or this rank called `abort`).
    #[error("lockstep unit {epoch} was aborted by a failing rank")]
    Aborted {
        /// The unit.
        epoch: u64,
    },
    /// This rank began a unit the group has already moved past: the ranks are out of lockstep.
    #[error("rank {rank} began lockstep unit {epoch}, but the group is at unit {group_epoch}")]
    OutOfLockstep {
        /// The late rank.
        rank: usize,
        /// The unit it began.
        epoch: u64,
        /// The unit the group is at.
        group_epoch: u64,
    },
    /// The ranks disagree on how the gathered buffer is split.
    #[error("all_gather on rank {rank}: {num_segments} segments for {world_size} ranks")]
    BadSegments {
        /// The rank that noticed.
        rank: usize,
        /// Segments it was given.
        num_segments: usize,
        /// Ranks in the group.
        world_size: usize,
    },
}

/// What the ranks of an expert-parallel group do together. Every rank calls the same operations in
/// the same order; each call returns once every rank has made it (or the unit was aborted).
pub trait Collective: Send + Sync + fmt::Debug {
    /// This rank, `0..world_size`.
    fn rank(&self) -> usize;

    /// Ranks in the group.
    fn world_size(&self) -> usize;

    /// Begins lockstep unit `epoch` on this rank and waits until every rank has begun it. Units are
    /// numbered from 1 and begun in increasing order; a rank that begins one the group has moved
    /// past is out of lockstep, which aborts the group's current unit.
    fn begin(&self, epoch: u64) -> Result<(), CollectiveError>;

    /// Every rank has written its own segment of `data` (`data[segments[rank]]`); on return every
    /// rank's `data` holds every rank's segment. `segments` must be identical on every rank, one
    /// range per rank.
    fn all_gather(
        &self,
        data: &mut [f32],
        segments: &[Range<usize>],
    ) -> Result<(), CollectiveError>;

    /// Waits until every rank has reached this barrier.
    fn barrier(&self) -> Result<(), CollectiveError>;

    /// Fails unit `epoch` on every rank: ranks waiting in one of its collectives, and ranks that
    /// reach one later, get [`CollectiveError::Aborted`]. A rank whose part of a unit fails calls
    /// this before it returns, so no other rank waits for it forever.
    fn abort(&self, epoch: u64);

    /// Time this rank has spent in collectives since it was made.
    fn time_spent(&self) -> CollectiveTime {
        CollectiveTime::default()
    }
}

/// Where a rank's time in collectives went.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CollectiveTime {
    /// Waiting at barriers for the other ranks (their longer work, and the hand-over itself).
    pub waiting: Duration,
    /// Copying expert outputs to and from the shared staging buffers.
    pub exchanging: Duration,
}

impl std::ops::Add for CollectiveTime {
    type Output = Self;

    fn add(self, other: Self) -> Self {
        Self {
            waiting: self.waiting + other.waiting,
            exchanging: self.exchanging + other.exchanging,
        }
    }
}

/// The group of one rank: every collective is immediate.
#[derive(Clone, Copy, Debug, Default)]
pub struct SingleRank;

impl Collective for SingleRank {
    fn rank(&self) -> usize {
        0
    }

    fn world_size(&self) -> usize {
        1
    }

    fn begin(&self, _epoch: u64) -> Result<(), CollectiveError> {
        Ok(())
    }

    fn all_gather(&self, _: &mut [f32], segments: &[Range<usize>]) -> Result<(), CollectiveError> {
        check_segments(0, 1, segments)
    }

    fn barrier(&self) -> Result<(), CollectiveError> {
        Ok(())
    }

    fn abort(&self, _epoch: u64) {}
}

fn check_segments(
    rank: usize,
    world_size: usize,
    segments: &[Range<usize>],
) -> Result<(), CollectiveError> {
    if segments.len() == world_size {
        return Ok(());
    }
    Err(CollectiveError::BadSegments { rank, num_segments: segments.len(), world_size })
}

/// Ranks that are threads of one process, joined by shared staging buffers and a barrier.
///
/// A barrier first spins briefly on the generation counter (ranks of one step arrive within
/// microseconds of each other when each has its own core), then sleeps on a condition variable
/// (so oversubscribed ranks do not steal each other's cores).
#[derive(Debug)]
pub struct InProcessGroup {
    world_size: usize,
    state: Mutex<GroupState>,
    wake: Condvar,
    /// Bumped each time a barrier completes; read without the lock while spinning.
    generation: AtomicU64,
    /// Two sets of per-rank staging buffers, used alternately by successive gathers: a rank can
    /// fill the next set while a slower one still reads the current one, and a set is reused only
    /// after a barrier every rank passes once its reads are done.
    staging: [Vec<Mutex<Vec<f32>>>; 2],
}

#[derive(Debug, Default)]
struct GroupState {
    /// The unit the group is at.
    epoch: u64,
    /// Ranks waiting at the current barrier.
    num_arrived: usize,
    /// Every unit up to this one is aborted.
    aborted_through: Option<u64>,
}

impl GroupState {
    fn is_aborted(&self) -> bool {
        self.is_over(self.epoch)
    }

    /// Whether a rank still inside unit `epoch` must give up: the unit was aborted, or the group
    /// has moved past it.
    fn is_over(&self, epoch: u64) -> bool {
        self.epoch != epoch || self.aborted_through.is_some_and(|a| a >= epoch)
    }

    fn abort(&mut self, epoch: u64) {
        self.aborted_through = Some(self.aborted_through.map_or(epoch, |a| a.max(epoch)));
    }
}

/// Spins before a barrier wait falls back to sleeping.
const SPIN_ROUNDS: u32 = 4_000;

impl InProcessGroup {
    /// A group of `world_size` ranks; returns each rank's handle, rank order.
    pub fn ranks(world_size: usize) -> Vec<Arc<dyn Collective>> {
        assert!(world_size > 0, "a group has at least one rank");
        let buffers = || (0..world_size).map(|_| Mutex::new(Vec::new())).collect();
        let group = Arc::new(Self {
            world_size,
            state: Mutex::new(GroupState::default()),
            wake: Condvar::new(),
            generation: AtomicU64::new(0),
            staging: [buffers(), buffers()],
        });
        (0..world_size)
            .map(|rank| {
                Arc::new(InProcessRank {
                    group: group.clone(),
                    rank,
                    parity: AtomicU64::new(0),
                    waiting_ns: AtomicU64::new(0),
                    exchanging_ns: AtomicU64::new(0),
                }) as Arc<dyn Collective>
            })
            .collect()
    }

    fn lock(&self) -> MutexGuard<'_, GroupState> {
        // A rank that panicked while holding the lock left nothing half-written: every update
        // under it is a few integer stores.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn barrier(&self) -> Result<(), CollectiveError> {
        let mut state = self.lock();
        let epoch = state.epoch;
        if state.is_aborted() {
            return Err(CollectiveError::Aborted { epoch });
        }
        state.num_arrived += 1;
        let generation = self.generation.load(Ordering::Acquire);
        if state.num_arrived == self.world_size {
            state.num_arrived = 0;
            self.generation.store(generation + 1, Ordering::Release);
            drop(state);
            self.wake.notify_all();
            return Ok(());
        }
        drop(state);
        for _ in 0..SPIN_ROUNDS {
            if self.generation.load(Ordering::Acquire) != generation {
                return Ok(());
            }
            std::hint::spin_loop();
        }
        let mut state = self.lock();
        loop {
            if self.generation.load(Ordering::Acquire) != generation {
                return Ok(());
            }
            if state.is_over(epoch) {
                return Err(CollectiveError::Aborted { epoch });
            }
            state = self.wake.wait(state).unwrap_or_else(|e| e.into_inner());
        }
    }
}

/// One rank's handle on an [`InProcessGroup`].
#[derive(Debug)]
struct InProcessRank {
    group: Arc<InProcessGroup>,
    rank: usize,
    /// Which staging set this rank's next gather uses.
    parity: AtomicU64,
    waiting_ns: AtomicU64,
    exchanging_ns: AtomicU64,
}

impl InProcessRank {
    fn timed<T>(&self, counter: &AtomicU64, f: impl FnOnce() -> T) -> T {
        let started = Instant::now();
        let out = f();
        counter.fetch_add(started.elapsed().as_nanos() as u64, Ordering::Relaxed);
        out
    }

    fn barrier_timed(&self) -> Result<(), CollectiveError> {
        self.timed(&self.waiting_ns, || self.group.barrier())
    }
}

impl Collective for InProcessRank {
    fn rank(&self) -> usize {
        self.rank
    }

    fn world_size(&self) -> usize {
        self.group.world_size
    }

    fn begin(&self, epoch: u64) -> Result<(), CollectiveError> {
        let g = &self.group;
        // Ranks may have left an aborted unit after different numbers of gathers: every unit
        // starts from the first staging set.
        self.parity.store(0, Ordering::Relaxed);
        let mut state = g.lock();
        if epoch < state.epoch {
            let group_epoch = state.epoch;
            state.abort(group_epoch);
            drop(state);
            g.wake.notify_all();
            return Err(CollectiveError::OutOfLockstep { rank: self.rank, epoch, group_epoch });
        }
        if epoch > state.epoch {
            // The first rank into a new unit: every rank has left the previous one (the executor
            // starts a unit only when all ranks answered the last), so nobody waits at a barrier.
            state.epoch = epoch;
            state.num_arrived = 0;
            // A rank still waiting in an earlier unit must see that the group moved on.
            g.wake.notify_all();
        }
        drop(state);
        self.barrier_timed()
    }

    fn all_gather(
        &self,
        data: &mut [f32],
        segments: &[Range<usize>],
    ) -> Result<(), CollectiveError> {
        let g = &self.group;
        check_segments(self.rank, g.world_size, segments)?;
        if g.world_size == 1 {
            return Ok(());
        }
        let parity = self.parity.fetch_xor(1, Ordering::Relaxed) as usize;
        let staging = &g.staging[parity];
        self.timed(&self.exchanging_ns, || {
            let mine = &data[segments[self.rank].clone()];
            let mut slot = staging[self.rank].lock().unwrap_or_else(|e| e.into_inner());
            slot.clear();
            slot.extend_from_slice(mine);
        });
        self.barrier_timed()?;
        self.timed(&self.exchanging_ns, || {
            for (rank, range) in segments.iter().enumerate().filter(|&(r, _)| r != self.rank) {
                let slot = staging[rank].lock().unwrap_or_else(|e| e.into_inner());
                data[range.clone()].copy_from_slice(&slot[..range.len()]);
            }
        });
        Ok(())
    }

    fn barrier(&self) -> Result<(), CollectiveError> {
        self.barrier_timed()
    }

    fn time_spent(&self) -> CollectiveTime {
        let read = |c: &AtomicU64| Duration::from_nanos(c.load(Ordering::Relaxed));
        CollectiveTime { waiting: read(&self.waiting_ns), exchanging: read(&self.exchanging_ns) }
    }

    fn abort(&self, epoch: u64) {
        let g = &self.group;
        g.lock().abort(epoch);
        g.wake.notify_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::thread;

    /// Runs `f(rank handle)` on one thread per rank and returns the results in rank order.
    fn on_ranks<T: Send>(world: usize, f: impl Fn(&dyn Collective) -> T + Sync) -> Vec<T> {
        let ranks = InProcessGroup::ranks(world);
        thread::scope(|s| {
            let handles: Vec<_> = ranks.iter().map(|c| s.spawn(|| f(c.as_ref()))).collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        })
    }

    #[test]
    fn all_gather_gives_every_rank_every_segment_over_many_rounds() {
        for world in [1, 2, 3, 4] {
            let results = on_ranks(world, |c| {
                let mut seen = Vec::new();
                for epoch in 1..=50u64 {
                    c.begin(epoch).unwrap();
                    // Segments of varying sizes, some empty, identical on every rank.
                    let sizes: Vec<usize> =
                        (0..world).map(|r| (epoch as usize * 7 + r * 3) % 5).collect();
                    let mut segments = Vec::new();
                    let mut at = 0;
                    for s in &sizes {
                        segments.push(at..at + s);
                        at += s;
                    }
                    let mut data = vec![f32::NAN; at];
                    for x in &mut data[segments[c.rank()].clone()] {
                        *x = (epoch * 100 + c.rank() as u64) as f32;
                    }
                    c.all_gather(&mut data, &segments).unwrap();
                    seen.push(data);
                }
                seen
            });
            for r in 1..world {
                assert_eq!(results[r], results[0], "world {world}: rank {r} differs");
            }
            assert!(results[0].iter().flatten().all(|x| x.is_finite()));
        }
    }

    #[test]
    fn an_aborting_rank_releases_the_ranks_waiting_for_it() {
        let results = on_ranks(3, |c| {
            c.begin(1)?;
            if c.rank() == 2 {
                c.abort(1);
                return Err(CollectiveError::Aborted { epoch: 1 });
            }
            c.barrier()
        });
        for r in results {
            assert_eq!(r, Err(CollectiveError::Aborted { epoch: 1 }));
        }
    }

    #[test]
    fn a_rank_that_fails_before_beginning_aborts_the_unit_and_the_next_one_runs() {
        // The executor starts a unit once every rank has answered the last one.
        let between_units = std::sync::Barrier::new(2);
        let results = on_ranks(2, |c| {
            // Rank 1 fails its part of unit 1 before beginning it.
            let first = if c.rank() == 1 {
                c.abort(1);
                Err(CollectiveError::Aborted { epoch: 1 })
            } else {
                c.begin(1).and_then(|_| c.barrier())
            };
            between_units.wait();
            // Both then run unit 2 normally.
            let second = c.begin(2).and_then(|_| {
                let mut data = vec![c.rank() as f32; 2];
                c.all_gather(&mut data, &[0..1, 1..2]).map(|_| data)
            });
            (first, second)
        });
        for (first, second) in results {
            assert_eq!(first, Err(CollectiveError::Aborted { epoch: 1 }));
            assert_eq!(second, Ok(vec![0.0, 1.0]));
        }
    }

    #[test]
    fn a_rank_out_of_lockstep_is_refused() {
        let ranks = InProcessGroup::ranks(2);
        let (a, b) = (ranks[0].clone(), ranks[1].clone());
        thread::scope(|s| {
            let t = s.spawn(move || b.begin(3));
            assert!(a.begin(3).is_ok());
            assert!(t.join().unwrap().is_ok());
        });
        let err = ranks[1].begin(2).unwrap_err();
        assert!(matches!(
            err,
            CollectiveError::OutOfLockstep { rank: 1, epoch: 2, group_epoch: 3 }
        ));
        // Unit 3 is now aborted for everyone.
        assert_eq!(ranks[0].barrier(), Err(CollectiveError::Aborted { epoch: 3 }));
    }

    #[test]
    fn segments_must_match_the_group() {
        let err = SingleRank.all_gather(&mut [], &[0..0, 0..0]).unwrap_err();
        assert!(matches!(err, CollectiveError::BadSegments { num_segments: 2, .. }));
    }
}
