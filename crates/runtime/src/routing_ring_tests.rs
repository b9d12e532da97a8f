//! The ring protocol against a stand-in engine whose copies really are asynchronous: a "copy
//! stream" thread runs them in submission order, and only as far as the test allows, so slots can
//! be held in flight for as long as a test needs.

use super::*;
use std::{
    collections::VecDeque,
    panic::{AssertUnwindSafe, catch_unwind},
    sync::Condvar,
    thread,
};

/// Host memory standing in for a device: a routing buffer of one layer and one expert per token
/// (so a step's rows are just its token values), one stream that runs the forwards' writes and
/// the copies in the order they were queued (as the compute stream waits on the copy events),
/// and an event per slot.
struct StreamEngine {
    inner: Arc<(Mutex<Stream>, Condvar)>,
    thread: Option<thread::JoinHandle<()>>,
}

enum Job {
    /// A forward writing the buffer.
    Write(Vec<i16>),
    /// A copy of the first tokens of the buffer into a slot.
    Copy { slot: usize, num_tokens: usize },
}

#[derive(Default)]
struct Stream {
    source: Vec<i16>,
    /// Tokens of the last forward queued.
    last_step_len: usize,
    slots: Vec<Vec<i16>>,
    /// Copies submitted into / landed in each slot: its event is complete when they are equal.
    submitted: Vec<u64>,
    landed: Vec<u64>,
    queue: VecDeque<Job>,
    /// Copies the test lets the stream run (writes need none).
    credits: usize,
    fail_reads: bool,
    stop: bool,
}

impl Stream {
    fn can_run(&self) -> bool {
        match self.queue.front() {
            None => false,
            Some(Job::Write(_)) => true,
            Some(Job::Copy { .. }) => self.credits > 0,
        }
    }

    fn run_front(&mut self) {
        match self.queue.pop_front() {
            Some(Job::Write(ids)) => self.source = ids,
            Some(Job::Copy { slot, num_tokens }) => {
                self.credits -= 1;
                self.slots[slot] = self.source[..num_tokens].to_vec();
                self.landed[slot] += 1;
            }
            None => {}
        }
    }
}

impl StreamEngine {
    fn new(num_slots: usize) -> Arc<Self> {
        let stream = Stream {
            slots: vec![Vec::new(); num_slots],
            submitted: vec![0; num_slots],
            landed: vec![0; num_slots],
            ..Stream::default()
        };
        let inner = Arc::new((Mutex::new(stream), Condvar::new()));
        let worker = inner.clone();
        let thread = thread::spawn(move || {
            let (lock, cv) = &*worker;
            let mut s = lock.lock().unwrap();
            loop {
                s = cv.wait_while(s, |s| !s.stop && !s.can_run()).unwrap();
                if s.stop {
                    return;
                }
                s.run_front();
                cv.notify_all();
            }
        });
        Arc::new(Self { inner, thread: Some(thread) })
    }

    fn with<R>(&self, f: impl FnOnce(&mut Stream) -> R) -> R {
        let (lock, cv) = &*self.inner;
        let r = f(&mut lock.lock().unwrap());
        cv.notify_all();
        r
    }

    /// Lets `n` more queued copies run.
    fn allow(&self, n: usize) {
        self.with(|s| s.credits += n);
    }

    /// A forward: queues the step's write of the buffer behind every copy queued before it, and
    /// returns at once (compute never waits on the host).
    fn forward(&self, ids: &[i16]) {
        self.with(|s| {
            s.last_step_len = ids.len();
            s.queue.push_back(Job::Write(ids.to_vec()));
        });
    }

    /// Copies queued and not yet run.
    fn pending(&self) -> usize {
        self.with(|s| s.queue.iter().filter(|j| matches!(j, Job::Copy { .. })).count())
    }
}

impl Drop for StreamEngine {
    fn drop(&mut self) {
        self.with(|s| s.stop = true);
        if let Some(t) = self.thread.take() {
            t.join().unwrap();
        }
    }
}

impl CopyEngine for StreamEngine {
    fn num_slots(&self) -> usize {
        self.with(|s| s.slots.len())
    }

    fn submit(&self, slot: SlotId, num_tokens: usize) -> Result<(), CopyError> {
        self.with(|s| {
            if num_tokens != s.last_step_len {
                return Err(CopyError::WrongStep { held: s.last_step_len, asked: num_tokens });
            }
            s.submitted[slot.0] += 1;
            s.queue.push_back(Job::Copy { slot: slot.0, num_tokens });
            Ok(())
        })
    }

    fn wait(&self, slot: SlotId) -> Result<(), CopyError> {
        let (lock, cv) = &*self.inner;
        let s = lock.lock().unwrap();
        drop(cv.wait_while(s, |s| s.landed[slot.0] != s.submitted[slot.0]).unwrap());
        Ok(())
    }

    fn read(&self, slot: SlotId, num_tokens: usize, out: &mut Vec<i16>) -> Result<(), CopyError> {
        self.with(|s| {
            if s.fail_reads {
                return Err(CopyError::Device("injected read failure".into()));
            }
            assert_eq!(s.slots[slot.0].len(), num_tokens, "a slot holds its step's rows");
            out.extend_from_slice(&s.slots[slot.0]);
            Ok(())
        })
    }
}

fn ring(engine: &Arc<StreamEngine>) -> SlotRing {
    SlotRing::new(engine.clone())
}

/// A step's rows: `len` tokens whose ids all say which step wrote them.
fn rows(step: usize, len: usize) -> Vec<i16> {
    vec![step as i16; len]
}

/// A consumer that never goes away (its end of the liveness channel is kept).
fn alive() -> (Sender<()>, Receiver<()>) {
    crossbeam_channel::bounded(0)
}

#[test]
fn every_slot_delivers_its_own_steps_rows_in_order_on_the_copy_thread() {
    let engine = StreamEngine::new(3);
    engine.allow(usize::MAX / 2);
    let ring = ring(&engine);
    let (inbox, rx) = crossbeam_channel::unbounded::<(usize, InFlight)>();
    let (done_tx, done) = crossbeam_channel::unbounded();
    let (keep, consumer) = crossbeam_channel::bounded::<()>(0);
    let copier = thread::spawn(move || {
        let _keep = keep;
        for (step, flight) in rx {
            let mut ids = Vec::new();
            flight.complete(&mut ids).unwrap();
            done_tx.send((step, ids)).unwrap();
        }
    });
    for step in 0..60 {
        let (lease, _waited) = ring.acquire(&consumer).unwrap();
        engine.forward(&rows(step, 1 + step % 5));
        inbox.send((step, lease.submit(1 + step % 5).unwrap())).unwrap();
    }
    drop(inbox);
    copier.join().unwrap();
    let got: Vec<(usize, Vec<i16>)> = done.iter().collect();
    assert_eq!(got.len(), 60);
    for (i, (step, ids)) in got.into_iter().enumerate() {
        assert_eq!(step, i, "steps complete in the order they were submitted");
        assert_eq!(ids, rows(step, 1 + step % 5), "step {step} reads its own rows");
    }
    assert_eq!(ring.num_free(), 3);
}

#[test]
fn a_full_ring_makes_the_runner_wait_and_never_overwrites_a_slot_in_flight() {
    let engine = StreamEngine::new(2);
    let ring = ring(&engine);
    let (_keep, consumer) = alive();
    // Two steps in flight, their copies held on the stream.
    let mut flights = Vec::new();
    for step in 0..2 {
        let (lease, _) = ring.acquire(&consumer).unwrap();
        engine.forward(&rows(step, 4));
        flights.push(lease.submit(4).unwrap());
    }
    assert!(ring.try_acquire().is_none(), "every slot is in flight");
    assert_eq!(ring.num_free(), 0);
    // The next step's runner waits for a slot.
    let waiter = {
        let (ring, consumer) = (ring.clone(), consumer.clone());
        thread::spawn(move || ring.acquire(&consumer).map(|(lease, _)| lease))
    };
    let step1 = flights.pop().unwrap();
    let step0 = flights.pop().unwrap();
    let freed = step0.slot();
    engine.allow(1);
    let mut ids = Vec::new();
    step0.complete(&mut ids).unwrap();
    assert_eq!(ids, rows(0, 4));
    let lease = waiter.join().unwrap().expect("a slot came back");
    assert_eq!(lease.slot(), freed, "the waiting runner gets the slot that was read");
    // Its forward is queued while step 1's copy is still held: it must not overwrite the buffer
    // before that copy has read it.
    engine.forward(&rows(2, 4));
    engine.allow(1);
    ids.clear();
    step1.complete(&mut ids).unwrap();
    assert_eq!(ids, rows(1, 4), "step 1's rows were copied before step 2's forward wrote");
    let flight = lease.submit(4).unwrap();
    engine.allow(1);
    ids.clear();
    flight.complete(&mut ids).unwrap();
    assert_eq!(ids, rows(2, 4));
    assert_eq!(ring.num_free(), 2);
}

#[test]
fn a_slot_comes_back_on_every_path() {
    let engine = StreamEngine::new(2);
    let ring = ring(&engine);
    let (_keep, consumer) = alive();

    // A lease dropped unsubmitted (the step failed before its copy).
    drop(ring.acquire(&consumer).unwrap());
    assert_eq!(ring.num_free(), 2);

    // A step that panicked while holding its lease.
    let panicked = catch_unwind(AssertUnwindSafe(|| {
        let _lease = ring.try_acquire().unwrap();
        panic!("the forward panicked");
    }));
    assert!(panicked.is_err());
    assert_eq!(ring.num_free(), 2);

    // A submit the engine refuses.
    engine.forward(&rows(0, 2));
    let refused = ring.try_acquire().unwrap().submit(3);
    assert!(matches!(refused, Err(CopyError::WrongStep { held: 2, asked: 3 })));
    assert_eq!(ring.num_free(), 2);

    // An in-flight slot dropped unread: it waits for its copy, then goes back.
    let flight = ring.try_acquire().unwrap().submit(2).unwrap();
    let dropper = thread::spawn(move || drop(flight));
    engine.allow(1);
    dropper.join().unwrap();
    assert_eq!(engine.pending(), 0, "the dropped slot's copy landed before it was freed");
    assert_eq!(ring.num_free(), 2);

    // A read that fails still returns the slot.
    let flight = ring.try_acquire().unwrap().submit(2).unwrap();
    engine.allow(1);
    engine.with(|s| s.fail_reads = true);
    assert!(matches!(flight.complete(&mut Vec::new()), Err(CopyError::Device(_))));
    assert_eq!(ring.num_free(), 2);
}

#[test]
fn shutdown_with_slots_in_flight_frees_them_and_never_hangs_the_runner() {
    let engine = StreamEngine::new(3);
    let ring = ring(&engine);
    let (keep, consumer) = alive();
    let mut flights = Vec::new();
    for step in 0..3 {
        let (lease, _) = ring.acquire(&consumer).unwrap();
        engine.forward(&rows(step, 1));
        flights.push(lease.submit(1).unwrap());
    }
    // Steps 0 and 1 wait in the copy worker's inbox when it stops; step 2 is still the runner's.
    let step2 = flights.pop().unwrap();
    let (inbox, rx) = crossbeam_channel::unbounded::<InFlight>();
    flights.into_iter().for_each(|f| inbox.send(f).unwrap());
    engine.allow(2);
    // The worker stops: its liveness end and its inbox go, with the messages in it.
    drop((keep, rx));
    assert_eq!(ring.num_free(), 2, "the unread slots came back once their copies landed");
    // A free slot is still handed out...
    let (a, _) = ring.acquire(&consumer).unwrap();
    let (b, _) = ring.acquire(&consumer).unwrap();
    // ...but with every slot taken and nobody to return them, waiting fails at once.
    assert_eq!(ring.acquire(&consumer).err(), Some(RingClosed));
    // A hand-off to the stopped worker fails; the message it gives back frees its slot.
    let back = inbox.send(step2).unwrap_err().into_inner();
    engine.allow(1);
    drop((a, b, back));
    assert_eq!(ring.num_free(), 3);
}

#[test]
fn the_host_engine_copies_the_steps_rows_and_refuses_a_mismatched_step() {
    let mut buffer = RoutingBuffer::new(2, 2, 8);
    assert!(buffer.begin_step(3));
    for l in 0..2 {
        for (i, id) in buffer.layer_mut(l).iter_mut().enumerate() {
            *id = (10 * l + i) as i16;
        }
    }
    let engine = Arc::new(HostCopyEngine::new(2, buffer));
    let ring = SlotRing::new(engine.clone());
    let mut ids = Vec::new();
    ring.try_acquire().unwrap().submit(3).unwrap().complete(&mut ids).unwrap();
    assert_eq!(ids, [0, 1, 2, 3, 4, 5, 10, 11, 12, 13, 14, 15]);
    assert!(matches!(
        ring.try_acquire().unwrap().submit(2),
        Err(CopyError::WrongStep { held: 3, asked: 2 })
    ));
    assert!(matches!(
        ring.try_acquire().unwrap().submit(9),
        Err(CopyError::TooManyTokens { num_tokens: 9, max_tokens: 8 })
    ));
    assert_eq!(ring.num_free(), 2);
}
