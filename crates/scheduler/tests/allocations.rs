//! Heap allocations of a decode step on the scheduler's and the cache manager's side: the
//! policy's `begin_step`, the cache manager's planning of it (`CacheStep::plan` on a real
//! `KvCacheManager`), `build_plan` and `apply_output`. A decode step may allocate a few buffers
//! for the step as a whole, but nothing per sequence: the same count at 8 and at 64 sequences.
//! (A sequence adding a block, or its output outgrowing its buffer, allocates, once every
//! `block_size` tokens or less often: the median step does neither.)
//!
//! Allocations are counted per thread, so the tests of this file running side by side do not see
//! each other's.

use routed_cache::{CacheConfig, KvCacheManager, MambaCacheConfig};
use routed_scheduler::{NewSeq, Scheduler, SchedulerConfig};
use routed_test_support::{Counting, num_allocations_here as num_allocations};
use routed_types::{RequestId, SampledToken, SamplingParams, SeqId, StepOutput, TokenId};
use std::sync::Arc;

#[global_allocator]
static GLOBAL: Counting = Counting;

const BLOCK_SIZE: usize = 16;
const PROMPT_LEN: usize = 100;
const NUM_STEPS: usize = 96;

/// Allocations of each of `NUM_STEPS` decode steps of `num_seqs` sequences, after their prompts
/// were prefilled in one step. `params` samples them.
fn decode_step_allocations(num_seqs: usize, params: SamplingParams, hybrid: bool) -> Vec<u64> {
    let num_blocks = num_seqs * (PROMPT_LEN + NUM_STEPS + 2).div_ceil(BLOCK_SIZE) + 1;
    let mut config = CacheConfig::attention(BLOCK_SIZE, num_blocks);
    if hybrid {
        // Room for every sequence's snapshots at its block boundaries.
        config.mamba = Some(MambaCacheConfig { num_snapshot_slots: num_blocks });
    }
    let mut cache = KvCacheManager::new(config).unwrap();
    let mut policy = Scheduler::new(SchedulerConfig {
        max_num_batched_tokens: num_seqs * PROMPT_LEN,
        max_num_seqs: num_seqs,
        max_waiting_requests: num_seqs,
        max_model_len: PROMPT_LEN + NUM_STEPS + 2,
        hybrid,
        eos_token_ids: vec![2],
        capture_routing: true,
    });
    let ids: Vec<SeqId> = (0..num_seqs as u64).map(|r| SeqId::new(RequestId(r + 1), 0)).collect();
    let params = Arc::new(params);
    let new = ids.iter().zip(0..).map(|(&id, i)| NewSeq {
        id,
        // Distinct prompts: no sequence's prefix is another's.
        prompt: Arc::new((0..PROMPT_LEN as TokenId).map(|t| 1_000 * i + t).collect()),
        params: params.clone(),
        cache_salt: None,
    });
    policy.add(new.collect()).unwrap();
    let mut counts = Vec::with_capacity(NUM_STEPS);
    for step in 0..=NUM_STEPS {
        let before = num_allocations();
        let granted = policy.begin_step().plan(&mut cache).unwrap();
        let plan = policy.build_plan(granted);
        assert_eq!(plan.num_tokens(), if step == 0 { num_seqs * PROMPT_LEN } else { num_seqs });
        let token = |i: usize| SampledToken {
            token: 3 + (step * num_seqs + i) as TokenId % 500,
            logprob: -1.0,
            top_logprobs: Vec::new(),
            rank: None,
            token_id_logprobs: Vec::new(),
        };
        // The executor is done with the plan by the time its output is applied.
        drop(plan);
        let output = StepOutput {
            sampled: (0..num_seqs).map(|i| Some(token(i))).collect(),
            ..StepOutput::default()
        };
        let events = policy.apply_output(&ids, &output, &mut |_, _| String::new());
        assert_eq!(events.len(), num_seqs, "every sequence sampled and none stopped: {events:?}");
        drop((output, events));
        if step > 0 {
            counts.push(num_allocations() - before);
        }
    }
    counts
}

fn median(mut counts: Vec<u64>) -> u64 {
    counts.sort_unstable();
    counts[counts.len() / 2]
}

fn assert_independent_of_batch(params: SamplingParams, hybrid: bool) {
    let few = median(decode_step_allocations(8, params.clone(), hybrid));
    let many = median(decode_step_allocations(64, params, hybrid));
    assert_eq!(
        few, many,
        "a decode step allocates {few} times at 8 sequences and {many} times at 64: some \
         allocation is made per sequence"
    );
}

#[test]
fn greedy_decode_step_allocates_nothing_per_sequence() {
    assert_independent_of_batch(SamplingParams::greedy(NUM_STEPS as u32 + 2), false);
}

#[test]
fn hybrid_decode_step_allocates_nothing_per_sequence() {
    // Every sequence holds a live state slot, and snapshots are planned at block boundaries.
    assert_independent_of_batch(SamplingParams::greedy(NUM_STEPS as u32 + 2), true);
}

#[test]
fn penalised_decode_step_allocates_nothing_per_sequence() {
    // Penalties make every plan carry the sequence's token counts (shared, not copied), and the
    // sampled token goes into them in place.
    let params =
        SamplingParams { presence_penalty: 0.5, ..SamplingParams::greedy(NUM_STEPS as u32 + 2) };
    assert_independent_of_batch(params, false);
}

#[test]
fn decode_step_with_bad_words_allocates_nothing_per_sequence() {
    // A one-token word is ruled out after every token: each plan carries the same bans, shared
    // rather than built again. (A pair's ban comes and goes with the output's last token.)
    let params = SamplingParams {
        bad_words: vec![vec![7], vec![9, 11]],
        ..SamplingParams::greedy(NUM_STEPS as u32 + 2)
    };
    assert_independent_of_batch(params, false);
}
