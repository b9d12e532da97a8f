//! Times the scheduling policy's side of one decode step for 64 long sequences: `begin_step`,
//! `build_plan` over the cache manager's grants (one token each, no new block) and
//! `apply_output` of the sampled tokens. The grants are fabricated, as in the policy's tests;
//! then the same steps with a real cache manager planning them (the whole round trip but the
//! actors' messages).
//! Then the stop-string check after a token (`check_stop`, with the byte-level tokenizer of the
//! golden qwen3_moe checkpoint) against decoding the whole output, at several output lengths.
//!
//! Run: `cargo bench -p routed-scheduler --bench decode_step`

use std::sync::Arc;
use std::time::{Duration, Instant};

use routed_cache::{CacheConfig, GrantId, KvCacheManager, SlotGrant, StepAllocation};
use routed_model::Tokenizer;
use routed_scheduler::{GrantedStep, NewSeq, Scheduler, SchedulerConfig, check_stop};
use routed_types::{
    BlockGeneration, BlockId, BlockRef, RequestId, SampledToken, SamplingParams, SeqId, StepOutput,
    TokenId,
};

const NUM_SEQS: usize = 64;
const BLOCK_SIZE: usize = 16;
const NUM_STEPS: usize = 200;

fn grant(id: SeqId, admission: bool, computed: usize, new: usize) -> SlotGrant {
    SlotGrant {
        seq_id: id,
        grant_id: GrantId(id.0 * 1_000_000 + computed as u64),
        is_admission: admission,
        num_computed_tokens: computed,
        num_new_tokens: new,
        num_cached_tokens: 0,
        new_blocks: Vec::new(),
        restore_from: None,
        snapshots: Vec::new(),
    }
}

fn granted(grants: Vec<(SlotGrant, Vec<BlockRef>)>) -> GrantedStep {
    let num_scheduled_tokens = grants.iter().map(|g| g.0.num_new_tokens).sum();
    // A running sequence's added blocks travel in its grant.
    let (grants, tables) = grants
        .into_iter()
        .map(|(mut g, table)| match g.is_admission {
            true => (g, table),
            false => {
                g.new_blocks = table;
                (g, Vec::new())
            }
        })
        .unzip();
    GrantedStep {
        allocation: StepAllocation {
            grants,
            deferred: Vec::new(),
            preempted: Vec::new(),
            num_scheduled_tokens,
        },
        tables,
        ..GrantedStep::default()
    }
}

fn output(token: TokenId) -> StepOutput {
    let one = SampledToken {
        token,
        logprob: -1.0,
        top_logprobs: Vec::new(),
        rank: None,
        token_id_logprobs: Vec::new(),
    };
    StepOutput { sampled: vec![Some(one); NUM_SEQS], ..StepOutput::default() }
}

/// A scheduler for `NUM_SEQS` sequences of `context`-token prompts and `NUM_STEPS` decode steps.
fn scheduler(context: usize) -> Scheduler {
    Scheduler::new(SchedulerConfig {
        max_num_batched_tokens: context * NUM_SEQS,
        max_num_seqs: NUM_SEQS,
        max_waiting_requests: NUM_SEQS,
        max_model_len: context + NUM_STEPS + 2,
        hybrid: false,
        eos_token_ids: vec![2],
        capture_routing: true,
    })
}

/// Median and minimum per step, in microseconds, of `NUM_STEPS` decode steps after every
/// sequence's `context`-token prompt was admitted.
fn decode(context: usize) -> (f64, f64) {
    let mut s = scheduler(context);
    let ids: Vec<SeqId> = (0..NUM_SEQS as u64).map(|r| SeqId::new(RequestId(r + 1), 0)).collect();
    let params = Arc::new(SamplingParams::greedy(NUM_STEPS as u32 + 1));
    let prompt: Arc<Vec<TokenId>> = Arc::new((10..10 + context as TokenId).collect());
    s.add(
        ids.iter()
            .map(|&id| NewSeq {
                id,
                prompt: prompt.clone(),
                params: params.clone(),
                cache_salt: None,
            })
            .collect(),
    )
    .unwrap();
    s.begin_step();
    // Every prompt on its own blocks, with room for the steps to come.
    let num_blocks = (context + NUM_STEPS).div_ceil(BLOCK_SIZE) as u32;
    let admissions = ids.iter().enumerate().map(|(i, &id)| {
        let first = i as u32 * num_blocks;
        let table = (first..first + num_blocks)
            .map(|b| BlockRef::new(BlockId(b), BlockGeneration(1)))
            .collect();
        (grant(id, true, 0, context), table)
    });
    s.build_plan(granted(admissions.collect()));
    s.apply_output(&ids, &output(7), &mut |_, _| String::new());
    let mut times = Vec::with_capacity(NUM_STEPS);
    for step in 0..NUM_STEPS {
        let computed = context + step;
        let grants = ids.iter().map(|&id| (grant(id, false, computed, 1), Vec::new())).collect();
        let start = Instant::now();
        s.begin_step();
        let plan = s.build_plan(granted(grants));
        s.apply_output(&ids, &output(7), &mut |_, _| String::new());
        times.push(start.elapsed());
        std::hint::black_box(plan);
    }
    times.sort();
    let us = |d: Duration| d.as_secs_f64() * 1e6;
    (us(times[times.len() / 2]), us(times[0]))
}

/// [`decode`]'s steps with the cache manager's half of the round trip too: a real
/// `KvCacheManager` hears each step's commits and sampled tokens and grants it
/// (`CacheStep::plan`), as the cache manager actor does; every sequence has a prompt of its own.
fn decode_with_cache(context: usize) -> (f64, f64) {
    let num_blocks = NUM_SEQS * (context + NUM_STEPS + 2).div_ceil(BLOCK_SIZE) + 1;
    let mut cache = KvCacheManager::new(CacheConfig::attention(BLOCK_SIZE, num_blocks)).unwrap();
    let mut s = scheduler(context);
    let ids: Vec<SeqId> = (0..NUM_SEQS as u64).map(|r| SeqId::new(RequestId(r + 1), 0)).collect();
    let params = Arc::new(SamplingParams::greedy(NUM_STEPS as u32 + 2));
    let new = (0..NUM_SEQS as TokenId).zip(&ids).map(|(i, &id)| NewSeq {
        id,
        prompt: Arc::new((0..context as TokenId).map(|t| 3 + (t * 64 + i) % 100_000).collect()),
        params: params.clone(),
        cache_salt: None,
    });
    s.add(new.collect()).unwrap();
    let mut times = Vec::with_capacity(NUM_STEPS);
    for step in 0..=NUM_STEPS {
        let start = Instant::now();
        let granted = s.begin_step().plan(&mut cache).unwrap();
        let plan = s.build_plan(granted);
        s.apply_output(&ids, &output(7 + step as TokenId), &mut |_, _| String::new());
        // The first step is the prefill.
        if step > 0 {
            times.push(start.elapsed());
        }
        std::hint::black_box(plan);
    }
    times.sort();
    let us = |d: Duration| d.as_secs_f64() * 1e6;
    (us(times[times.len() / 2]), us(times[0]))
}

/// Microseconds per call of `f`, the median of 7 rounds of 100.
fn time(mut f: impl FnMut()) -> f64 {
    let mut rounds: Vec<f64> = (0..7)
        .map(|_| {
            let start = Instant::now();
            (0..100).for_each(|_| f());
            start.elapsed().as_secs_f64() * 1e4
        })
        .collect();
    rounds.sort_by(f64::total_cmp);
    rounds[3]
}

/// The stop-string check after the last token of outputs of several lengths, against one decode
/// of the whole output (what every check cost before it looked at a window first).
fn stop_check() {
    let dir =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/golden/qwen3_moe/model");
    let tokenizer = Tokenizer::from_dir(&dir).expect("the golden tokenizer");
    let output: Vec<TokenId> = (0..4_096u32).map(|i| 3 + i * 7_919 % 500).collect();
    let params =
        SamplingParams { stop: vec!["</answer>".into()], ..SamplingParams::greedy(1 << 20) };
    let mut text =
        |ids: &[TokenId], skip: bool| tokenizer.decode_with(ids, skip).unwrap_or_default();
    for n in [256, 1_024, 4_096] {
        let out = &output[..n];
        let check = time(|| {
            drop(std::hint::black_box(check_stop(out, &params, &[], n, 1 << 20, &mut text)))
        });
        let whole = time(|| drop(std::hint::black_box(text(out, false))));
        println!(
            "stop_check/{n}: {check:.1} us per check, {whole:.1} us to decode the whole output"
        );
    }
}

fn main() {
    stop_check();
    for context in [1_024, 8_192, 32_768] {
        let (median, min) = decode(context);
        println!(
            "decode_step/{NUM_SEQS}x{context}: median {median:.1} us, min {min:.1} us per step"
        );
        let (median, min) = decode_with_cache(context);
        println!(
            "decode_step+cache/{NUM_SEQS}x{context}: median {median:.1} us, min {min:.1} us per \
             step"
        );
    }
}
