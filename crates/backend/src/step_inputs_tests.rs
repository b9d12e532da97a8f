//! The packed layout: sections, the contents of a mixed step, reuse, and every refusal.

use super::*;
use routed_types::{
    BlockGeneration, BlockId, BlockRef, MAX_LOGPROBS, SamplingParams, ScheduledSeq, SeqContext,
    SeqId, SnapshotSlotId,
};
use std::sync::Arc;

const CAPACITY: StepCapacity = StepCapacity {
    max_tokens: 64,
    max_seqs: 8,
    max_blocks_per_seq: 10,
    max_taps: 6,
    max_logit_edits: 6,
};

fn geometry() -> PackGeometry {
    PackGeometry {
        vocab_size: 100,
        block_size: 4,
        num_blocks: 32,
        max_positions: 40,
        num_live_states: Some(8),
        num_snapshot_slots: 5,
        attention: Some(AttentionTiling { group: 4, rows_per_item: 16 }),
        logits_chunk_rows: 16,
    }
}

fn seq(computed: usize, tokens: &[u32], blocks: &[u32]) -> ScheduledSeq {
    let table: Vec<_> =
        blocks.iter().map(|&b| BlockRef::new(BlockId(b), BlockGeneration(1))).collect();
    let seq_id = SeqId(blocks[0] as u64);
    let live_state = Some(blocks[0] % 8);
    ScheduledSeq {
        live_state,
        ..ScheduledSeq::prompt_chunk(seq_id, tokens.to_vec(), computed, table)
    }
}

fn sampled(mut s: ScheduledSeq, params: SamplingParams, index: u64) -> ScheduledSeq {
    s.sample = Some((Arc::new(params), index));
    s
}

fn words_of(packer: &StepPacker) -> Vec<u32> {
    // Garbage everywhere: the packer must write every word a step uses.
    vec![0xDEAD_BEEF; packer.layout().num_words()]
}

fn section(words: &[u32], s: Section, len: usize) -> Vec<i32> {
    words[s.offset..s.offset + len].iter().map(|&w| w as i32).collect()
}

#[test]
fn sections_are_aligned_disjoint_and_sized_for_the_capacity() {
    let tiling = AttentionTiling { group: 4, rows_per_item: 16 };
    let l = StepInputLayout::new(CAPACITY, Some(tiling));
    let all = [
        (l.token_ids, 64),
        (l.positions, 64),
        (l.slot_mapping, 64),
        (l.seq_starts, 9),
        (l.num_prompt, 8),
        (l.attention_items, 2 * (8 + 64 * 4 / 16)),
        (l.live_slots, 8),
        (l.state_copies, 16),
        (l.tap_starts, 9),
        (l.taps, 12),
        (l.logit_rows, 2 * (64 + 8)),
        (l.sample_params, 8 * SAMPLE_PARAMS_WORDS),
        (l.score_targets, 64),
        (l.edit_starts, 9),
        (l.block_tables, 80),
        (l.logit_edits, 6 * LOGIT_EDIT_WORDS),
    ];
    for pair in all.windows(2) {
        assert!(pair[0].0.end() <= pair[1].0.offset, "{:?} overlaps {:?}", pair[0], pair[1]);
    }
    for (s, len) in all {
        assert_eq!(s.len, len);
        assert_eq!(s.offset % SECTION_ALIGN_WORDS, 0);
    }
    assert_eq!(l.num_words(), l.logit_edits.end(), "the logit edits come last");
    let no_attention = StepInputLayout::new(CAPACITY, None);
    assert_eq!(no_attention.attention_items.len, 0);
}

#[test]
fn a_mixed_step_is_packed_section_by_section() {
    let mut packer = StepPacker::new(CAPACITY, geometry());
    let mut words = words_of(&packer);
    // A prefill chunk with prompt logprobs, restored from a snapshot, tapping two snapshots.
    let mut chunk = sampled(seq(4, &[5, 6, 7, 8, 9], &[3, 9, 11]), SamplingParams::greedy(4), 0);
    chunk.num_prompt_tokens = 12;
    chunk.restore_from = Some(SnapshotSlotId(2));
    chunk.snapshots = vec![(4, SnapshotSlotId(1)), (8, SnapshotSlotId(4))];
    chunk.prompt_logprobs = Some(0);
    chunk.context = Some(SeqContext {
        prompt: Arc::new((10..22).collect()),
        logprob_token_ids: Arc::from([]),
        ..SeqContext::default()
    });
    let seeded = SamplingParams {
        temperature: 0.7,
        top_p: 0.9,
        top_k: Some(20),
        seed: 0x1_0000_0002,
        ..SamplingParams::default()
    };
    let penalized = SamplingParams { presence_penalty: 0.5, ..SamplingParams::greedy(4) };
    let mut penalized_seq = sampled(seq(3, &[3], &[6]), penalized, 1);
    penalized_seq.context = Some(SeqContext::new(vec![1, 2], &[3, 9, 3]));
    let plan = StepPlan {
        seqs: vec![
            chunk,
            // Decodes: greedy, seeded, greedy with a presence penalty (edits), a fresh prompt
            // (cleared).
            sampled(seq(6, &[1], &[4, 2]), SamplingParams::greedy(4), 3),
            sampled(seq(2, &[2], &[5]), seeded.clone(), 9),
            penalized_seq,
            seq(0, &[4, 4], &[7]),
        ],
        ..StepPlan::default()
    };
    let p = packer.pack(&plan, true, &mut words).unwrap();
    let l = packer.layout().clone();
    // Tables of at most 3 entries at the smallest stride.
    let stride = MIN_TABLE_STRIDE;
    assert_eq!((p.num_tokens, p.num_seqs, p.block_table_stride), (10, 5, stride));
    // The fixed sections, the five rows and the edits, close enough to go in one copy.
    assert_eq!(packer.uploads(), [Section { offset: 0, len: p.edit_words(&l).end() }]);
    assert_eq!(section(&words, l.token_ids, 10), [5, 6, 7, 8, 9, 1, 2, 3, 4, 4]);
    assert_eq!(section(&words, l.positions, 10), [4, 5, 6, 7, 8, 6, 2, 3, 0, 1]);
    // Slot = block * 4 + position % 4.
    assert_eq!(section(&words, l.slot_mapping, 10), [36, 37, 38, 39, 44, 10, 22, 27, 28, 29]);
    assert_eq!(section(&words, l.seq_starts, 6), [0, 5, 6, 7, 8, 10]);
    assert_eq!(section(&words, l.num_prompt, 5), [12, 7, 3, 4, 2]);
    let rows = section(&words, l.block_tables, 5 * stride);
    let firsts: [&[i32]; 5] = [&[3, 9, 11], &[4, 2], &[5], &[6], &[7]];
    for (row, first) in rows.chunks(stride).zip(firsts) {
        assert_eq!(row[..first.len()], first[..]);
        assert!(row[first.len()..].iter().all(|&b| b == -1), "{row:?}");
    }
    // 5 tokens x 4 heads = 20 rows: items at rows 0 and 16; the others have one item each.
    assert_eq!(p.num_attention_items, 6);
    assert_eq!(section(&words, l.attention_items, 12), [0, 0, 0, 16, 1, 0, 2, 0, 3, 0, 4, 0]);
    assert_eq!(section(&words, l.live_slots, 5), [3, 4, 5, 6, 7]);
    assert_eq!(p.num_state_copies, 2, "the restore and the fresh prompt's clear");
    assert_eq!(section(&words, l.state_copies, 4), [2, 3, -1, 7]);
    assert_eq!((p.num_taps, section(&words, l.tap_starts, 6)), (2, vec![0, 2, 2, 2, 2, 2]));
    assert_eq!(section(&words, l.taps, 4), [4, 1, 8, 4]);
    // Logits rows: greedy (the chunk's last row 4, tokens 5 and 7), seeded (token 6), then the
    // chunk's five rows scored against the next prompt tokens.
    assert_eq!((p.num_greedy, p.num_sampled, p.num_scored, p.num_host_rows), (3, 1, 5, 0));
    assert!(!p.wants_ranks && p.num_top_logprobs == 0, "no device row reports logprobs");
    assert_eq!(
        section(&words, l.logit_rows, 18),
        [4, 0, 5, 1, 7, 2, 6, 3, 0, 4, 1, 5, 2, 6, 3, 7, 4, 8]
    );
    assert_eq!(
        packer.logit_uses(),
        [
            LogitUse::Greedy { row: 0 },
            LogitUse::Greedy { row: 1 },
            LogitUse::Sampled { row: 0 },
            LogitUse::Greedy { row: 2 },
            LogitUse::None,
        ]
    );
    // Positions 4..9 predict prompt tokens 5..10.
    let scored = ScoreUse { seq: 0, first: 4, len: 5, first_position: 5, num_top: 0 };
    assert_eq!(packer.score_uses(), [scored]);
    assert_eq!(section(&words, l.score_targets, 5), [15, 16, 17, 18, 19]);
    let params = &words[l.sample_params.offset..l.sample_params.offset + SAMPLE_PARAMS_WORDS];
    assert_eq!(params, [2, 1, 9, 0, 0.7f32.to_bits(), 0.9f32.to_bits(), 20, 0]);
    // The penalised row's edits: the output's tokens 3 and 9, device rows in order.
    assert_eq!(p.num_logit_edits, 2);
    let edits = p.edit_words(&l);
    assert_eq!((edits.offset, edits.len), (l.logit_edits.offset, 2 * LOGIT_EDIT_WORDS));
    assert_eq!(section(&words, l.edit_starts, 5), [0, 0, 0, 2, 2]);
    let edit = |e: usize| &words[l.logit_edits.offset + e * LOGIT_EDIT_WORDS..][..LOGIT_EDIT_WORDS];
    let (one, half) = (1f32.to_bits(), 0.5f32.to_bits());
    assert_eq!(edit(0), [3, crate::logit_edits::EDIT_PENALTIES, 0, one, 0, half]);
    assert_eq!(edit(1)[0], 9);
}

#[test]
fn a_rank_without_logits_and_a_dummy_forward_pack_no_rows() {
    let mut packer = StepPacker::new(CAPACITY, geometry());
    let mut words = words_of(&packer);
    let plan = StepPlan {
        seqs: vec![sampled(seq(0, &[1, 2], &[1]), SamplingParams::greedy(1), 0)],
        ..StepPlan::default()
    };
    let p = packer.pack(&plan, false, &mut words).unwrap();
    assert_eq!(p.num_logit_rows(), 0);
    assert_eq!(packer.logit_uses(), [LogitUse::None]);
    // The dummy forward: one token on the scratch block and the scratch live slot (index 8).
    let mut dummy = seq(0, &[0], &[31]);
    dummy.live_state = Some(8);
    let plan = StepPlan { seqs: vec![dummy], ..StepPlan::default() };
    let p = packer.pack(&plan, false, &mut words).unwrap();
    let l = packer.layout();
    assert_eq!(section(&words, l.slot_mapping, 1), [124]);
    assert_eq!((p.num_state_copies, section(&words, l.state_copies, 2)), (1, vec![-1, 8]));
}

#[test]
fn a_chunk_that_names_tokens_for_their_logprobs_is_scored_and_sampled_on_the_host() {
    let mut packer = StepPacker::new(CAPACITY, geometry());
    let mut words = words_of(&packer);
    let params = SamplingParams {
        logprobs: Some(1),
        logprob_token_ids: vec![2, 9].into(),
        ..SamplingParams::greedy(1)
    };
    let mut named = sampled(seq(0, &[1, 2, 3, 4], &[1]), params, 0);
    named.prompt_logprobs = Some(1);
    named.context = Some(SeqContext {
        prompt: Arc::new(vec![1, 2, 3, 4]),
        logprob_token_ids: vec![2, 9].into(),
        ..SeqContext::default()
    });
    let plan = StepPlan {
        seqs: vec![sampled(seq(1, &[7], &[2]), SamplingParams::greedy(1), 1), named],
        ..StepPlan::default()
    };
    let p = packer.pack(&plan, true, &mut words).unwrap();
    // Every row of the chunk goes to the host, none is scored on the device; the other
    // sequence stays on the device.
    assert_eq!((p.num_greedy, p.num_scored, p.num_host_rows), (1, 0, 4));
    assert_eq!(
        packer.logit_uses(),
        [LogitUse::Greedy { row: 0 }, LogitUse::Host { first: 1, len: 4 }]
    );
}

#[test]
fn logits_rows_count_within_their_chunk_and_a_repeated_step_uploads_its_fixed_sections() {
    let mut g = geometry();
    g.logits_chunk_rows = 2;
    let mut packer = StepPacker::new(CAPACITY, g);
    let mut words = words_of(&packer);
    let mut big = sampled(seq(0, &[1, 2, 3, 4, 5], &[1, 2]), SamplingParams::greedy(1), 0);
    big.prompt_logprobs = Some(1);
    big.context = Some(SeqContext {
        prompt: Arc::new(vec![1, 2, 3, 4, 5]),
        logprob_token_ids: Arc::from([]),
        ..SeqContext::default()
    });
    let plan = StepPlan { seqs: vec![big], ..StepPlan::default() };
    let first = packer.pack(&plan, true, &mut words).unwrap();
    let l = packer.layout().clone();
    // The greedy last row, then four scored rows (the last position predicts no prompt token).
    assert_eq!((first.num_greedy, first.num_scored, first.num_score_top), (1, 4, 1));
    assert_eq!(section(&words, l.logit_rows, 10), [4, 0, 0, 1, 1, 0, 2, 1, 3, 0]);
    let plan = StepPlan {
        seqs: vec![sampled(seq(1, &[7], &[1]), SamplingParams::greedy(1), 1)],
        ..StepPlan::default()
    };
    packer.pack(&plan, true, &mut words).unwrap();
    assert_eq!(section(&words, l.token_ids, 1), [7]);
    assert_eq!(section(&words, l.seq_starts, 2), [0, 1]);
    assert_eq!(packer.logit_uses(), [LogitUse::Greedy { row: 0 }]);
    // Packing is a function of the plan: the same step gives the same words, and the same table
    // is not uploaded again.
    let before = words.clone();
    packer.pack(&plan, true, &mut words).unwrap();
    assert_eq!(words, before);
    assert_eq!(packer.uploads(), [Section { offset: 0, len: l.block_tables.offset }]);
}

#[test]
fn indices_the_device_trusts_are_checked_and_capacity_is_enforced() {
    let mut packer = StepPacker::new(CAPACITY, geometry());
    let mut words = words_of(&packer);
    let mut refuse = |s: ScheduledSeq| {
        let plan = StepPlan { seqs: vec![s], ..StepPlan::default() };
        packer.pack(&plan, true, &mut words).unwrap_err().to_string()
    };
    assert!(refuse(seq(0, &[100], &[1])).contains("vocabulary"));
    assert!(refuse(seq(0, &[], &[1])).contains("no tokens"));
    assert!(refuse(seq(0, &[1; 5], &[1])).contains("cannot hold"));
    assert!(refuse(seq(0, &[1], &[32])).contains("outside the pool"));
    assert!(refuse(seq(40, &[1], &[1; 10])).contains("past the model"));
    let mut s = seq(0, &[1], &[1]);
    s.live_state = Some(9);
    assert!(refuse(s).contains("live state"));
    let mut s = seq(0, &[1], &[1]);
    s.live_state = None;
    assert!(refuse(s).contains("live state"));
    let mut s = seq(4, &[1], &[1, 2]);
    s.snapshots = vec![(6, SnapshotSlotId(0))];
    assert!(refuse(s).contains("bad snapshot"));
    let mut s = seq(4, &[1], &[1, 2]);
    s.restore_from = Some(SnapshotSlotId(5));
    assert!(refuse(s).contains("bad snapshot"));
    assert!(refuse(seq(0, &[1; 65], &[1; 10])).contains("tokens"));
    assert!(refuse(seq(0, &[1], &[1; 11])).contains("block-table entries"));
    let mut s = seq(0, &[1; 8], &[1, 2]);
    s.snapshots = (0..7).map(|p| (p, SnapshotSlotId(0))).collect();
    assert!(refuse(s).contains("snapshot taps"));
    let plan = StepPlan { seqs: vec![seq(0, &[1], &[1]); 9], ..StepPlan::default() };
    let e = packer.pack(&plan, true, &mut words).unwrap_err();
    assert_eq!(e, StepInputError::Capacity { what: "sequences", need: 9, capacity: 8 });
}

#[test]
fn attention_free_and_attention_only_models_skip_what_they_lack() {
    let mut g = geometry();
    g.attention = None;
    g.num_live_states = None;
    let mut packer = StepPacker::new(CAPACITY, g);
    let mut words = words_of(&packer);
    let mut s = seq(0, &[1, 2], &[1]);
    // Without Mamba layers the state fields are not the device's business.
    s.live_state = None;
    s.snapshots = vec![(9, SnapshotSlotId(77))];
    let plan = StepPlan { seqs: vec![s], ..StepPlan::default() };
    let p = packer.pack(&plan, true, &mut words).unwrap();
    assert_eq!((p.num_attention_items, p.num_state_copies, p.num_taps), (0, 0, 0));
}

#[test]
fn a_step_for_a_graph_is_padded_to_its_batch_and_strides_its_tables_by_the_longest() {
    let mut packer = StepPacker::new(CAPACITY, geometry());
    let mut words = words_of(&packer);
    let plan = StepPlan {
        seqs: vec![
            sampled(seq(5, &[3], &[1, 2]), SamplingParams::greedy(1), 0),
            sampled(seq(2, &[4], &[7]), SamplingParams::greedy(1), 0),
        ],
        ..StepPlan::default()
    };
    let eager = packer.pack(&plan, true, &mut words).unwrap();
    let pad = seq(1, &[0], &[31]);
    let graphed = packer.pack_for_graph(&plan, &pad, 4, true, &mut words).unwrap();
    // Tables of 2 entries at the smallest stride, below the capacity's 10.
    let stride = MIN_TABLE_STRIDE;
    assert_eq!(eager.block_table_stride, stride);
    assert_eq!((graphed.num_seqs, graphed.num_tokens, graphed.block_table_stride), (4, 4, stride));
    assert_eq!(graphed.num_attention_items, 2 * eager.num_attention_items);
    let l = packer.layout().clone();
    assert_eq!(section(&words, l.token_ids, 4), [3, 4, 0, 0]);
    assert_eq!(section(&words, l.positions, 4), [5, 2, 1, 1]);
    assert_eq!(section(&words, l.slot_mapping, 4), [9, 30, 125, 125]);
    let tables = section(&words, l.block_tables, 4 * stride);
    for (i, first) in [[1, 2], [7, -1], [31, -1], [31, -1]].iter().enumerate() {
        let row = &tables[i * stride..(i + 1) * stride];
        assert_eq!(row[..2], first[..], "table {i}");
        assert!(row[2..].iter().all(|&b| b == -1), "table {i}: {row:?}");
    }
    // The plan's rows were written by the eager step; only the padding's are new (one copy with
    // the fixed sections, across the plan's rows).
    assert_eq!(packer.uploads(), [Section { offset: 0, len: l.block_tables.offset + 4 * stride }]);
    // Only the plan's sequences want logits; the padding computes none.
    assert_eq!((graphed.num_greedy, graphed.num_sampled, graphed.num_host_rows), (2, 0, 0));
    assert!(packer.logit_uses()[2..].iter().all(|u| *u == LogitUse::None));
    // A batch smaller than the plan is refused.
    assert!(packer.pack_for_graph(&plan, &pad, 1, true, &mut words).is_err());
}

#[test]
fn table_strides_are_powers_of_two_up_to_the_capacity() {
    let strides: Vec<usize> = [0, 1, 8, 9, 16, 17, 2561].map(|n| table_stride(n, 2561)).into();
    assert_eq!(strides, [8, 8, 8, 16, 16, 32, 2561]);
    assert_eq!(table_stride(1000, 1000), 1000, "never past the capacity");
    assert_eq!(table_stride(9, 10), 10);
}

#[test]
fn rows_reporting_logprobs_stay_on_the_device_with_the_most_alternatives_asked() {
    let mut packer = StepPacker::new(CAPACITY, geometry());
    let mut words = words_of(&packer);
    let logprobs = |n: u32, params: SamplingParams| SamplingParams { logprobs: Some(n), ..params };
    let seeded = SamplingParams { temperature: 0.8, seed: 5, ..SamplingParams::default() };
    let plan = StepPlan {
        seqs: vec![
            sampled(seq(6, &[1], &[4, 2]), logprobs(0, SamplingParams::greedy(4)), 0),
            sampled(seq(2, &[2], &[5]), logprobs(3, seeded.clone()), 0),
            sampled(seq(3, &[3], &[6]), SamplingParams::greedy(4), 0),
            sampled(seq(3, &[3], &[7]), logprobs(21, SamplingParams::greedy(4)), 0),
        ],
        ..StepPlan::default()
    };
    let p = packer.pack(&plan, true, &mut words).unwrap();
    // More alternatives than the device reports go to the host.
    assert_eq!((p.num_greedy, p.num_sampled, p.num_host_rows), (2, 1, 1));
    assert!(p.wants_ranks);
    assert_eq!(p.num_top_logprobs, 3);
    assert!(on_device(&logprobs(MAX_LOGPROBS, seeded.clone())));
    assert!(on_device(&SamplingParams { min_p: 0.1, ..logprobs(1, seeded.clone()) }));
    // Bad words' bans follow the output's last tokens: chosen on the host.
    assert!(!on_device(&SamplingParams { bad_words: vec![vec![4]], ..seeded }));
}

#[test]
fn rows_whose_edits_do_not_fit_or_repeat_a_token_go_to_the_host() {
    let mut packer = StepPacker::new(CAPACITY, geometry());
    let mut words = words_of(&packer);
    let bias = |tokens: &[u32], params: SamplingParams| SamplingParams {
        logit_bias: tokens.iter().map(|&t| (t, 1.5)).collect(),
        ..params
    };
    let seeded = SamplingParams { temperature: 0.8, min_p: 0.25, ..SamplingParams::default() };
    let plan = StepPlan {
        seqs: vec![
            sampled(seq(6, &[1], &[4, 2]), bias(&[1, 2, 3, 4], SamplingParams::greedy(4)), 0),
            // Four more edits would make 8 of the 6 the step holds.
            sampled(seq(2, &[2], &[5]), bias(&[5, 6, 7, 8], SamplingParams::greedy(4)), 0),
            // The CPU adds a repeated token's biases one after the other: not one edit.
            sampled(seq(3, &[3], &[6]), bias(&[9, 9], SamplingParams::greedy(4)), 0),
            sampled(seq(3, &[3], &[7]), bias(&[10, 11], seeded), 0),
        ],
        ..StepPlan::default()
    };
    let p = packer.pack(&plan, true, &mut words).unwrap();
    assert_eq!((p.num_greedy, p.num_sampled, p.num_host_rows), (1, 1, 2));
    assert_eq!(p.num_logit_edits, 6);
    let l = packer.layout();
    assert_eq!(section(&words, l.edit_starts, 3), [0, 4, 6]);
    let token = |e: usize| words[l.logit_edits.offset + e * LOGIT_EDIT_WORDS];
    assert_eq!((0..6).map(token).collect::<Vec<_>>(), [1, 2, 3, 4, 10, 11]);
    let params = &words[l.sample_params.offset..l.sample_params.offset + SAMPLE_PARAMS_WORDS];
    assert_eq!(params[7], 0.25f32.to_bits(), "min-p travels with the sampling parameters");
}

/// The device's buffer as the uploads leave it: garbage, then each step's ranges from `words`.
struct Device(Vec<u32>);

impl Device {
    fn receive(&mut self, packer: &StepPacker, words: &[u32]) {
        for r in packer.uploads() {
            self.0[r.offset..r.end()].copy_from_slice(&words[r.offset..r.end()]);
        }
    }
}

#[test]
fn the_device_holds_every_table_of_a_step_though_only_changes_are_uploaded() {
    let mut packer = StepPacker::new(CAPACITY, geometry());
    let mut words = words_of(&packer);
    let mut device = Device(vec![0x5EED_0000; words.len()]);
    let l = packer.layout().clone();
    let mut state = 7u64;
    let mut below = |n: usize| {
        state =
            state.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
        ((state >> 33) % n as u64) as usize
    };
    // Twelve sequences' tables, shared across steps as the scheduler shares them.
    let table = |ids: &[u32]| -> Arc<[BlockRef]> {
        ids.iter().map(|&b| BlockRef::new(BlockId(b), BlockGeneration(1))).collect()
    };
    let mut tables: Vec<Arc<[BlockRef]>> = (0..12).map(|i| table(&[i])).collect();
    let (mut uploaded, mut whole) = (0, 0);
    for step in 0..400 {
        // Tables grow by a block, restart (preemption), or come again with the same entries.
        for t in tables.iter_mut() {
            let ids: Vec<u32> = t.iter().map(|b| b.block.0).collect();
            *t = match below(8) {
                0 if ids.len() < 10 => table(&[ids.as_slice(), &[below(32) as u32]].concat()),
                1 => table(&[below(32) as u32]),
                2 => table(&ids),
                _ => continue,
            };
        }
        let num_seqs = 1 + below(8);
        let seqs: Vec<ScheduledSeq> = (0..num_seqs)
            .map(|_| {
                let t = tables[below(12)].clone();
                let mut s = seq(t.len() * 4 - 1, &[1], &[t[0].block.0]);
                s.block_table = t;
                s
            })
            .collect();
        let plan = StepPlan { seqs, ..StepPlan::default() };
        let packed = match below(10) {
            // A refused step uploads nothing.
            0 => {
                let mut bad = plan.clone();
                bad.seqs.last_mut().unwrap().token_ids = vec![100].into();
                assert!(packer.pack(&bad, true, &mut words).is_err());
                continue;
            }
            // The device's buffer was lost (its memory released and made again).
            1 => {
                device.0.fill(0x5EED_0001);
                packer.forget_tables();
                packer.pack(&plan, true, &mut words)
            }
            2 => packer.pack_for_graph(&plan, &seq(3, &[0], &[31]), 8, true, &mut words),
            _ => packer.pack(&plan, true, &mut words),
        };
        let p = packed.unwrap();
        device.receive(&packer, &words);
        let stride = p.block_table_stride;
        let section = l.block_tables.offset..l.block_tables.offset + p.num_seqs * stride;
        assert_eq!(device.0[..section.start], words[..section.start], "step {step}");
        let rows = &device.0[section];
        for (i, s) in plan.seqs.iter().enumerate() {
            let row = &rows[i * stride..(i + 1) * stride];
            let ids: Vec<u32> = s.block_table.iter().map(|b| b.block.0).collect();
            assert_eq!(row[..ids.len()], ids[..], "step {step}, row {i}");
            assert!(row[ids.len()..].iter().all(|&w| w == u32::MAX), "step {step}, row {i}");
        }
        assert!(packer.uploads().len() <= tables::MAX_UPLOADS);
        uploaded += packer.uploads().iter().map(|r| r.len).sum::<usize>() - l.block_tables.offset;
        whole += p.num_seqs * stride;
    }
    // Not every row travels every step.
    assert!(uploaded < whole, "{uploaded} of {whole} table words uploaded");
}
