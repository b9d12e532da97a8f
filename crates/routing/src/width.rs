//! How many bytes one stored expert id takes, and the element types behind each width.

use routed_types::ExpertId;

/// Largest expert count the store accepts: the device capture buffer is `int16`, so ids must be
/// non-negative `i16` values.
pub const MAX_STORE_EXPERTS: u32 = 1 << 15;

/// Largest expert count the byte encodings accept: every id must fit a `u16`.
pub const MAX_ENCODE_EXPERTS: u32 = 1 << 16;

/// Width of one stored or encoded expert id. One width per model: `U8` when every id fits a byte
/// (`num_experts <= 256`), `U16` otherwise.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum IdWidth {
    /// One byte per id (`|u1` in `.npy`).
    U8,
    /// Two little-endian bytes per id (`<u2` in `.npy`).
    U16,
}

impl IdWidth {
    /// The narrowest width that holds every id of a model with `num_experts` experts.
    pub fn for_num_experts(num_experts: u32) -> Self {
        if num_experts <= 256 { Self::U8 } else { Self::U16 }
    }

    /// Bytes per id.
    pub fn bytes(self) -> usize {
        match self {
            Self::U8 => 1,
            Self::U16 => 2,
        }
    }

    /// The numpy dtype string (`descr`) of this width.
    pub fn npy_descr(self) -> &'static str {
        match self {
            Self::U8 => "|u1",
            Self::U16 => "<u2",
        }
    }

    /// The dtype name reported in routing metadata (`uint8` / `uint16`).
    pub fn dtype_name(self) -> &'static str {
        match self {
            Self::U8 => "uint8",
            Self::U16 => "uint16",
        }
    }
}

/// An element type the store keeps ids in. Conversions are lossless for ids the store accepted,
/// which it checks against `num_experts` before narrowing.
pub(crate) trait StoredId: Copy + Default + Send + Sync + 'static {
    /// Narrows an id already checked to fit.
    fn narrow(id: i16) -> Self;
    /// Widens back to the public id type.
    fn widen(self) -> ExpertId;
}

impl StoredId for u8 {
    #[inline]
    fn narrow(id: i16) -> Self {
        id as u8
    }

    #[inline]
    fn widen(self) -> ExpertId {
        ExpertId::from(self)
    }
}

impl StoredId for u16 {
    #[inline]
    fn narrow(id: i16) -> Self {
        id as u16
    }

    #[inline]
    fn widen(self) -> ExpertId {
        self
    }
}
