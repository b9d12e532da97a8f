//! Host-side pieces the kernels depend on: pinned buffers for device-to-host copies, the rotary
//! table, the sampling parameters' memory layout.

use super::{
    CudaDevice, Event, Stream,
    arena::{DevSlice, DeviceElem},
    device::driver_err,
    sim::queue::SendPtr,
    stream::SimStream,
};
use crate::BackendError;
use cudarc::driver::{
    PinnedHostSlice, result,
    sys::{CUDA_MEMCPY2D, CUdeviceptr, CUevent_flags, CUmemorytype, cuMemcpy2DAsync_v2},
};

/// A page-locked host buffer that the CPU reads after a copy from the device, or writes before a
/// copy to it (the step inputs' staging).
///
/// Allocated with flags 0, not cudarc's `alloc_pinned` (write-combined memory, which the CPU reads
/// slowly). With event tracking off, cudarc does not order reads of the buffer after the copy, so
/// the buffer records its own event after each copy and [`PinnedBuffer::wait`] blocks on it, as
/// its [`HostWait`] says. On the simulator it is ordinary memory, and a copy runs when its
/// stream's work is waited for. Dropping the buffer waits for its copies.
pub struct PinnedBuffer<T: DeviceElem> {
    host: HostMemory<T>,
    copied: Event,
}

/// How a thread waiting for a [`PinnedBuffer`]'s copy waits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HostWait {
    /// As the context schedules its waits: spinning while the process has fewer contexts than
    /// the machine has cores. For waits on a step's path (its sampled tokens, an expert
    /// exchange), where a sleeping thread would add an interrupt's wake-up to every step.
    Spin,
    /// Asleep until the device signals the copy (`CU_EVENT_BLOCKING_SYNC`). For a thread that
    /// only waits, off every step's path (the routing copy worker), which should not hold a core.
    Sleep,
}

enum HostMemory<T: DeviceElem> {
    Pinned(PinnedHostSlice<T>),
    /// The simulator's: host memory, and the device's queues (which must run the copies that
    /// address it before it is freed).
    Plain(Vec<T>, SimStream),
}

impl<T: DeviceElem> Drop for PinnedBuffer<T> {
    fn drop(&mut self) {
        // A copy still landing in freed memory would write into whatever is there next. Nobody
        // is left to hear of a failure.
        let _ = self.copied.synchronize();
        if let HostMemory::Plain(_, sim) = &self.host {
            let _ = sim.finish_device();
        }
    }
}

impl<T: DeviceElem + cudarc::driver::DeviceRepr + cudarc::driver::ValidAsZeroBits> PinnedBuffer<T> {
    /// Allocates `len` elements, for waits on a step's path ([`HostWait::Spin`]).
    pub fn new(dev: &CudaDevice, len: usize) -> Result<Self, BackendError> {
        Self::with_wait(dev, len, HostWait::Spin)
    }

    /// Allocates `len` elements, waited for as `wait` says.
    pub fn with_wait(dev: &CudaDevice, len: usize, wait: HostWait) -> Result<Self, BackendError> {
        // cudarc asserts on an overflowing size; refuse it here instead.
        len.checked_mul(size_of::<T>())
            .filter(|&b| b < isize::MAX as usize)
            .ok_or_else(|| BackendError::Memory(format!("a pinned buffer of {len} elements")))?;
        let host = match (dev.cuda_context(), dev.compute_stream().simulated()) {
            // SAFETY: flags 0 is plain page-locked memory; the contents are set before they are
            // read (`wait` is the only reader and follows a copy), and every bit pattern is a
            // valid `T`.
            (Some(ctx), _) => HostMemory::Pinned(
                unsafe { ctx.alloc_pinned_with_flags::<T>(len, 0) }.map_err(driver_err)?,
            ),
            (None, Some(sim)) => HostMemory::Plain(vec![T::default(); len], sim.clone()),
            (None, None) => return Err(mixed()),
        };
        let copied = dev.event_with(Some(match wait {
            // Without timing, the cheapest event to record and to poll.
            HostWait::Spin => CUevent_flags::CU_EVENT_DISABLE_TIMING,
            HostWait::Sleep => CUevent_flags::CU_EVENT_BLOCKING_SYNC,
        }))?;
        Ok(Self { host, copied })
    }

    /// Elements.
    pub fn len(&self) -> usize {
        match &self.host {
            HostMemory::Pinned(h) => h.len(),
            HostMemory::Plain(v, _) => v.len(),
        }
    }

    /// Whether it is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Queues a copy of `src` into the start of the buffer on `stream` and records the buffer's
    /// event after it. The device memory must stay untouched until the copy is done.
    pub fn copy_from(&mut self, src: DevSlice<'_, T>, stream: &Stream) -> Result<(), BackendError> {
        self.copy_from_at(src, 0, stream)
    }

    /// [`PinnedBuffer::copy_from`] into elements `at..at + src.len()`.
    pub fn copy_from_at(
        &mut self,
        src: DevSlice<'_, T>,
        at: usize,
        stream: &Stream,
    ) -> Result<(), BackendError> {
        // One run of the strided copy.
        self.queue_runs(src, (1, src.len(), src.len()), at, stream)?;
        self.record(stream)
    }

    /// Queues one strided copy on `stream`, without recording the event: `rows` runs of `width`
    /// elements from `src`, run r starting `r * pitch` elements in, packed one after another at
    /// the start of the buffer (the step's rows of every plane of the routing buffer in one
    /// call, not one per plane).
    pub fn queue_copy_rows_from(
        &mut self,
        src: DevSlice<'_, T>,
        runs: (usize, usize, usize),
        stream: &Stream,
    ) -> Result<(), BackendError> {
        self.queue_runs(src, runs, 0, stream)
    }

    /// [`PinnedBuffer::queue_copy_rows_from`], packed from element `at` of the buffer.
    fn queue_runs(
        &mut self,
        src: DevSlice<'_, T>,
        (rows, width, pitch): (usize, usize, usize),
        at: usize,
        stream: &Stream,
    ) -> Result<(), BackendError> {
        let end = rows.checked_mul(width).and_then(|n| n.checked_add(at));
        let reach =
            rows.checked_sub(1).map_or(Some(0), |r| r.checked_mul(pitch)?.checked_add(width));
        let (Some(end), Some(reach)) = (end, reach) else {
            return Err(BackendError::Memory(format!("{rows} rows of {width} overflow")));
        };
        if width > pitch || reach > src.len() || end > self.len() {
            return Err(BackendError::Memory(format!(
                "{rows} rows of {width} elements, {pitch} apart, from {} into elements {at}.. of \
                 a pinned buffer of {}",
                src.len(),
                self.len()
            )));
        }
        let total = end - at;
        if total == 0 {
            return Ok(());
        }
        let elem = size_of::<T>();
        match (&mut self.host, stream.cuda()) {
            (HostMemory::Pinned(host), Some(stream)) => {
                let base = host.as_mut_ptr().map_err(driver_err)?;
                stream.context().bind_to_thread().map_err(driver_err)?;
                // SAFETY: `at + total` elements lie inside the buffer (checked above).
                let dst = unsafe { base.add(at) }.cast();
                let copy = device_to_host_2d(src.addr(), pitch * elem, dst, width * elem, rows);
                // SAFETY: the source runs lie inside `src` (checked above), the destination's
                // `total` elements inside the page-locked buffer, alive with `self`; the copy is
                // ordered on `stream`.
                unsafe { cuMemcpy2DAsync_v2(&copy, stream.cu_stream()) }
                    .result()
                    .map_err(driver_err)
            }
            (HostMemory::Plain(host, _), None) => {
                let Some(sim) = stream.simulated() else { return Err(mixed()) };
                let to = SendPtr(host[at..end].as_mut_ptr());
                let from = SendPtr(src.addr() as *mut T);
                sim.push(Box::new(move || {
                    for r in 0..rows {
                        // SAFETY: run r of the source lies inside a simulated arena's host memory
                        // and the destination inside the buffer (both checked when queued); the
                        // buffer and the arena finish their device's queues before they are
                        // freed.
                        unsafe {
                            std::ptr::copy_nonoverlapping(
                                from.get().add(r * pitch),
                                to.get().add(r * width),
                                width,
                            )
                        };
                    }
                    Ok(())
                }));
                Ok(())
            }
            _ => Err(mixed()),
        }
    }

    /// Queues a copy of the first `dst.len()` elements of the buffer into `dst` on `stream` and
    /// records the buffer's event after it: the host must not write the buffer again before the
    /// copy has read it ([`PinnedBuffer::host_mut`] waits for that).
    pub fn copy_to(&mut self, dst: DevSlice<'_, T>, stream: &Stream) -> Result<(), BackendError> {
        self.copy_to_at(dst, 0, stream)
    }

    /// [`PinnedBuffer::copy_to`] from elements `at..at + dst.len()`.
    pub fn copy_to_at(
        &mut self,
        dst: DevSlice<'_, T>,
        at: usize,
        stream: &Stream,
    ) -> Result<(), BackendError> {
        let range =
            at..at.checked_add(dst.len()).filter(|&end| end <= self.len()).ok_or_else(|| {
                BackendError::Memory(format!(
                    "elements {at}..+{} do not come from a pinned buffer of {}",
                    dst.len(),
                    self.len()
                ))
            })?;
        if range.is_empty() {
            return self.record(stream);
        }
        match (&self.host, stream.cuda()) {
            (HostMemory::Pinned(host), Some(stream)) => {
                let base = host.as_ptr().map_err(driver_err)?;
                stream.context().bind_to_thread().map_err(driver_err)?;
                // SAFETY: elements `range` of the page-locked buffer (checked above), alive with
                // `self`.
                let src = unsafe { std::slice::from_raw_parts(base.add(at), dst.len()) };
                // SAFETY: `dst` is a device range of that many elements; the copy is ordered on
                // `stream`.
                unsafe { result::memcpy_htod_async(dst.addr(), src, stream.cu_stream()) }
                    .map_err(driver_err)?;
            }
            (HostMemory::Plain(host, _), None) => {
                let Some(sim) = stream.simulated() else { return Err(mixed()) };
                let from = SendPtr(host[range].as_ptr().cast_mut());
                let (to, len) = (SendPtr(dst.addr() as *mut T), dst.len());
                // SAFETY: `dst` is a range of `len` elements of a simulated arena's host memory,
                // disjoint from the buffer's elements `range`; both finish their device's queues
                // before they are freed.
                sim.push(Box::new(move || {
                    unsafe { std::ptr::copy_nonoverlapping(from.get(), to.get(), len) };
                    Ok(())
                }));
            }
            _ => return Err(mixed()),
        }
        self.record(stream)
    }

    /// Records the buffer's event on `stream`, after the copies queued there.
    pub fn record(&self, stream: &Stream) -> Result<(), BackendError> {
        self.copied.record(stream)
    }

    /// The buffer's event: another stream can wait on it (the compute stream waits for a routing
    /// copy before the buffer it reads is written again).
    pub fn event(&self) -> &Event {
        &self.copied
    }

    /// Blocks until the last copy has landed, then reads the buffer.
    pub fn wait(&self) -> Result<&[T], BackendError> {
        self.copied.synchronize()?;
        match &self.host {
            HostMemory::Pinned(h) => h.as_slice().map_err(driver_err),
            HostMemory::Plain(v, _) => Ok(v),
        }
    }

    /// Blocks until the last copy has read or written the buffer, then gives it for writing.
    pub fn host_mut(&mut self) -> Result<&mut [T], BackendError> {
        self.copied.synchronize()?;
        match &mut self.host {
            HostMemory::Pinned(h) => h.as_mut_slice().map_err(driver_err),
            HostMemory::Plain(v, _) => Ok(v),
        }
    }
}

fn mixed() -> BackendError {
    BackendError::Memory("a simulated buffer copied on a device's stream, or the reverse".into())
}

/// The rotary table `[max_positions, rot_dim / 2, (cos, sin)]` the q/k/v heads kernel reads, with
/// the CPU's formula: frequency `1 / theta^(2i / rot_dim)`, angle `position * frequency` in f32.
pub fn rope_table(theta: f32, rot_dim: usize, max_positions: usize) -> Vec<f32> {
    let half = rot_dim / 2;
    let inv_freq: Vec<f32> =
        (0..half).map(|i| 1.0 / theta.powf((2 * i) as f32 / rot_dim as f32)).collect();
    let mut table = Vec::with_capacity(max_positions * half * 2);
    for pos in 0..max_positions {
        for &f in &inv_freq {
            let (sin, cos) = (pos as f32 * f).sin_cos();
            table.extend([cos, sin]);
        }
    }
    table
}

/// One row's sampling parameters, laid out as the kernel's `SampleParams`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct SampleParams {
    /// The request's seed.
    pub seed: u64,
    /// The token's index in the request's output: selects the random number.
    pub index: u64,
    /// Temperature, greater than 0 (greedy rows use the argmax kernel).
    pub temperature: f32,
    /// Nucleus mass in (0, 1]; 1 keeps every candidate.
    pub top_p: f32,
    /// Candidates kept by rank; 0 keeps all.
    pub top_k: u32,
    /// Candidates kept by probability relative to the most likely's, in [0, 1]; 0 keeps all.
    pub min_p: f32,
}

// SAFETY: `repr(C)` of two u64 then four 4-byte fields: 32 bytes, no padding, any bits valid.
unsafe impl DeviceElem for SampleParams {}

/// The driver's descriptor of a strided device-to-host copy: `rows` runs of `width_bytes` from
/// `src`, `pitch_bytes` apart, packed one after another at `dst`.
///
/// Every field is spelled out: the memory-type fields are Rust enums without a zero variant, so a
/// zeroed descriptor is undefined behaviour (`mem::zeroed` panics on it at run time).
fn device_to_host_2d(
    src: CUdeviceptr,
    pitch_bytes: usize,
    dst: *mut std::ffi::c_void,
    width_bytes: usize,
    rows: usize,
) -> CUDA_MEMCPY2D {
    CUDA_MEMCPY2D {
        srcXInBytes: 0,
        srcY: 0,
        srcMemoryType: CUmemorytype::CU_MEMORYTYPE_DEVICE,
        srcHost: std::ptr::null(),
        srcDevice: src,
        srcArray: std::ptr::null_mut(),
        srcPitch: pitch_bytes,
        dstXInBytes: 0,
        dstY: 0,
        dstMemoryType: CUmemorytype::CU_MEMORYTYPE_HOST,
        dstHost: dst,
        dstDevice: 0,
        dstArray: std::ptr::null_mut(),
        dstPitch: width_bytes,
        WidthInBytes: width_bytes,
        Height: rows,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sample_params_have_the_device_layout() {
        assert_eq!(size_of::<SampleParams>(), 32);
        assert_eq!(std::mem::offset_of!(SampleParams, temperature), 16);
        assert_eq!(std::mem::offset_of!(SampleParams, top_k), 24);
    }

    /// The descriptor of the routing rows' copy is built only on a GPU (the simulator copies
    /// through its own queue), so it is checked here.
    #[test]
    fn the_strided_copy_descriptor_names_every_field() {
        let mut host = [0u8; 64];
        let c = device_to_host_2d(0x1000, 48, host.as_mut_ptr().cast(), 16, 4);
        assert_eq!((c.srcDevice, c.srcPitch, c.srcXInBytes, c.srcY), (0x1000, 48, 0, 0));
        assert_eq!((c.dstPitch, c.WidthInBytes, c.Height), (16, 16, 4));
        assert_eq!(c.dstHost, host.as_mut_ptr().cast());
        assert_eq!(c.srcMemoryType, CUmemorytype::CU_MEMORYTYPE_DEVICE);
        assert_eq!(c.dstMemoryType, CUmemorytype::CU_MEMORYTYPE_HOST);
        assert!(c.srcHost.is_null() && c.srcArray.is_null() && c.dstArray.is_null());
    }

    #[test]
    fn rope_table_is_the_cpu_angles() {
        let t = rope_table(10_000.0, 8, 3);
        assert_eq!(t.len(), 3 * 4 * 2);
        assert_eq!(&t[..8], &[1.0, 0.0, 1.0, 0.0, 1.0, 0.0, 1.0, 0.0]);
        let f1 = 1.0 / 10_000f32.powf(2.0 / 8.0);
        let (s, c) = (2.0 * f1).sin_cos();
        assert_eq!((t[2 * 8 + 2], t[2 * 8 + 3]), (c, s));
    }
}
