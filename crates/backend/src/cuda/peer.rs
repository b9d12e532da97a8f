//! GPUs of an expert-parallel group that read each other's memory.
//!
//! Ranks of a group on GPUs with peer access (NVLink, or PCIe where the platform allows it)
//! exchange expert rows without the host: each rank's kernels read the other ranks' rows straight
//! from their device buffers. What makes that safe is stream order across devices: a rank reads a
//! peer's rows only after the peer's kernels wrote them, and a peer writes its buffer again only
//! after every rank has read it. Each rank has two events for that, recorded on its compute stream
//! and waited on by the others' ([`PeerPhase`]).
//!
//! A stream's wait binds to an event's most recent record at the time of the wait, so a rank must
//! not wait on a peer's event before the peer has recorded it for the same exchange: the caller
//! orders the two on the host (the ranks meet at a barrier between [`PeerLink::signal`] and
//! [`PeerLink::wait_for_others`]). The host never waits for a device here.
//!
//! [`link_peers`] joins devices opened for one group. The simulator's devices join when they
//! share their queues ([`CudaDevice::simulated_peer`]), which is what lets one device's stream
//! wait on another's there.

use super::{
    CudaDevice, DevSlice,
    device::{Engine, driver_err},
    stream::{Event, Stream},
};
use crate::BackendError;
use cudarc::driver::{CudaContext, sys};
use std::sync::{
    Arc,
    atomic::{AtomicU64, Ordering},
};

/// A point of an exchange that the other ranks wait for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PeerPhase {
    /// This rank's rows are written: the others may read them.
    Written,
    /// This rank has read the others' rows: they may write their buffers again.
    Read,
}

/// One rank's membership of a group of devices that read each other's memory.
#[derive(Clone)]
pub struct PeerLink {
    rank: usize,
    group: Arc<[PeerRank]>,
}

/// What a rank shares with the others.
struct PeerRank {
    written: Event,
    read: Event,
    /// The device address of the rank's published buffer (0 until published) and its length in
    /// `f32`s.
    rows: AtomicU64,
    rows_len: AtomicU64,
}

impl std::fmt::Debug for PeerLink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PeerLink")
            .field("rank", &self.rank)
            .field("world_size", &self.group.len())
            .finish()
    }
}

impl PeerLink {
    /// This device's rank in the group.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// Devices in the group.
    pub fn world_size(&self) -> usize {
        self.group.len()
    }

    /// Makes `rows` the buffer the other ranks read from this one (replacing an earlier one).
    pub fn publish(&self, rows: DevSlice<'_, f32>) {
        let me = &self.group[self.rank];
        me.rows_len.store(rows.len() as u64, Ordering::Release);
        me.rows.store(rows.addr(), Ordering::Release);
    }

    /// Every rank's published buffer, in rank order, into `out`. Fails naming a rank that has
    /// published none, or one whose buffer is shorter than `min_len`.
    pub fn buffers(&self, min_len: usize, out: &mut Vec<u64>) -> Result<(), BackendError> {
        out.clear();
        for (rank, r) in self.group.iter().enumerate() {
            let addr = r.rows.load(Ordering::Acquire);
            let len = r.rows_len.load(Ordering::Acquire) as usize;
            if addr == 0 || len < min_len {
                return Err(BackendError::Memory(format!(
                    "rank {rank} of the peer group has published {len} rows' values, the \
                     exchange reads {min_len}"
                )));
            }
            out.push(addr);
        }
        Ok(())
    }

    /// Records this rank's `phase` behind the work queued on `stream` (its compute stream).
    pub fn signal(&self, phase: PeerPhase, stream: &Stream) -> Result<(), BackendError> {
        self.group[self.rank].event(phase).record(stream)
    }

    /// Makes the work queued on `stream` from now on wait for every other rank's last `phase`
    /// signal. Every other rank must have signalled this exchange's `phase` before the call (the
    /// ranks meet on the host in between).
    pub fn wait_for_others(&self, phase: PeerPhase, stream: &Stream) -> Result<(), BackendError> {
        let mut others = self.group.iter().enumerate().filter(|&(rank, _)| rank != self.rank);
        others.try_for_each(|(_, r)| stream.wait(r.event(phase)))
    }
}

impl PeerRank {
    fn event(&self, phase: PeerPhase) -> &Event {
        match phase {
            PeerPhase::Written => &self.written,
            PeerPhase::Read => &self.read,
        }
    }
}

/// Joins `devices` (rank r at index r) into a group that reads each other's memory, enabling
/// peer access between every pair of GPUs. `Ok(false)` when they cannot: fewer than two devices,
/// a pair of GPUs without peer access, simulated devices that do not share queues, or a mix of the
/// two kinds; the ranks then exchange through host memory.
pub fn link_peers(devices: &[CudaDevice]) -> Result<bool, BackendError> {
    if devices.len() < 2 {
        return Ok(false);
    }
    if devices.iter().any(|d| d.peer_link().is_some()) {
        return Err(BackendError::Driver("a device is already in a peer group".into()));
    }
    let linked = match devices[0].engine() {
        Engine::Sim(first) => devices.iter().all(|d| match d.engine() {
            Engine::Sim(sim) => Arc::ptr_eq(sim.queues(), first.queues()),
            Engine::Driver(_) => false,
        }),
        Engine::Driver(_) => enable_driver_peers(devices)?,
    };
    if !linked {
        return Ok(false);
    }
    let group: Arc<[PeerRank]> = devices
        .iter()
        .map(|d| {
            Ok(PeerRank {
                written: d.new_event()?,
                read: d.new_event()?,
                rows: AtomicU64::new(0),
                rows_len: AtomicU64::new(0),
            })
        })
        .collect::<Result<Vec<_>, BackendError>>()?
        .into();
    for (rank, dev) in devices.iter().enumerate() {
        dev.set_peer_link(PeerLink { rank, group: group.clone() })?;
    }
    Ok(true)
}

/// Enables peer access from every GPU of `devices` to every other one, or returns `false`
/// (enabling nothing) if some pair has none.
fn enable_driver_peers(devices: &[CudaDevice]) -> Result<bool, BackendError> {
    let Some(contexts) =
        devices.iter().map(|d| d.cuda_context().cloned()).collect::<Option<Vec<_>>>()
    else {
        return Ok(false);
    };
    for (i, a) in contexts.iter().enumerate() {
        for b in &contexts[i + 1..] {
            if a.cu_device() == b.cu_device() {
                continue; // One GPU's primary context: its memory needs no peer access.
            }
            for (from, to) in [(a, b), (b, a)] {
                let mut can = 0;
                // SAFETY: two valid device handles and a valid out-pointer.
                unsafe { sys::cuDeviceCanAccessPeer(&mut can, from.cu_device(), to.cu_device()) }
                    .result()
                    .map_err(driver_err)?;
                if can == 0 {
                    return Ok(false);
                }
            }
        }
    }
    for (i, from) in contexts.iter().enumerate() {
        from.bind_to_thread().map_err(driver_err)?;
        for (j, to) in contexts.iter().enumerate() {
            if i == j || from.cu_device() == to.cu_device() {
                continue;
            }
            // SAFETY: `from` is bound to this thread and `to` is a live context.
            match unsafe { sys::cuCtxEnablePeerAccess(to.cu_ctx(), 0) }.result() {
                Ok(()) => {}
                Err(e) if e.0 == sys::cudaError_enum::CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED => {}
                Err(e) => return Err(driver_err(e)),
            }
        }
    }
    for owner in &contexts {
        grant_pool_access(owner, &contexts)?;
    }
    Ok(true)
}

/// Lets every other device of `contexts` read and write the memory `owner` allocates from its
/// memory pool, now and later. The arenas are stream-ordered allocations (`cuMemAllocAsync`,
/// where the device has pools), which peer access does not reach: a pool grants its own.
fn grant_pool_access(
    owner: &Arc<CudaContext>,
    contexts: &[Arc<CudaContext>],
) -> Result<(), BackendError> {
    if !owner.has_async_alloc() {
        return Ok(()); // `cuMemAlloc`'s memory, which peer access covers.
    }
    let access: Vec<sys::CUmemAccessDesc> = contexts
        .iter()
        .filter(|c| c.cu_device() != owner.cu_device())
        .map(|c| sys::CUmemAccessDesc {
            location: sys::CUmemLocation {
                type_: sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE,
                id: c.cu_device(),
            },
            flags: sys::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
        })
        .collect();
    if access.is_empty() {
        return Ok(()); // Every rank on this one device.
    }
    owner.bind_to_thread().map_err(driver_err)?;
    let mut pool: sys::CUmemoryPool = std::ptr::null_mut();
    // SAFETY: a valid device handle and out-pointer; the pool is the one `cuMemAllocAsync` on
    // this device's streams allocates from, and `access` holds `access.len()` descriptors.
    unsafe {
        sys::cuDeviceGetMemPool(&mut pool, owner.cu_device()).result().map_err(driver_err)?;
        sys::cuMemPoolSetAccess(pool, access.as_ptr(), access.len()).result().map_err(driver_err)
    }
}
