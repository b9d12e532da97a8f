//! The scheduling policy driven directly: each test fabricates the cache manager's grants and the
//! runner's outputs, calls `build_plan` / `apply_output`, and checks the plan, the events and
//! what the next step tells the cache manager. No actors, no cache manager, no model.

use routed_cache::{DeferReason, Deferral, GrantId, SlotGrant, StepAllocation};
use routed_scheduler::{
    GrantedStep, NewSeq, Scheduler, SchedulerConfig, SchedulerError, SeqEvent, SeqStatus,
};
use routed_types::{
    BlockGeneration, BlockId, BlockRef, FinishReason, RequestId, SampledToken, SamplingParams,
    SeqId, StepOutput, TokenCounts, TokenId,
};
use std::sync::Arc;

const EOS: TokenId = 2;

fn scheduler(max_num_seqs: usize, hybrid: bool) -> Scheduler {
    Scheduler::new(SchedulerConfig {
        max_num_batched_tokens: 64,
        max_num_seqs,
        max_waiting_requests: 4,
        max_model_len: 100,
        hybrid,
        eos_token_ids: vec![EOS],
        capture_routing: true,
    })
}

fn seq(request: u64) -> SeqId {
    SeqId::new(RequestId(request), 0)
}

fn new_seq(id: SeqId, prompt_len: usize, max_tokens: u32) -> NewSeq {
    NewSeq {
        id,
        prompt: Arc::new((10..10 + prompt_len as TokenId).collect()),
        params: Arc::new(SamplingParams::greedy(max_tokens)),
        cache_salt: None,
    }
}

fn blocks(ids: &[u32]) -> Vec<BlockRef> {
    ids.iter().map(|&b| BlockRef::new(BlockId(b), BlockGeneration(b + 1))).collect()
}

/// A grant computing `new` tokens from `computed` on, with `table` (the whole table for an
/// admission, the appended blocks otherwise).
fn grant(id: SeqId, admission: bool, computed: usize, new: usize) -> SlotGrant {
    SlotGrant {
        seq_id: id,
        grant_id: GrantId(id.0 * 1000 + computed as u64),
        is_admission: admission,
        num_computed_tokens: computed,
        num_new_tokens: new,
        num_cached_tokens: if admission { computed } else { 0 },
        new_blocks: Vec::new(),
        restore_from: None,
        snapshots: Vec::new(),
    }
}

fn granted(grants: Vec<(SlotGrant, Vec<BlockRef>)>, preempted: Vec<SeqId>) -> GrantedStep {
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
            preempted,
            num_scheduled_tokens,
        },
        tables,
        ..GrantedStep::default()
    }
}

fn sampled(tokens: &[Option<TokenId>]) -> StepOutput {
    let one = |t: TokenId| SampledToken {
        token: t,
        logprob: -1.0,
        top_logprobs: Vec::new(),
        rank: None,
        token_id_logprobs: Vec::new(),
    };
    StepOutput { sampled: tokens.iter().map(|t| t.map(one)).collect(), ..StepOutput::default() }
}

fn no_text(_: &[TokenId], _: bool) -> String {
    String::new()
}

#[test]
fn candidates_are_running_sequences_first_then_waiting_ones_within_max_num_seqs() {
    let mut s = scheduler(2, false);
    for r in 1..=3 {
        s.add(vec![new_seq(seq(r), 5, 4)]).unwrap();
    }
    let step = s.begin_step();
    assert_eq!(step.add.len(), 3, "the cache manager hears of every new sequence");
    let ids: Vec<_> = step.candidates.iter().map(|c| c.seq_id).collect();
    assert_eq!(ids, [seq(1), seq(2)], "two seats");
    // Admit the second one only.
    s.build_plan(granted(vec![(grant(seq(2), true, 0, 5), blocks(&[4, 5]))], vec![]));
    let ids: Vec<_> = s.begin_step().candidates.iter().map(|c| c.seq_id).collect();
    assert_eq!(ids, [seq(2), seq(1)], "the running one first, then one waiting for the free seat");
}

#[test]
fn an_admission_plans_its_chunk_over_the_whole_block_table() {
    let mut s = scheduler(4, false);
    s.add(vec![new_seq(seq(1), 10, 4)]).unwrap();
    s.begin_step();
    // 4 tokens hit the prefix cache; the grant computes the other 6.
    let plan = s.build_plan(granted(vec![(grant(seq(1), true, 4, 6), blocks(&[7, 8, 9]))], vec![]));
    assert_eq!(plan.seqs.len(), 1);
    let p = &plan.seqs[0];
    assert_eq!(p.seq_id, seq(1));
    assert_eq!(*p.token_ids, (14..20).collect::<Vec<_>>());
    assert_eq!((p.num_computed_tokens, p.num_prompt_tokens), (4, 10));
    assert_eq!(*p.block_table, *blocks(&[7, 8, 9]));
    assert_eq!(p.sample.as_ref().map(|s| s.1), Some(0), "the prompt's end samples token 0");
    assert_eq!(s.seq(seq(1)).unwrap().num_cached_tokens, 4);
    assert_eq!(s.seq(seq(1)).unwrap().status, SeqStatus::Running);
}

#[test]
fn decode_steps_share_the_block_table_until_a_block_is_added() {
    let mut s = scheduler(4, false);
    s.add(vec![new_seq(seq(1), 5, 8)]).unwrap();
    s.begin_step();
    let first = s.build_plan(granted(vec![(grant(seq(1), true, 0, 5), blocks(&[1, 2]))], vec![]));
    s.apply_output(&[seq(1)], &sampled(&[Some(7)]), &mut no_text);
    s.begin_step();
    let second = s.build_plan(granted(vec![(grant(seq(1), false, 5, 1), vec![])], vec![]));
    // No block added: the plan carries the table the sequence holds, not a copy of it.
    assert!(Arc::ptr_eq(&first.seqs[0].block_table, &second.seqs[0].block_table));
    assert!(Arc::ptr_eq(&second.seqs[0].block_table, &s.seq(seq(1)).unwrap().blocks));
    s.apply_output(&[seq(1)], &sampled(&[Some(8)]), &mut no_text);
    s.begin_step();
    let third = s.build_plan(granted(vec![(grant(seq(1), false, 6, 1), blocks(&[3]))], vec![]));
    assert_eq!(*third.seqs[0].block_table, *blocks(&[1, 2, 3]));
    // The plans already sent keep the table they were made with.
    assert_eq!(*first.seqs[0].block_table, *blocks(&[1, 2]));
}

#[test]
fn a_penalised_sequence_carries_its_token_counts_and_older_plans_keep_theirs() {
    let mut s = scheduler(4, false);
    let params = SamplingParams { frequency_penalty: 0.5, ..SamplingParams::greedy(8) };
    s.add(vec![NewSeq { params: Arc::new(params), ..new_seq(seq(1), 3, 8) }]).unwrap();
    // Without penalties there is nothing to count.
    s.add(vec![new_seq(seq(2), 3, 8)]).unwrap();
    assert!(s.seq(seq(2)).unwrap().history.is_none());
    s.begin_step();
    let first = s.build_plan(granted(vec![(grant(seq(1), true, 0, 3), blocks(&[1]))], vec![]));
    let counts = |plan: &routed_types::StepPlan| {
        let context = plan.seqs[0].context.as_ref().expect("penalties need the history");
        context.history.as_deref().cloned().expect("counts")
    };
    assert_eq!(counts(&first), TokenCounts::new(&[10, 11, 12], &[]));
    let mut plans = vec![first];
    for (step, token) in [11, 7, 7].into_iter().enumerate() {
        s.apply_output(&[seq(1)], &sampled(&[Some(token)]), &mut no_text);
        s.begin_step();
        let g = grant(seq(1), false, 3 + step, 1);
        plans.push(s.build_plan(granted(vec![(g, vec![])], vec![])));
    }
    let output = [11, 7, 7];
    for (i, plan) in plans.iter().enumerate() {
        // Each plan counts the tokens before its step, whatever was sampled after it was sent.
        assert_eq!(counts(plan), TokenCounts::new(&[10, 11, 12], &output[..i]), "plan {i}");
    }
    drop(plans);
    s.apply_output(&[seq(1)], &sampled(&[Some(12)]), &mut no_text);
    let history = s.seq(seq(1)).unwrap().history.as_deref().unwrap();
    assert_eq!(*history, TokenCounts::new(&[10, 11, 12], &[11, 7, 7, 12]));
}

#[test]
fn a_json_object_sequence_plans_the_mask_of_its_output_so_far() {
    use routed_scheduler::json_mode::JsonVocabulary;
    use routed_types::ResponseFormat;
    // Tokens 0..4 spell `{`, `}`, EOS (special), `"a"`, `:`; 5 is `x`, which no object starts with.
    let spellings = ["{", "}", "", "\"a\"", ":", "x"];
    let tokens: Vec<Option<Vec<u8>>> =
        spellings.iter().map(|s| (!s.is_empty()).then(|| s.as_bytes().to_vec())).collect();
    let params =
        SamplingParams { response_format: ResponseFormat::JsonObject, ..SamplingParams::greedy(8) };
    let constrained = NewSeq { params: Arc::new(params), ..new_seq(seq(1), 3, 8) };
    // Without the vocabulary's bytes there is nothing to constrain with.
    let mut plain = scheduler(4, false);
    assert_eq!(plain.add(vec![constrained.clone()]), Err(SchedulerError::NoVocabulary));
    assert!(plain.is_idle(), "a refused add queues nothing");
    let vocabulary = Arc::new(JsonVocabulary::new(&tokens, &[EOS]));
    let mut s = scheduler(4, false).with_json_vocabulary(vocabulary);
    s.add(vec![constrained, new_seq(seq(2), 3, 8)]).unwrap();
    s.begin_step();
    let admit = |id| (grant(id, true, 0, 3), blocks(&[id.0 as u32]));
    let mut plan = s.build_plan(granted(vec![admit(seq(1)), admit(seq(2))], vec![]));
    assert!(plan.seqs[1].context.is_none(), "an unconstrained sequence carries no mask");
    let allowed = |plan: &routed_types::StepPlan| -> Vec<TokenId> {
        let mask = plan.seqs[0].context.as_ref().and_then(|c| c.allowed.clone()).expect("a mask");
        (0..6).filter(|&t| mask.allows(t)).collect()
    };
    assert_eq!(allowed(&plan), [0], "an object starts with `{{`");
    // Each plan allows what may follow the tokens sampled before it: a key or `}`, then `:`, a
    // value (an object or a string), ... and EOS alone once the outer object has closed.
    let steps = [
        (0, vec![1, 3]),
        (3, vec![4]),
        (4, vec![0, 3]),
        (0, vec![1, 3]),
        (1, vec![1]),
        (1, vec![2]),
    ];
    for (token, next) in steps {
        s.apply_output(&[seq(1), seq(2)], &sampled(&[Some(token), Some(7)]), &mut no_text);
        s.begin_step();
        let computed = s.seq(seq(1)).unwrap().num_tokens() - 1;
        let decode = |id| (grant(id, false, computed, 1), vec![]);
        plan = s.build_plan(granted(vec![decode(seq(1)), decode(seq(2))], vec![]));
        assert_eq!(allowed(&plan), next, "after {:?}", s.seq(seq(1)).unwrap().output);
    }
}

#[test]
fn a_reasoning_models_json_waits_for_the_end_of_its_thinking() {
    use routed_scheduler::json_mode::JsonVocabulary;
    use routed_types::{ResponseFormat, ThinkingTags};
    // `{`, `}`, EOS, `"a"`, `:`, `x`, then the tags as single tokens.
    let spellings = ["{", "}", "", "\"a\"", ":", "x", "<think>", "</think>"];
    let tokens: Vec<Option<Vec<u8>>> =
        spellings.iter().map(|s| (!s.is_empty()).then(|| s.as_bytes().to_vec())).collect();
    let vocabulary = Arc::new(JsonVocabulary::new(&tokens, &[EOS]));
    let tags = ThinkingTags { start: 6, end: 7 };
    let params = Arc::new(SamplingParams {
        response_format: ResponseFormat::JsonObject,
        thinking_tags: Some(tags),
        ..SamplingParams::greedy(8)
    });
    // The prompt's last tag decides: none or an opening one, the model thinks first; a closing
    // one (a template that turned the thinking off), the answer is constrained from the start.
    let prompts: [(&[TokenId], bool); 4] =
        [(&[10, 11], false), (&[10, 6], false), (&[6, 7, 10], true), (&[6, 7, 10, 6], false)];
    for (prompt, constrained_at_once) in prompts {
        let mut s = scheduler(4, false).with_json_vocabulary(Arc::clone(&vocabulary));
        let new = NewSeq {
            params: Arc::clone(&params),
            prompt: Arc::new(prompt.to_vec()),
            ..new_seq(seq(1), 0, 8)
        };
        s.add(vec![new]).unwrap();
        s.begin_step();
        let n = prompt.len();
        let mut plan =
            s.build_plan(granted(vec![(grant(seq(1), true, 0, n), blocks(&[1]))], vec![]));
        let allowed = |plan: &routed_types::StepPlan| -> Option<Vec<TokenId>> {
            let context = plan.seqs[0].context.as_ref().expect("a constrained sequence's context");
            context.allowed.as_ref().map(|mask| (0..8).filter(|&t| mask.allows(t)).collect())
        };
        let first = if constrained_at_once { Some(vec![0]) } else { None };
        assert_eq!(allowed(&plan), first, "prompt {prompt:?}");
        // Thinking text is free; the end tag starts the object; then it is read as before.
        let expected = match constrained_at_once {
            true => vec![(0, Some(vec![1, 3])), (3, Some(vec![4]))],
            false => vec![(5, None), (6, None), (7, Some(vec![0])), (0, Some(vec![1, 3]))],
        };
        for (token, next) in expected {
            s.apply_output(&[seq(1)], &sampled(&[Some(token)]), &mut no_text);
            s.begin_step();
            let computed = s.seq(seq(1)).unwrap().num_tokens() - 1;
            plan = s.build_plan(granted(vec![(grant(seq(1), false, computed, 1), vec![])], vec![]));
            assert_eq!(allowed(&plan), next, "prompt {prompt:?}, after {token}");
        }
    }
}

#[test]
fn continuations_of_one_prompt_share_its_counts_until_they_sample() {
    let mut s = scheduler(4, false);
    let params = Arc::new(SamplingParams { repetition_penalty: 1.2, ..SamplingParams::greedy(8) });
    let prompt: Arc<Vec<TokenId>> = Arc::new(vec![10, 11, 10]);
    let (a, b) = (SeqId::new(RequestId(1), 0), SeqId::new(RequestId(1), 1));
    let new = |id| NewSeq { id, prompt: prompt.clone(), params: params.clone(), cache_salt: None };
    s.add(vec![new(a), new(b)]).unwrap();
    let counts = |s: &Scheduler, id| s.seq(id).unwrap().history.clone().unwrap();
    assert!(Arc::ptr_eq(&counts(&s, a), &counts(&s, b)), "built once for the request");
    s.begin_step();
    let grants = vec![(grant(a, true, 0, 3), blocks(&[1])), (grant(b, true, 0, 3), blocks(&[2]))];
    s.build_plan(granted(grants, vec![]));
    s.apply_output(&[a, b], &sampled(&[Some(7), Some(11)]), &mut no_text);
    assert_eq!(*counts(&s, a), TokenCounts::new(&prompt, &[7]));
    assert_eq!(*counts(&s, b), TokenCounts::new(&prompt, &[11]));
}

#[test]
fn an_intermediate_chunk_samples_nothing_and_its_commit_rides_on_the_next_step() {
    let mut s = scheduler(4, false);
    s.add(vec![new_seq(seq(1), 10, 4)]).unwrap();
    s.begin_step();
    let plan = s.build_plan(granted(vec![(grant(seq(1), true, 0, 3), blocks(&[1]))], vec![]));
    assert!(plan.seqs[0].sample.is_none());
    let events = s.apply_output(&[seq(1)], &sampled(&[None]), &mut no_text);
    assert!(events.is_empty());
    let next = s.begin_step();
    assert_eq!(next.commit.len(), 1, "publish after compute: the commit comes with the next step");
    assert_eq!(next.commit[0].grant_id, GrantId(1000 * seq(1).0));
    assert!(next.append.is_empty());
}

#[test]
fn sampled_tokens_are_streamed_then_fed_back_until_max_tokens() {
    let mut s = scheduler(4, false);
    s.add(vec![new_seq(seq(1), 5, 2)]).unwrap();
    s.begin_step();
    s.build_plan(granted(vec![(grant(seq(1), true, 0, 5), blocks(&[1, 2]))], vec![]));
    let events = s.apply_output(&[seq(1)], &sampled(&[Some(7)]), &mut no_text);
    assert!(
        matches!(&events[..], [SeqEvent::Token { id, sampled }] if *id == seq(1) && sampled.token == 7)
    );
    let step = s.begin_step();
    assert_eq!(step.append, [(seq(1), 7)], "the sampled token is appended before it is fed back");
    // Decode: position 5, a new block appended.
    let plan = s.build_plan(granted(vec![(grant(seq(1), false, 5, 1), blocks(&[3]))], vec![]));
    assert_eq!(*plan.seqs[0].token_ids, [7]);
    assert_eq!(*plan.seqs[0].block_table, *blocks(&[1, 2, 3]));
    assert_eq!(plan.seqs[0].sample.as_ref().map(|s| s.1), Some(1));
    let events = s.apply_output(&[seq(1)], &sampled(&[Some(8)]), &mut no_text);
    assert!(matches!(
        &events[..],
        [SeqEvent::Token { .. }, SeqEvent::Finished { reason: FinishReason::Length, .. }]
    ));
    assert_eq!(s.seq(seq(1)).unwrap().output, [7, 8]);
    assert_eq!(s.num_running(), 0);
    assert!(s.begin_step().append.is_empty(), "a finished sequence's last token is not fed back");
}

#[test]
fn eos_stops_a_sequence() {
    let mut s = scheduler(4, false);
    s.add(vec![new_seq(seq(1), 3, 10)]).unwrap();
    s.begin_step();
    s.build_plan(granted(vec![(grant(seq(1), true, 0, 3), blocks(&[1]))], vec![]));
    let events = s.apply_output(&[seq(1)], &sampled(&[Some(EOS)]), &mut no_text);
    assert!(matches!(
        events.last(),
        Some(SeqEvent::Finished { reason: FinishReason::Stop { .. }, .. })
    ));
}

/// An abort can arrive while the cache manager grants the step its sequence was a candidate of:
/// the sequence stops where it is and must not run in that step (its live state is free again,
/// and its final output is already on its way without the step's token).
#[test]
fn a_sequence_aborted_while_its_step_is_granted_is_left_out_of_the_plan() {
    let mut s = scheduler(4, true);
    s.add(vec![new_seq(seq(1), 3, 10), new_seq(seq(2), 3, 10)]).unwrap();
    s.begin_step();
    let first =
        vec![(grant(seq(1), true, 0, 3), blocks(&[1])), (grant(seq(2), true, 0, 3), blocks(&[2]))];
    s.build_plan(granted(first, vec![]));
    s.apply_output(&[seq(1), seq(2)], &sampled(&[Some(5), Some(6)]), &mut no_text);
    s.begin_step();
    // The abort lands between the step's candidates and its grants.
    assert!(s.stop_keeping_blocks(seq(1)));
    let plan = s.build_plan(granted(
        vec![(grant(seq(1), false, 3, 1), blocks(&[3])), (grant(seq(2), false, 3, 1), vec![])],
        vec![],
    ));
    let planned: Vec<SeqId> = plan.seqs.iter().map(|p| p.seq_id).collect();
    assert_eq!(planned, [seq(2)], "only the running sequence computes");
    let aborted = s.seq(seq(1)).unwrap();
    assert_eq!((aborted.num_computed_tokens, &aborted.output[..]), (3, &[5][..]));
    assert_eq!(aborted.status, SeqStatus::Finishing);
}

#[test]
fn a_finished_sequence_keeps_its_blocks_until_its_rows_are_read() {
    let mut s = scheduler(4, false);
    s.add(vec![new_seq(seq(1), 3, 1)]).unwrap();
    s.begin_step();
    s.build_plan(granted(vec![(grant(seq(1), true, 0, 3), blocks(&[1]))], vec![]));
    s.apply_output(&[seq(1)], &sampled(&[Some(5)]), &mut no_text);
    assert_eq!(s.seq(seq(1)).unwrap().status, SeqStatus::Finishing);
    assert!(s.begin_step().free.is_empty(), "rows not read yet: blocks kept");
    s.release(seq(1));
    assert_eq!(s.begin_step().free, [seq(1)]);
    assert!(s.seq(seq(1)).is_none());
}

/// A hybrid scheduler with three 4-token requests, the first two admitted into a step.
fn two_of_three_running() -> Scheduler {
    let mut s = scheduler(4, true);
    for r in 1..=3 {
        s.add(vec![new_seq(seq(r), 4, 4)]).unwrap();
    }
    s.begin_step();
    s.build_plan(granted(
        vec![(grant(seq(1), true, 0, 4), blocks(&[1])), (grant(seq(2), true, 0, 4), blocks(&[2]))],
        vec![],
    ));
    s
}

#[test]
fn preempted_sequences_lose_their_blocks_and_go_back_to_the_head_of_the_queue() {
    let mut s = two_of_three_running();
    assert_eq!(s.num_live_states_held(), 2, "a hybrid sequence holds a live state while running");
    s.apply_output(&[seq(1), seq(2)], &sampled(&[Some(5), Some(6)]), &mut no_text);
    s.begin_step();
    // The cache manager preempts sequence 2 to let sequence 1 decode.
    let plan = s.build_plan(granted(vec![(grant(seq(1), false, 4, 1), vec![])], vec![seq(2)]));
    assert_eq!(plan.seqs.len(), 1);
    let two = s.seq(seq(2)).unwrap();
    assert_eq!(two.status, SeqStatus::Waiting);
    assert!(two.blocks.is_empty() && two.num_computed_tokens == 0 && two.live_state.is_none());
    assert_eq!(two.output, [6], "generated tokens are kept and recomputed");
    assert_eq!(s.num_live_states_held(), 1);
    s.apply_output(&[seq(1)], &sampled(&[Some(9)]), &mut no_text);
    let ids: Vec<_> = s.begin_step().candidates.iter().map(|c| c.seq_id).collect();
    assert_eq!(ids, [seq(1), seq(2), seq(3)], "the preempted one is first among the waiting");
}

#[test]
fn retracted_sequences_release_their_blocks_in_the_next_round_trip_and_wait_in_order() {
    let mut s = two_of_three_running();
    s.apply_output(&[seq(1), seq(2)], &sampled(&[Some(5), Some(6)]), &mut no_text);
    assert_eq!(s.retract_running(), 2);
    assert_eq!((s.num_running(), s.num_live_states_held()), (0, 0));
    for r in [1, 2] {
        let one = s.seq(seq(r)).unwrap();
        assert_eq!(one.status, SeqStatus::Waiting);
        assert!(one.blocks.is_empty() && one.num_computed_tokens == 0);
        assert_eq!(one.output.len(), 1, "the sampled token is kept and fed back on resumption");
    }
    assert!(s.has_messages());
    // The round trip that plans nothing: the commits publish first, then the blocks go.
    let step = s.begin_housekeeping();
    assert!(step.candidates.is_empty());
    assert_eq!(step.commit.len(), 2);
    assert_eq!(step.preempt, [seq(1), seq(2)]);
    assert_eq!(step.append.len(), 2, "the sampled tokens still reach the cache manager");
    assert!(!s.has_messages());
    let ids: Vec<_> = s.begin_step().candidates.iter().map(|c| c.seq_id).collect();
    assert_eq!(ids, [seq(1), seq(2), seq(3)], "resumed oldest first, before the new ones");
    // Aborting a retracted sequence before the round trip frees it instead.
    s.begin_step();
    s.build_plan(granted(vec![(grant(seq(1), true, 0, 5), blocks(&[1, 3]))], vec![]));
    s.apply_output(&[seq(1)], &sampled(&[Some(7)]), &mut no_text);
    s.retract_running();
    s.abort(seq(1));
    let step = s.begin_housekeeping();
    assert!(step.preempt.is_empty());
    assert_eq!(step.free, [seq(1)]);
}

#[test]
fn aborting_a_sequence_the_cache_never_heard_of_frees_nothing_there() {
    let mut s = scheduler(4, false);
    s.add(vec![new_seq(seq(1), 3, 4)]).unwrap();
    assert!(s.abort(seq(1)).is_some());
    let step = s.begin_step();
    assert!(step.add.is_empty() && step.free.is_empty() && step.candidates.is_empty());
    // Once the cache knows it, an abort frees its blocks there.
    s.add(vec![new_seq(seq(2), 3, 4)]).unwrap();
    s.begin_step();
    s.abort(seq(2));
    assert_eq!(s.begin_step().free, [seq(2)]);
    assert!(s.is_idle());
}

#[test]
fn a_full_waiting_queue_refuses_whole_requests() {
    let mut s = scheduler(4, false);
    let request = |r: u64, n: usize| {
        (0..n).map(|i| new_seq(SeqId::new(RequestId(r), i), 3, 4)).collect::<Vec<_>>()
    };
    s.add(request(1, 3)).unwrap();
    assert_eq!(s.add(request(2, 2)), Err(SchedulerError::Overloaded(3)));
    assert_eq!(s.num_waiting(), 3, "none of the refused request's sequences were queued");
    s.add(request(3, 1)).unwrap();
}

#[test]
fn deferred_candidates_stay_where_they_are() {
    let mut s = scheduler(4, false);
    s.add(vec![new_seq(seq(1), 3, 4)]).unwrap();
    s.begin_step();
    let mut nothing = granted(vec![], vec![]);
    nothing.allocation.deferred =
        vec![Deferral { seq_id: seq(1), reason: DeferReason::NoFreeBlocks }];
    let plan = s.build_plan(nothing);
    assert!(plan.seqs.is_empty());
    assert_eq!((s.num_waiting(), s.num_running()), (1, 0));
}
