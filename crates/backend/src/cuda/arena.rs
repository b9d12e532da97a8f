//! Device memory in arenas: each pool is one allocation made at start-up, carved into typed spans
//! by a layout computed on the host, so no step allocates and every buffer keeps a fixed device
//! address (what CUDA graphs and the routing buffer need).
//!
//! The arithmetic ([`ArenaLayout`], [`Span`]) is plain host code; [`DeviceArena`] is the
//! allocation, and [`DevSlice`] a span resolved to a device address for a kernel launch.

use super::{CudaDevice, stream::SimStream};
use crate::BackendError;
use cudarc::driver::{CudaSlice, CudaStream, DevicePtr};
use std::{
    marker::PhantomData,
    sync::{
        Arc,
        atomic::{AtomicU32, Ordering},
    },
};

/// Every span starts at a multiple of this many bytes: enough for any vector load and for the
/// 256-byte alignment `cuMemAlloc` itself guarantees.
pub const SPAN_ALIGN: usize = 256;

/// Element types that may live in a pool and cross to the host as bytes.
///
/// # Safety
/// The type is plain data: no padding, no pointers, and every bit pattern is a valid value.
pub unsafe trait DeviceElem: Copy + Default + Send + Sync + 'static {}

// SAFETY: primitive numbers; bf16 is a u16 underneath.
unsafe impl DeviceElem for f32 {}
// SAFETY: as above.
unsafe impl DeviceElem for i32 {}
// SAFETY: as above.
unsafe impl DeviceElem for u32 {}
// SAFETY: as above.
unsafe impl DeviceElem for i16 {}
// SAFETY: as above.
unsafe impl DeviceElem for u16 {}
// SAFETY: as above.
unsafe impl DeviceElem for u8 {}
// SAFETY: as above.
unsafe impl DeviceElem for u64 {}
// SAFETY: as above.
unsafe impl DeviceElem for half::bf16 {}

/// Which layout a span belongs to, so a span is never resolved against another arena.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ArenaId(u32);

impl ArenaId {
    fn fresh() -> Self {
        static NEXT: AtomicU32 = AtomicU32::new(0);
        Self(NEXT.fetch_add(1, Ordering::Relaxed))
    }
}

/// `len` elements of `T` at a byte offset of one arena.
#[derive(Debug)]
pub struct Span<T> {
    arena: ArenaId,
    offset: usize,
    len: usize,
    _elem: PhantomData<fn() -> T>,
}

impl<T> Clone for Span<T> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<T> Copy for Span<T> {}

impl<T> PartialEq for Span<T> {
    fn eq(&self, other: &Self) -> bool {
        (self.arena, self.offset, self.len) == (other.arena, other.offset, other.len)
    }
}

impl<T: DeviceElem> Span<T> {
    /// Elements in the span.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the span is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Byte offset from the start of the arena.
    pub fn offset(&self) -> usize {
        self.offset
    }

    /// Bytes covered.
    pub fn num_bytes(&self) -> usize {
        self.len * size_of::<T>()
    }

    /// Elements `start..start + len` of this span, or `None` past its end.
    pub fn sub(&self, start: usize, len: usize) -> Option<Self> {
        let end = start.checked_add(len)?;
        (end <= self.len).then(|| Self {
            offset: self.offset + start * size_of::<T>(),
            len,
            ..*self
        })
    }

    /// The span split into `count` equal consecutive parts (per-layer planes of one buffer).
    pub fn split(&self, count: usize) -> Option<Vec<Self>> {
        if count == 0 || !self.len.is_multiple_of(count) {
            return None;
        }
        let part = self.len / count;
        (0..count).map(|i| self.sub(i * part, part)).collect()
    }
}

/// The plan of one arena: spans pushed one after another, each aligned to [`SPAN_ALIGN`].
#[derive(Debug)]
pub struct ArenaLayout {
    id: ArenaId,
    name: &'static str,
    num_bytes: usize,
}

impl ArenaLayout {
    /// An empty layout; `name` labels errors.
    pub fn new(name: &'static str) -> Self {
        Self { id: ArenaId::fresh(), name, num_bytes: 0 }
    }

    /// Reserves `len` elements of `T`.
    pub fn push<T: DeviceElem>(&mut self, len: usize) -> Span<T> {
        let offset = self.num_bytes.next_multiple_of(SPAN_ALIGN);
        let bytes = len.checked_mul(size_of::<T>()).expect("a span's size overflows usize");
        self.num_bytes = offset.checked_add(bytes).expect("an arena's size overflows usize");
        Span { arena: self.id, offset, len, _elem: PhantomData }
    }

    /// Bytes the arena needs.
    pub fn num_bytes(&self) -> usize {
        self.num_bytes
    }

    /// Which arena its spans belong to.
    pub fn id(&self) -> ArenaId {
        self.id
    }

    /// The label given at creation.
    pub fn name(&self) -> &'static str {
        self.name
    }
}

/// A span resolved to its device address, valid while the arena is borrowed. Kernel launch
/// wrappers take these.
#[derive(Debug)]
pub struct DevSlice<'a, T> {
    addr: u64,
    len: usize,
    _arena: PhantomData<&'a T>,
}

impl<T> Clone for DevSlice<'_, T> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<T> Copy for DevSlice<'_, T> {}

impl<'a, T> DevSlice<'a, T> {
    /// The device address of the first element.
    pub fn addr(&self) -> u64 {
        self.addr
    }

    /// Elements.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether it is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Elements `start..start + len`, or `None` past the end.
    pub fn sub(&self, start: usize, len: usize) -> Option<DevSlice<'a, T>> {
        let end = start.checked_add(len)?;
        (end <= self.len).then(|| DevSlice {
            addr: self.addr + (start * size_of::<T>()) as u64,
            len,
            _arena: PhantomData,
        })
    }

    /// The same bytes as elements of `U` (a section of the packed step inputs read as `i32`s or
    /// sampling parameters), or `None` when the address is not aligned for `U` or the bytes are
    /// not whole elements of it.
    pub fn cast<U: DeviceElem>(&self) -> Option<DevSlice<'a, U>> {
        let bytes = self.len * size_of::<T>();
        let aligned = self.addr.is_multiple_of(align_of::<U>() as u64);
        (aligned && bytes.is_multiple_of(size_of::<U>())).then(|| DevSlice {
            addr: self.addr,
            len: bytes / size_of::<U>(),
            _arena: PhantomData,
        })
    }
}

/// One pool's device allocation, made once, zeroed. It can be given back to the device and
/// allocated again ([`DeviceArena::release`], [`DeviceArena::restore`]) with its layout kept.
#[derive(Debug)]
pub struct DeviceArena {
    id: ArenaId,
    name: &'static str,
    /// `None` while released.
    memory: Option<Memory>,
    base: u64,
    num_bytes: usize,
}

#[derive(Debug)]
enum Memory {
    /// Device memory, allocated and copied on the compute stream.
    Driver { buf: CudaSlice<u8>, stream: Arc<CudaStream> },
    /// The simulator's device memory: host memory, and the compute stream its uploads and
    /// downloads are ordered with.
    Host(HostBlock, SimStream),
}

impl Drop for DeviceArena {
    fn drop(&mut self) {
        // Queued simulated launches and copies address this memory: they run before it is freed
        // (the driver orders a free on the stream itself). A fault here has nobody to go to.
        if let Some(Memory::Host(_, sim)) = &self.memory {
            let _ = sim.finish_device();
        }
    }
}

impl DeviceArena {
    /// Allocates the arena of `layout` on `dev` (its allocations and frees are ordered on the
    /// compute stream).
    pub fn new(dev: &CudaDevice, layout: &ArenaLayout) -> Result<Self, BackendError> {
        let bytes = layout.num_bytes().max(1);
        let (memory, base) = allocate(dev, bytes, layout.name)?;
        Ok(Self { id: layout.id, name: layout.name, memory: Some(memory), base, num_bytes: bytes })
    }

    /// Gives the arena's memory back to the device, keeping its layout; until
    /// [`DeviceArena::restore`] every access to it is an error. Returns the bytes freed (0 when
    /// already released).
    pub fn release(&mut self) -> Result<usize, BackendError> {
        let Some(memory) = self.memory.take() else { return Ok(0) };
        // Queued simulated work addresses this memory (the driver orders its own free on the
        // stream).
        if let Memory::Host(_, sim) = &memory {
            sim.finish_device()?;
        }
        drop(memory);
        Ok(self.num_bytes)
    }

    /// Allocates a released arena's memory again on `dev`, zeroed. Its spans stay valid, but its
    /// address may differ: whatever holds addresses into it (a captured graph) must be rebuilt.
    pub fn restore(&mut self, dev: &CudaDevice) -> Result<(), BackendError> {
        if self.memory.is_none() {
            let (memory, base) = allocate(dev, self.num_bytes, self.name)?;
            (self.memory, self.base) = (Some(memory), base);
        }
        Ok(())
    }

    /// Whether the memory is released.
    pub fn is_released(&self) -> bool {
        self.memory.is_none()
    }

    /// Bytes allocated.
    pub fn num_bytes(&self) -> usize {
        self.num_bytes
    }

    /// An empty layout whose spans belong to this arena: pushing the same sizes in the same order
    /// as the layout it was allocated from gives the same spans, so new values of the same tensors
    /// (a weight update) can be written in place, at the addresses launches and graphs hold.
    pub fn relayout(&self) -> ArenaLayout {
        ArenaLayout { id: self.id, name: self.name, num_bytes: 0 }
    }

    fn check<T: DeviceElem>(&self, span: &Span<T>) -> Result<(), BackendError> {
        if self.memory.is_none() {
            return Err(released(self.name));
        }
        if span.arena != self.id || span.offset + span.num_bytes() > self.num_bytes {
            return Err(BackendError::Memory(format!(
                "a span of {} bytes at {} does not belong to arena {}",
                span.num_bytes(),
                span.offset,
                self.name
            )));
        }
        Ok(())
    }

    /// The span's device address for a launch.
    pub fn get<T: DeviceElem>(&self, span: Span<T>) -> Result<DevSlice<'_, T>, BackendError> {
        self.check(&span)?;
        Ok(DevSlice { addr: self.base + span.offset as u64, len: span.len, _arena: PhantomData })
    }

    /// Copies `data` into the start of `span` (synchronously: the host slice is pageable).
    pub fn upload<T: DeviceElem>(&mut self, span: Span<T>, data: &[T]) -> Result<(), BackendError> {
        self.check(&span)?;
        if data.len() > span.len {
            return Err(BackendError::Memory(format!(
                "{} elements do not fit a span of {} in {}",
                data.len(),
                span.len,
                self.name
            )));
        }
        if data.is_empty() {
            return Ok(());
        }
        let range = span.offset..span.offset + std::mem::size_of_val(data);
        let name = self.name;
        match self.memory.as_mut().ok_or_else(|| released(name))? {
            Memory::Driver { buf, stream } => stream
                .memcpy_htod(as_bytes(data), &mut buf.slice_mut(range))
                .map_err(|e| BackendError::Memory(format!("upload to {name}: {e}"))),
            Memory::Host(block, sim) => {
                // In stream order: after the launches queued so far.
                sim.synchronize()?;
                block.bytes_mut()[range].copy_from_slice(as_bytes(data));
                Ok(())
            }
        }
    }

    /// Copies the whole span to the host, after the work queued on the arena's stream.
    pub fn download<T: DeviceElem>(&self, span: Span<T>) -> Result<Vec<T>, BackendError> {
        self.check(&span)?;
        let mut out = vec![T::default(); span.len];
        let range = span.offset..span.offset + span.num_bytes();
        match self.memory.as_ref().ok_or_else(|| released(self.name))? {
            Memory::Driver { buf, stream } => stream
                .memcpy_dtoh(&buf.slice(range), as_bytes_mut(&mut out))
                .and_then(|()| stream.synchronize())
                .map_err(|e| BackendError::Memory(format!("download from {}: {e}", self.name)))?,
            Memory::Host(block, sim) => {
                sim.synchronize()?;
                as_bytes_mut(&mut out).copy_from_slice(&block.bytes()[range]);
            }
        }
        Ok(out)
    }
}

fn released(name: &str) -> BackendError {
    BackendError::Memory(format!("arena {name} is released"))
}

/// `bytes` of zeroed device memory for the arena `name` on `dev`, and its address.
fn allocate(dev: &CudaDevice, bytes: usize, name: &str) -> Result<(Memory, u64), BackendError> {
    let refused =
        |e: String| BackendError::Memory(format!("allocating {bytes} bytes for {name}: {e}"));
    let compute = dev.compute_stream();
    match (compute.cuda(), compute.simulated()) {
        (Some(stream), _) => {
            let buf = stream.alloc_zeros::<u8>(bytes).map_err(|e| refused(e.to_string()))?;
            let (base, _) = buf.device_ptr(stream);
            Ok((Memory::Driver { buf, stream: stream.clone() }, base))
        }
        (None, Some(sim)) => {
            let block = HostBlock::zeroed(bytes).ok_or_else(|| refused("out of memory".into()))?;
            let base = block.ptr.as_ptr() as u64;
            Ok((Memory::Host(block, sim.clone()), base))
        }
        (None, None) => Err(refused("the device has no compute stream".into())),
    }
}

/// Zeroed host memory standing for a simulated device's allocation, aligned like `cuMemAlloc`'s.
struct HostBlock {
    ptr: std::ptr::NonNull<u8>,
    layout: std::alloc::Layout,
}

// SAFETY: plain bytes owned by the block, like device memory: kernels (the simulator's) and
// copies reach them through addresses, ordered by the streams' rules.
unsafe impl Send for HostBlock {}
// SAFETY: as above.
unsafe impl Sync for HostBlock {}

impl HostBlock {
    fn zeroed(bytes: usize) -> Option<Self> {
        let layout = std::alloc::Layout::from_size_align(bytes, SPAN_ALIGN).ok()?;
        // SAFETY: `bytes` is at least 1 (the arena asks for `max(1)`).
        let ptr = std::ptr::NonNull::new(unsafe { std::alloc::alloc_zeroed(layout) })?;
        Some(Self { ptr, layout })
    }

    fn bytes(&self) -> &[u8] {
        // SAFETY: `layout.size()` initialised (zeroed) bytes owned by the block.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.layout.size()) }
    }

    fn bytes_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in `bytes`, borrowed mutably.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.layout.size()) }
    }
}

impl Drop for HostBlock {
    fn drop(&mut self) {
        // SAFETY: allocated in `zeroed` with this layout.
        unsafe { std::alloc::dealloc(self.ptr.as_ptr(), self.layout) }
    }
}

impl std::fmt::Debug for HostBlock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "HostBlock({} bytes)", self.layout.size())
    }
}

fn as_bytes<T: DeviceElem>(data: &[T]) -> &[u8] {
    // SAFETY: `DeviceElem` types are plain data without padding; u8 has no alignment needs.
    unsafe { std::slice::from_raw_parts(data.as_ptr().cast(), std::mem::size_of_val(data)) }
}

fn as_bytes_mut<T: DeviceElem>(data: &mut [T]) -> &mut [u8] {
    // SAFETY: as in `as_bytes`; every bit pattern is a valid `T`, so any bytes written are fine.
    unsafe { std::slice::from_raw_parts_mut(data.as_mut_ptr().cast(), std::mem::size_of_val(data)) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spans_are_aligned_packed_and_sized() {
        let mut layout = ArenaLayout::new("test");
        let a = layout.push::<f32>(3);
        let b = layout.push::<u16>(1000);
        let c = layout.push::<i32>(0);
        let d = layout.push::<u64>(2);
        assert_eq!((a.offset(), a.num_bytes()), (0, 12));
        assert_eq!((b.offset(), b.num_bytes()), (256, 2000));
        assert_eq!(c.offset(), 2304);
        assert_eq!(d.offset(), 2304);
        assert_eq!(layout.num_bytes(), 2304 + 16);
        for off in [a.offset(), b.offset(), c.offset(), d.offset()] {
            assert_eq!(off % SPAN_ALIGN, 0);
        }
    }

    #[test]
    fn sub_spans_stay_inside_and_split_evenly() {
        let mut layout = ArenaLayout::new("test");
        layout.push::<u8>(1);
        let s = layout.push::<f32>(12);
        let part = s.sub(4, 8).unwrap();
        assert_eq!((part.offset(), part.len()), (256 + 16, 8));
        assert!(s.sub(5, 8).is_none());
        assert!(s.sub(usize::MAX, 2).is_none());
        let planes = s.split(3).unwrap();
        assert_eq!(planes.iter().map(|p| p.offset()).collect::<Vec<_>>(), [256, 272, 288]);
        assert!(s.split(5).is_none() && s.split(0).is_none());
    }

    #[test]
    fn casts_keep_the_bytes_and_refuse_misalignment() {
        let words = DevSlice::<u32> { addr: 256, len: 16, _arena: PhantomData };
        let wide = words.cast::<u64>().unwrap();
        assert_eq!((wide.addr(), wide.len()), (256, 8));
        assert!(words.sub(1, 4).unwrap().cast::<u64>().is_none(), "4-byte aligned only");
        assert!(words.sub(0, 3).unwrap().cast::<u64>().is_none(), "not whole u64s");
        assert_eq!(words.cast::<i32>().unwrap().len(), 16);
    }

    #[test]
    fn spans_of_different_layouts_never_compare_equal() {
        let (mut x, mut y) = (ArenaLayout::new("x"), ArenaLayout::new("y"));
        assert_ne!(x.id(), y.id());
        assert_ne!(x.push::<f32>(4), y.push::<f32>(4));
    }

    #[test]
    fn a_released_arena_refuses_access_and_comes_back_zeroed_with_its_spans() {
        let dev = CudaDevice::simulated().expect("the simulator opens");
        let mut layout = ArenaLayout::new("release");
        let (a, b) = (layout.push::<f32>(4), layout.push::<u32>(3));
        let mut arena = DeviceArena::new(&dev, &layout).unwrap();
        arena.upload(a, &[1.0, 2.0, 3.0, 4.0]).unwrap();
        arena.upload(b, &[7, 8, 9]).unwrap();
        let bytes = arena.num_bytes();
        assert_eq!(arena.release().unwrap(), bytes);
        assert!(arena.is_released());
        assert_eq!(arena.release().unwrap(), 0, "twice frees nothing more");
        let refused = arena.get(a).map(drop).expect_err("a released arena has no addresses");
        assert!(refused.to_string().contains("arena release is released"), "{refused}");
        assert!(arena.upload(b, &[1]).is_err());
        assert!(arena.download(b).is_err());
        arena.restore(&dev).unwrap();
        assert!(!arena.is_released());
        assert_eq!(arena.num_bytes(), bytes);
        assert_eq!(arena.download(a).unwrap(), [0.0; 4], "restored zeroed");
        arena.upload(b, &[4, 5, 6]).unwrap();
        assert_eq!(arena.download(b).unwrap(), [4, 5, 6]);
    }
}
