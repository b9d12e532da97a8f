//! Where a hybrid request's prefill takes Mamba snapshots.

use std::ops::Range;

/// Block boundaries at which the runner must snapshot a request's Mamba state while computing
/// `chunk` (positions `chunk.start..chunk.end`) of a prefill covering `0..prefill_len`, in
/// increasing order. With `B = block_size` the candidates are:
///
/// - the last complete block of the prefill, `floor(prefill_len / B) * B`: where the next turn of
///   a conversation, or a longer request sharing the whole prompt, resumes;
/// - the replay boundary `floor((prefill_len - 1) / B) * B`: an exact repeat must compute at
///   least one token, so a block-aligned prompt is resumed one block early;
/// - the divergence point: where the request's cached KV prefix ended, when it went further than
///   its usable hit (a sibling sharing exactly that prefix can resume there next time);
/// - the chunk end, when it falls on a block boundary (the live state after the forward).
///
/// A candidate is kept if it is a positive multiple of `B` with `chunk.start < p <= chunk.end`
/// and `p <= prefill_len`. A position inside the chunk (not its end) must also be a whole number
/// of blocks from the chunk start, since the scan materialises the state only at chunk-size
/// steps from where it started and `B` is a multiple of that size; a chunk that starts off a block
/// boundary therefore yields only its end.
pub fn snapshot_positions(
    block_size: usize,
    prefill_len: usize,
    divergence: Option<usize>,
    chunk: Range<usize>,
) -> Vec<usize> {
    if prefill_len == 0 || chunk.is_empty() {
        return Vec::new();
    }
    let last_complete = prefill_len / block_size * block_size;
    let replay = (prefill_len - 1) / block_size * block_size;
    let candidates = [Some(last_complete), Some(replay), divergence, Some(chunk.end)];
    let start_aligned = chunk.start.is_multiple_of(block_size);
    let mut positions: Vec<usize> = candidates
        .into_iter()
        .flatten()
        .filter(|&p| p > 0 && p.is_multiple_of(block_size))
        .filter(|&p| chunk.start < p && p <= chunk.end && p <= prefill_len)
        .filter(|&p| p == chunk.end || start_aligned)
        .collect();
    positions.sort_unstable();
    positions.dedup();
    positions
}
