//! Byte encodings of a request's [`RoutingRows`]: a `.npy` v1.0 file and a flat little-endian
//! int32 array. Both are row-major `[rows, L, K]`; transport wrappers (base64, JSON) live with the
//! server.

use routed_types::{ExpertId, RoutingRows};

use crate::error::RoutingError;
use crate::width::{IdWidth, MAX_ENCODE_EXPERTS};

/// The `.npy` magic string followed by format version 1.0.
const NPY_MAGIC_V1: &[u8; 8] = b"\x93NUMPY\x01\x00";

/// Magic, version and the little-endian u16 header length.
const NPY_PREAMBLE_LEN: usize = NPY_MAGIC_V1.len() + 2;

/// The data of a `.npy` file starts at a multiple of this many bytes.
const NPY_ALIGN: usize = 64;

/// Checks that `rows.ids` has as many ids as its shape says and returns that shape.
fn checked_shape(rows: &RoutingRows) -> Result<[usize; 3], RoutingError> {
    let shape = rows.shape();
    let len = shape.iter().try_fold(1usize, |acc, &d| acc.checked_mul(d));
    if len != Some(rows.ids.len()) {
        return Err(RoutingError::RowsShape { shape, len: rows.ids.len() });
    }
    Ok(shape)
}

/// The `.npy` v1.0 header for an array of `shape` at `width`: magic, version, header length, the
/// dict and space padding ending in a newline, so the data starts at a multiple of 64 bytes.
pub fn npy_header(width: IdWidth, shape: [usize; 3]) -> Vec<u8> {
    let dict = format!(
        "{{'descr': '{}', 'fortran_order': False, 'shape': ({}, {}, {}), }}",
        width.npy_descr(),
        shape[0],
        shape[1],
        shape[2]
    );
    let total = (NPY_PREAMBLE_LEN + dict.len() + 1).next_multiple_of(NPY_ALIGN);
    let header_len = total - NPY_PREAMBLE_LEN;
    // Shapes need at most three 20-digit numbers, so the header stays far below u16::MAX.
    let header_len = u16::try_from(header_len).expect("npy header length fits u16");
    let mut out = Vec::with_capacity(total);
    out.extend_from_slice(NPY_MAGIC_V1);
    out.extend_from_slice(&header_len.to_le_bytes());
    out.extend_from_slice(dict.as_bytes());
    out.resize(total - 1, b' ');
    out.push(b'\n');
    out
}

/// Encodes `rows` as a `.npy` v1.0 file: dtype `|u1` when `num_experts <= 256`, else `<u2`,
/// shape `[rows, L, K]`, C order. Fails when the ids disagree with the shape, or an id is not
/// below `num_experts` (at most 65536).
pub fn encode_npy(rows: &RoutingRows, num_experts: u32) -> Result<Vec<u8>, RoutingError> {
    let shape = checked_shape(rows)?;
    let limit = num_experts.min(MAX_ENCODE_EXPERTS);
    if let Some(index) = rows.ids.iter().position(|&id| u32::from(id) >= limit) {
        return Err(RoutingError::IdOutOfRange { index, id: rows.ids[index], num_experts });
    }
    let width = IdWidth::for_num_experts(num_experts);
    let mut out = npy_header(width, shape);
    out.reserve_exact(rows.ids.len() * width.bytes());
    match width {
        // Checked above: every id is below 256 here.
        IdWidth::U8 => out.extend(rows.ids.iter().map(|&id| id as u8)),
        IdWidth::U16 => out.extend(rows.ids.iter().flat_map(|&id| id.to_le_bytes())),
    }
    Ok(out)
}

/// Encodes `rows` as the flat little-endian int32 array, row-major `[rows, L, K]`, with no header.
/// Fails only when the ids disagree with the shape.
pub fn encode_raw_i32(rows: &RoutingRows) -> Result<Vec<u8>, RoutingError> {
    checked_shape(rows)?;
    let mut out = Vec::with_capacity(rows.ids.len() * 4);
    out.extend(rows.ids.iter().flat_map(|&id: &ExpertId| i32::from(id).to_le_bytes()));
    Ok(out)
}
