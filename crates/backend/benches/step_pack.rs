//! Times packing one decode step of 64 long sequences into the step inputs (`StepPacker::pack`)
//! and counts the words the step uploads. Each sequence's table is shared across steps, as the
//! scheduler shares it, and replaced when a block is added: sequences are staggered so that a
//! sixteenth of them add a block each step.
//!
//! Then the logit edits of one penalised row (`EditBuilder::build`: repetition, frequency and
//! presence penalties) after histories of several lengths, half prompt and half output, over a
//! few thousand distinct tokens.
//!
//! Run: `cargo bench -p routed-backend --bench step_pack`

use std::sync::Arc;
use std::time::Instant;

use routed_backend::logit_edits::EditBuilder;
use routed_backend::step_inputs::{AttentionTiling, PackGeometry, StepCapacity, StepPacker};
use routed_types::{
    BlockGeneration, BlockId, BlockRef, SamplingParams, ScheduledSeq, SeqContext, SeqId, StepPlan,
    TokenId,
};

const NUM_SEQS: usize = 64;
const BLOCK_SIZE: usize = 16;
const MAX_MODEL_LEN: usize = 40_960;
const NUM_STEPS: usize = 1_600;

fn table(first: usize, len: usize) -> Arc<[BlockRef]> {
    (first..first + len).map(|b| BlockRef::new(BlockId(b as u32), BlockGeneration(1))).collect()
}

const MAX_BLOCKS: usize = MAX_MODEL_LEN / BLOCK_SIZE + 1;

/// A packer at the CUDA worker's limits for Qwen3's vocabulary.
fn packer() -> StepPacker {
    let capacity = StepCapacity {
        max_tokens: 2048,
        max_seqs: 128,
        max_blocks_per_seq: MAX_BLOCKS,
        max_taps: 8 * 128,
        max_logit_edits: 1 << 20,
    };
    let geometry = PackGeometry {
        vocab_size: 151_936,
        block_size: BLOCK_SIZE,
        num_blocks: NUM_SEQS * MAX_BLOCKS + 1,
        max_positions: MAX_MODEL_LEN,
        num_live_states: None,
        num_snapshot_slots: 0,
        attention: Some(AttentionTiling { group: 4, rows_per_item: 16 }),
        logits_chunk_rows: 128,
    };
    StepPacker::new(capacity, geometry)
}

/// Median and minimum per step in microseconds, and the table words uploaded per step, of
/// `NUM_STEPS` decode steps at `context` tokens.
fn decode(context: usize) -> (f64, f64, usize) {
    let max_blocks = MAX_BLOCKS;
    let mut packer = packer();
    let mut words = vec![0u32; packer.layout().num_words()];
    let greedy = Arc::new(SamplingParams::greedy(1));
    let mut seqs: Vec<ScheduledSeq> = (0..NUM_SEQS)
        .map(|i| {
            // Staggered: sequence `i` is `i` tokens into its last block.
            let computed = context + i % BLOCK_SIZE;
            let mut s = ScheduledSeq::prompt_chunk(SeqId(i as u64), vec![1], computed, vec![]);
            s.block_table = table(i * max_blocks, computed / BLOCK_SIZE + 1);
            s.num_prompt_tokens = context;
            s.sample = Some((greedy.clone(), 0));
            s
        })
        .collect();
    let mut times = Vec::with_capacity(NUM_STEPS);
    let fixed = packer.layout().block_tables.offset;
    let mut table_words = 0;
    for step in 0..NUM_STEPS {
        let plan = StepPlan { seqs, ..StepPlan::default() };
        let start = Instant::now();
        packer.pack(&plan, true, &mut words).expect("a valid step");
        times.push(start.elapsed().as_secs_f64() * 1e6);
        table_words += packer.uploads().iter().map(|r| r.len).sum::<usize>() - fixed;
        seqs = plan.seqs;
        for (i, s) in seqs.iter_mut().enumerate() {
            s.num_computed_tokens += 1;
            if s.num_computed_tokens % BLOCK_SIZE == 0 {
                s.block_table = table(i * max_blocks, s.num_computed_tokens / BLOCK_SIZE + 1);
            }
        }
        std::hint::black_box((step, &words[0]));
    }
    times.sort_by(f64::total_cmp);
    (times[times.len() / 2], times[0], table_words / NUM_STEPS)
}

/// Median and minimum in microseconds of building one row's edits after `len` tokens.
fn penalised_row(len: usize) -> (f64, f64) {
    let params = SamplingParams {
        repetition_penalty: 1.1,
        frequency_penalty: 0.2,
        presence_penalty: 0.1,
        ..SamplingParams::greedy(1)
    };
    // A text's tokens: a few thousand distinct ones, repeating.
    let tokens: Vec<TokenId> =
        (0..len as u32).map(|i| i.wrapping_mul(2_654_435_761) % 3_000).collect();
    let context = SeqContext::new(tokens[..len / 2].to_vec(), &tokens[len / 2..]);
    let (mut builder, mut edits) = (EditBuilder::default(), Vec::new());
    let mut times: Vec<f64> = (0..200)
        .map(|_| {
            edits.clear();
            let start = Instant::now();
            assert!(builder.build(&params, Some(&context), 151_936, &mut edits));
            start.elapsed().as_secs_f64() * 1e6
        })
        .collect();
    times.sort_by(f64::total_cmp);
    (times[times.len() / 2], times[0])
}

/// Median and minimum in microseconds, and the edits, of packing a decode step of 64 rows with a
/// presence penalty after a 1k-token prompt and `output` generated tokens each.
fn penalised_step(output: usize) -> (f64, f64, usize) {
    let mut packer = packer();
    let mut words = vec![0u32; packer.layout().num_words()];
    let params = Arc::new(SamplingParams { presence_penalty: 1.5, ..SamplingParams::greedy(1) });
    // A text's tokens: about 1,500 distinct ones a sequence, repeating.
    let text = |seed: usize, n: usize| -> Vec<TokenId> {
        (0..n).map(|i| ((i + seed).wrapping_mul(2_654_435_761) % 1_500 + seed) as TokenId).collect()
    };
    let seqs = (0..NUM_SEQS)
        .map(|i| {
            let computed = 1024 + output;
            let mut s = ScheduledSeq::prompt_chunk(SeqId(i as u64), vec![1], computed, vec![]);
            s.block_table = table(i * MAX_BLOCKS, computed / BLOCK_SIZE + 1);
            s.num_prompt_tokens = 1024;
            s.sample = Some((params.clone(), output as u64));
            s.context = Some(SeqContext::new(text(i, 1024), &text(i + 7, output)));
            s
        })
        .collect();
    let plan = StepPlan { seqs, ..StepPlan::default() };
    let mut edits = 0;
    let mut times: Vec<f64> = (0..50)
        .map(|_| {
            let start = Instant::now();
            edits = packer.pack(&plan, true, &mut words).expect("a valid step").num_logit_edits;
            start.elapsed().as_secs_f64() * 1e6
        })
        .collect();
    times.sort_by(f64::total_cmp);
    (times[times.len() / 2], times[0], edits)
}

fn main() {
    println!("step_pack: {NUM_SEQS} sequences, one decode token each, {BLOCK_SIZE}-token blocks");
    println!("| context | median | min | table bytes uploaded a step |");
    println!("| --- | --- | --- | --- |");
    for context in [1_024, 8_192, 32_768] {
        let (median, min, words) = decode(context);
        println!("| {context} tokens | {median:.1} us | {min:.1} us | {} |", words * 4);
    }
    println!("edits of one penalised row");
    println!("| history | median | min |");
    println!("| --- | --- | --- |");
    for len in [1_024, 4_096, 16_384] {
        let (median, min) = penalised_row(len);
        println!("| {len} tokens | {median:.1} us | {min:.1} us |");
    }
    println!("a decode step of {NUM_SEQS} rows with a presence penalty");
    println!("| output | median | min | edits |");
    println!("| --- | --- | --- | --- |");
    for output in [1_024, 4_096] {
        let (median, min, edits) = penalised_step(output);
        println!("| {output} tokens | {median:.1} us | {min:.1} us | {edits} |");
    }
}
