//! Slot mapping: where in the paged KV cache each token position of a request lives.
//!
//! Position `p` of a request lives in block `block_table[p / block_size]`, at offset
//! `p % block_size`, so its slot (the row index into a layer's `[num_blocks * block_size, ...]`
//! KV tensor) is `block_table[p / block_size] * block_size + p % block_size`.

use std::ops::Range;

use routed_types::BlockId;

/// The KV slot of position `position` given a request's block table.
///
/// # Panics
/// If the block table does not cover `position`.
pub fn slot_for_position(block_table: &[BlockId], block_size: usize, position: usize) -> u64 {
    let block_id = block_table[position / block_size];
    (block_id.index() * block_size + position % block_size) as u64
}

/// Appends the slot of every position in `positions`, in order, to `slots`: the slot mapping of
/// one chunk of a request.
///
/// # Panics
/// If the block table does not cover `positions`.
pub fn extend_slot_mapping(
    block_table: &[BlockId],
    block_size: usize,
    positions: Range<usize>,
    slots: &mut Vec<u64>,
) {
    slots.extend(positions.map(|p| slot_for_position(block_table, block_size, p)));
}
