//! Worked examples of the store's protocol: one behaviour per test, small enough to read.

use routed_routing::{
    IdWidth, LossReason, LostBlock, RoutingError, RoutingStore, RoutingStoreConfig, StepOutcome,
};
use routed_types::{BlockGeneration, BlockId, BlockRef, RoutingMeta};

/// A block and the generation a message names.
type Block = BlockRef;

const L: usize = 2;
const K: usize = 2;
const BS: usize = 4;

fn meta(num_experts: u32) -> RoutingMeta {
    RoutingMeta { num_layers: 4, moe_layer_ids: vec![1, 3], num_experts, top_k: K as u32 }
}

fn store(num_blocks: usize, cap_blocks: Option<usize>) -> RoutingStore {
    let mut config = RoutingStoreConfig::new(&meta(64), num_blocks, BS);
    if let Some(cap) = cap_blocks {
        config = config.with_max_bytes(cap * BS * L * K);
    }
    RoutingStore::new(config).expect("valid config")
}

fn blk(b: u32, g: u32) -> BlockRef {
    BlockRef::new(BlockId(b), BlockGeneration(g))
}

/// The row the tests write for position `p` under tag `tag`: distinct ids per layer.
fn row(tag: u16, p: usize) -> Vec<u16> {
    let base = (tag as usize * 7 + p * 3) % 60;
    (0..L * K).map(|i| (base + i) as u16).collect()
}

/// Stores rows for `positions` of a request whose block table is `table`, as one step.
fn store_positions(
    store: &mut RoutingStore,
    table: &[BlockRef],
    positions: std::ops::Range<usize>,
    tag: u16,
) -> StepOutcome {
    let n = positions.len();
    let mut ids = vec![0i16; L * n * K];
    let mut slots = Vec::with_capacity(n);
    for (t, p) in positions.clone().enumerate() {
        let r = row(tag, p);
        for l in 0..L {
            for k in 0..K {
                ids[(l * n + t) * K + k] = r[l * K + k] as i16;
            }
        }
        slots.push(table[p / BS].block.index() * BS + p % BS);
    }
    let mut listed: Vec<_> = positions.map(|p| table[p / BS]).collect();
    listed.dedup();
    store.store_step(&ids, &slots, &listed).expect("valid step")
}

fn expected_ids(tag: u16, positions: std::ops::Range<usize>) -> Vec<u16> {
    positions.flat_map(|p| row(tag, p)).collect()
}

#[test]
fn chunked_steps_reconstruct_with_start_and_partial_last_block() {
    let mut s = store(8, None);
    let table = [blk(5, 1), blk(2, 1), blk(7, 1)];
    store_positions(&mut s, &table, 0..6, 9);
    let outcome = store_positions(&mut s, &table, 6..10, 9);
    assert_eq!(outcome, StepOutcome { rows_written: 4, rows_dropped: 0, blocks_refused: 0 });
    let rows = s.reconstruct(&table, 10, 3).expect("complete");
    assert_eq!((rows.start, rows.num_rows, rows.shape()), (3, 7, [7, L, K]));
    assert_eq!(rows.ids, expected_ids(9, 3..10));
    let empty = s.reconstruct(&table, 10, 10).expect("empty range");
    assert_eq!(empty.num_rows, 0);
    assert!(empty.ids.is_empty());
}

#[test]
fn missing_row_is_an_error_naming_its_position() {
    let mut s = store(4, None);
    let table = [blk(0, 1), blk(1, 1)];
    store_positions(&mut s, &table, 0..5, 1);
    store_positions(&mut s, &table, 6..8, 1);
    let err = s.reconstruct(&table, 8, 0).unwrap_err();
    let expected = RoutingError::MissingRow {
        position: 5,
        block: BlockId(1),
        generation: BlockGeneration(1),
        offset: 1,
    };
    assert_eq!(err, expected);
    assert_eq!(err.position(), Some(5));
    assert!(s.reconstruct(&table, 5, 0).is_ok(), "rows before the gap are complete");
    let err = s.reconstruct(&[blk(0, 1)], 8, 0).unwrap_err();
    assert!(matches!(err, RoutingError::BlockTableTooShort { capacity: 4, num_rows: 8, .. }));
}

#[test]
fn late_write_for_a_reallocated_block_is_dropped() {
    let mut s = store(4, None);
    store_positions(&mut s, &[blk(3, 1)], 0..4, 1);
    // Block 3 changes owner: the new owner's rows replace the old ones.
    store_positions(&mut s, &[blk(3, 2)], 0..2, 2);
    // A late step for the previous owner arrives afterwards.
    let late = store_positions(&mut s, &[blk(3, 1)], 0..4, 1);
    assert_eq!(late, StepOutcome { rows_written: 0, rows_dropped: 4, blocks_refused: 0 });
    let rows = s.reconstruct(&[blk(3, 2)], 2, 0).expect("new owner's rows");
    assert_eq!(rows.ids, expected_ids(2, 0..2));
    let err = s.reconstruct(&[blk(3, 2)], 4, 0).unwrap_err();
    assert_eq!(err.position(), Some(2), "the old owner's rows never fill the gap");
    let err = s.reconstruct(&[blk(3, 1)], 4, 0).unwrap_err();
    assert!(matches!(err, RoutingError::StaleBlock { position: 0, .. }));
}

#[test]
fn late_write_after_free_is_dropped() {
    let mut s = store(4, None);
    store_positions(&mut s, &[blk(1, 4)], 0..2, 1);
    s.free_block(BlockId(1), BlockGeneration(4));
    assert_eq!(s.bytes_held(), 0);
    let late = store_positions(&mut s, &[blk(1, 4)], 2..4, 1);
    assert_eq!(late.rows_written, 0);
    assert_eq!(s.bytes_held(), 0);
    let err = s.reconstruct(&[blk(1, 4)], 4, 0).unwrap_err();
    assert!(matches!(err, RoutingError::StaleBlock { position: 0, .. }));
    // A free naming an older generation than the store holds is ignored.
    store_positions(&mut s, &[blk(1, 5)], 0..4, 5);
    s.free_blocks(&[blk(1, 4)]);
    assert_eq!(s.reconstruct(&[blk(1, 5)], 4, 0).expect("kept").ids, expected_ids(5, 0..4));
}

#[test]
fn cap_evicts_least_recently_released_cached_blocks_first() {
    let mut s = store(8, Some(3));
    for b in 0..3 {
        store_positions(&mut s, &[blk(b, 1)], 0..4, b as u16);
    }
    s.release(BlockId(1), BlockGeneration(1));
    s.release(BlockId(0), BlockGeneration(1));
    s.release(BlockId(1), BlockGeneration(1)); // touched again: now the most recent
    assert_eq!(s.num_cached_blocks(), 2);
    store_positions(&mut s, &[blk(5, 1)], 0..4, 5);
    let evicted = LostBlock {
        block: BlockId(0),
        generation: BlockGeneration(1),
        reason: LossReason::Evicted,
    };
    assert_eq!(s.take_lost(), vec![evicted]);
    assert!(s.take_lost().is_empty(), "the drain empties");
    let err = s.reconstruct(&[blk(0, 1)], 4, 0).unwrap_err();
    assert!(matches!(err, RoutingError::RowsLost { position: 0, reason: LossReason::Evicted, .. }));
    assert!(matches!(
        s.acquire(BlockId(0), BlockGeneration(1)),
        Err(RoutingError::AcquireLost { .. })
    ));
    // A prefix hit on block 1 makes it held again, so it is no longer a victim.
    s.acquire(BlockId(1), BlockGeneration(1)).expect("still stored");
    assert_eq!(s.num_cached_blocks(), 0);
    assert_eq!(s.bytes_held(), s.max_bytes());
    assert_eq!(s.reconstruct(&[blk(1, 1)], 4, 0).expect("kept").ids, expected_ids(1, 0..4));
}

#[test]
fn cap_refuses_writes_when_only_held_blocks_remain() {
    let mut s = store(8, Some(2));
    store_positions(&mut s, &[blk(0, 1)], 0..4, 0);
    store_positions(&mut s, &[blk(1, 1)], 0..2, 1);
    let outcome = store_positions(&mut s, &[blk(1, 1), blk(2, 1)], 2..6, 1);
    assert_eq!(outcome, StepOutcome { rows_written: 2, rows_dropped: 2, blocks_refused: 1 });
    let refused = LostBlock {
        block: BlockId(2),
        generation: BlockGeneration(1),
        reason: LossReason::Refused,
    };
    assert_eq!(s.take_lost(), vec![refused]);
    // Held rows are intact; the refused block is an explicit error, now and after later writes.
    assert_eq!(s.reconstruct(&[blk(0, 1)], 4, 0).expect("held").ids, expected_ids(0, 0..4));
    store_positions(&mut s, &[blk(1, 1), blk(2, 1)], 6..8, 1);
    let err = s.reconstruct(&[blk(1, 1), blk(2, 1)], 8, 0).unwrap_err();
    let expected = RoutingError::RowsLost {
        position: 4,
        block: BlockId(2),
        generation: BlockGeneration(1),
        reason: LossReason::Refused,
    };
    assert_eq!(err, expected);
    assert!(s.bytes_held() <= s.max_bytes());
}

#[test]
fn release_before_any_row_reports_never_written() {
    let mut s = store(4, None);
    s.release(BlockId(2), BlockGeneration(7));
    let lost = LostBlock {
        block: BlockId(2),
        generation: BlockGeneration(7),
        reason: LossReason::NeverWritten,
    };
    assert_eq!(s.take_lost(), vec![lost]);
    assert_eq!(store_positions(&mut s, &[blk(2, 7)], 0..4, 1).rows_written, 0);
    assert!(matches!(
        s.acquire(BlockId(2), BlockGeneration(7)),
        Err(RoutingError::AcquireLost { .. })
    ));
    assert!(matches!(
        s.acquire(BlockId(3), BlockGeneration(1)),
        Err(RoutingError::NotStored { .. })
    ));
}

#[test]
fn clear_cached_keeps_held_rows_and_reset_drops_all() {
    let mut s = store(4, None);
    store_positions(&mut s, &[blk(0, 1)], 0..4, 0);
    store_positions(&mut s, &[blk(1, 1)], 0..4, 1);
    s.release_blocks(&[blk(1, 1)]);
    assert_eq!(s.clear_cached(), vec![blk(1, 1)]);
    assert!(s.reconstruct(&[blk(1, 1)], 4, 0).is_err());
    assert!(s.reconstruct(&[blk(0, 1)], 4, 0).is_ok());
    assert_eq!(s.bytes_held(), s.block_bytes());
    s.reset();
    assert_eq!(s.bytes_held(), 0);
    assert!(s.reconstruct(&[blk(0, 1)], 4, 0).is_err());
    assert_eq!(store_positions(&mut s, &[blk(0, 1)], 0..4, 0).rows_written, 0, "late write");
    assert_eq!(store_positions(&mut s, &[blk(0, 2)], 0..4, 3).rows_written, 4, "new owner");
}

#[test]
fn malformed_steps_are_refused_before_any_write() {
    let mut s = store(2, None);
    let ids = vec![1i16; L * 2 * K];
    let cases: Vec<(Vec<i16>, Vec<usize>, Vec<Block>)> = vec![
        (ids[1..].to_vec(), vec![0, 1], vec![blk(0, 1)]),
        (ids.clone(), vec![0, 8], vec![blk(0, 1)]),
        (ids.clone(), vec![0, 5], vec![blk(0, 1)]),
        (ids.clone(), vec![0, 1], vec![blk(0, 1), blk(0, 2)]),
        (ids.clone(), vec![0, 1], vec![blk(0, 1), blk(9, 1)]),
        ([&ids[1..], &[-1]].concat(), vec![0, 1], vec![blk(0, 1)]),
        ([&ids[1..], &[64]].concat(), vec![0, 1], vec![blk(0, 1)]),
    ];
    let errors: Vec<RoutingError> =
        cases.iter().map(|(i, sl, b)| s.store_step(i, sl, b).unwrap_err()).collect();
    assert!(matches!(errors[0], RoutingError::StepShape { expected: 8, got: 7 }));
    assert!(matches!(errors[1], RoutingError::SlotOutOfRange { token: 1, slot: 8, num_slots: 8 }));
    assert!(matches!(errors[2], RoutingError::BlockNotListed { token: 1, block: BlockId(1) }));
    assert!(matches!(errors[3], RoutingError::ConflictingGeneration { block: BlockId(0), .. }));
    assert!(matches!(errors[4], RoutingError::BlockOutOfRange { block: BlockId(9), .. }));
    assert!(matches!(errors[5], RoutingError::ExpertOutOfRange { index: 7, value: -1, .. }));
    assert!(matches!(errors[6], RoutingError::ExpertOutOfRange { index: 7, value: 64, .. }));
    assert_eq!(s.bytes_held(), 0, "nothing was written");
    // The scratch marks were cleaned up: a valid step still works.
    assert_eq!(s.store_step(&ids, &[0, 1], &[blk(0, 1)]).expect("valid").rows_written, 2);
}

#[test]
fn more_than_256_experts_are_stored_two_bytes_wide() {
    let config = RoutingStoreConfig::new(&meta(300), 2, BS);
    let mut s = RoutingStore::new(config).expect("valid");
    assert_eq!(s.width(), IdWidth::U16);
    assert_eq!(s.block_bytes(), BS * L * K * 2);
    let ids: Vec<i16> = vec![299, 256, 0, 255, 298, 1, 2, 3];
    s.store_step(&ids, &[4, 5], &[blk(1, 1)]).expect("valid");
    let rows = s.reconstruct(&[blk(0, 1), blk(1, 1)], 6, 4).expect("stored");
    assert_eq!(rows.ids, [299, 256, 298, 1, 0, 255, 2, 3]);
}

#[test]
fn invalid_configs_are_rejected() {
    let base = RoutingStoreConfig::new(&meta(64), 4, BS);
    let bad = [
        RoutingStoreConfig { block_size: 0, ..base.clone() },
        RoutingStoreConfig { num_experts: 0, ..base.clone() },
        RoutingStoreConfig { num_experts: 40_000, ..base.clone() },
        RoutingStoreConfig { top_k: 65, ..base.clone() },
        base.clone().with_max_bytes(BS * L * K - 1),
    ];
    for config in bad {
        let err = RoutingStore::new(config.clone()).unwrap_err();
        assert!(matches!(err, RoutingError::InvalidConfig(_)), "{config:?}");
    }
    let s = RoutingStore::new(base).expect("valid");
    assert_eq!(s.max_bytes(), 4 * s.block_bytes(), "default cap holds every block");
    assert_eq!(s.width(), IdWidth::U8);
}
