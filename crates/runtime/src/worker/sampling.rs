//! Sampling and prompt logprobs on the host, from rows of logits: what the CPU worker does for
//! every row, and the CUDA worker for the rows the device kernels do not finish (every row with
//! device sampling off).

use rayon::prelude::*;
use routed_model::Sampler;
use routed_types::{PromptLogprobs, SampledToken, ScheduledSeq, StepPlan};
use std::{cell::RefCell, ops::Range};

thread_local! {
    /// Each pool thread's sampling scratch (a vocabulary's worth of weights and indices), kept
    /// across steps so that no step allocates it again.
    static POOL_SAMPLER: RefCell<Sampler> = RefCell::new(Sampler::default());
}

/// Samples every sequence that asked for a token and whose logits were computed, from its last
/// row.
pub(super) fn sample(
    plan: &StepPlan,
    logits: &[f32],
    logits_rows: &[Range<usize>],
    vocab: usize,
    sampler: &mut Sampler,
) -> Vec<Option<SampledToken>> {
    let one = |sampler: &mut Sampler, (s, rows): (&ScheduledSeq, &Range<usize>)| {
        let (params, index) = s.sample.as_ref()?;
        let last = rows.end.checked_sub(1).filter(|_| !rows.is_empty())?;
        let row = &logits[last * vocab..rows.end * vocab];
        Some(sampler.sample(row, params, *index, s.context.as_ref()))
    };
    // A row's sample depends on its own logits, seed and index only: any thread will do.
    if logits_rows.iter().filter(|r| !r.is_empty()).count() > 1 {
        (plan.seqs.par_iter().zip(logits_rows))
            .map(|x| POOL_SAMPLER.with_borrow_mut(|sampler| one(sampler, x)))
            .collect()
    } else {
        plan.seqs.iter().zip(logits_rows).map(|x| one(sampler, x)).collect()
    }
}

/// The prompt logprobs of every chunk that asked for them and has rows here: row `r` of a chunk
/// starting at position `p0` predicts prompt token `p0 + r + 1`. Rows are scored in parallel,
/// each on its own.
pub(super) fn prompt_logprobs(
    plan: &StepPlan,
    logits: &[f32],
    logits_rows: &[Range<usize>],
    vocab: usize,
) -> Vec<PromptLogprobs> {
    let mut chunks = Vec::new();
    for (seq_index, (s, rows)) in plan.seqs.iter().zip(logits_rows).enumerate() {
        let (Some(n), Some(context)) = (s.prompt_logprobs, &s.context) else { continue };
        if rows.is_empty() {
            // Scored elsewhere (on the device).
            continue;
        }
        let ids = &context.logprob_token_ids;
        let prompt = &context.prompt;
        let first_position = s.num_computed_tokens + 1;
        let num_targets = rows.len().min(prompt.len().saturating_sub(first_position));
        let entries = (0..num_targets)
            .into_par_iter()
            .map(|r| {
                let row = &logits[(rows.start + r) * vocab..(rows.start + r + 1) * vocab];
                let target = prompt[first_position + r];
                POOL_SAMPLER.with_borrow_mut(|sampler| sampler.score(row, target, n, ids))
            })
            .collect();
        chunks.push(PromptLogprobs { seq_index, first_position, entries });
    }
    chunks
}
