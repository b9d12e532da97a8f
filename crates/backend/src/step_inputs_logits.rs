//! Where a step's logits rows go: the device groups (greedy, seeded, scored prompt positions) and
//! the host's, the sampled rows' parameters and logit edits, the scored rows' targets. Part of
//! [`StepPacker`]'s packing.

use super::{
    GREEDY, HOST, LogitUse, PackedStep, SAMPLE_PARAMS_WORDS, SAMPLED, SCORED, ScoreUse, StepPacker,
    put,
};
use crate::logit_edits::LOGIT_EDIT_WORDS;
use routed_types::{MAX_LOGPROBS, SamplingParams, ScheduledSeq, StepPlan};

impl StepPacker {
    /// The rows of sequence `i` (its tokens from token row `t0`) that score prompt positions:
    /// row `r` of a chunk starting at position `p0` predicts prompt token `p0 + r + 1`, as far as
    /// the prompt goes (the CPU worker's prompt logprobs).
    pub(super) fn score(&mut self, i: usize, s: &ScheduledSeq, t0: usize) {
        let (Some(n), Some(context)) = (s.prompt_logprobs, &s.context) else { return };
        let first_position = s.num_computed_tokens + 1;
        let targets = context.prompt.get(first_position..).unwrap_or_default();
        let len = s.token_ids.len().min(targets.len());
        let first = self.rows[SCORED].len();
        self.rows[SCORED].extend(t0..t0 + len);
        self.targets.extend_from_slice(&targets[..len]);
        let num_top = n as usize;
        self.scores.push(ScoreUse { seq: i, first, len, first_position, num_top });
    }

    /// Which group a sequence's sampled row goes to, and whether every row of its chunk goes
    /// there (prompt logprobs on the host). A device row's logit edits join its group's list; a
    /// row whose edits do not fit the step's list (or cannot be edits) is finished on the host.
    pub(super) fn logit_kind(&mut self, s: &ScheduledSeq) -> Option<(usize, bool)> {
        if scores_on_host(self.host_only, s) {
            return Some((HOST, true));
        }
        let (params, _) = s.sample.as_ref()?;
        if self.host_only || !on_device(params) {
            return Some((HOST, false));
        }
        let kind = if params.is_greedy() { GREEDY } else { SAMPLED };
        let used: usize = self.edits.iter().map(Vec::len).sum();
        let list = &mut self.edits[kind];
        let before = list.len();
        let vocab = self.geometry.vocab_size;
        let built = self.builder.build(params, s.context.as_ref(), vocab, list);
        if !built || used + (list.len() - before) > self.layout.capacity.max_logit_edits {
            list.truncate(before);
            return Some((HOST, false));
        }
        self.edit_counts[kind].push(list.len() - before);
        Some((kind, false))
    }

    /// The logits gather pairs, greedy then sampled then scored then host rows, the sampled
    /// rows' parameters and the scored rows' targets; scored and host uses are shifted past the
    /// rows before them.
    pub(super) fn pack_logits(&mut self, plan: &StepPlan, p: &mut PackedStep, words: &mut [u32]) {
        let l = &self.layout;
        let chunk = self.geometry.logits_chunk_rows.max(1);
        [p.num_greedy, p.num_sampled, p.num_scored, p.num_host_rows] =
            self.rows.each_ref().map(Vec::len);
        let device_rows = p.num_greedy + p.num_sampled;
        for score in &mut self.scores {
            score.first += device_rows;
            p.num_score_top = p.num_score_top.max(score.num_top);
        }
        let targets = &mut words[l.score_targets.offset..][..self.targets.len()];
        targets.copy_from_slice(&self.targets);
        let all = self.rows.iter().flatten();
        for (r, &token_row) in all.enumerate() {
            put(words, l.logit_rows.offset + 2 * r, token_row);
            put(words, l.logit_rows.offset + 2 * r + 1, r % chunk);
        }
        for (s, used) in plan.seqs.iter().zip(&mut self.uses) {
            if let (LogitUse::Greedy { .. } | LogitUse::Sampled { .. }, Some((params, _))) =
                (&*used, &s.sample)
                && let Some(n) = params.logprobs
            {
                p.wants_ranks = true;
                p.num_top_logprobs = p.num_top_logprobs.max(n as usize);
            }
            match used {
                LogitUse::Sampled { row } => {
                    let (params, index) = s.sample.as_ref().expect("sampled rows sample");
                    let at = l.sample_params.offset + SAMPLE_PARAMS_WORDS * *row;
                    sample_params(params, *index, &mut words[at..at + SAMPLE_PARAMS_WORDS]);
                }
                LogitUse::Host { first, .. } => *first += device_rows + p.num_scored,
                _ => {}
            }
        }
        // Edits of the greedy rows, then of the seeded rows: the device rows' order.
        let (mut row, mut at) = (0, 0);
        for &n in self.edit_counts.iter().flatten() {
            put(words, l.edit_starts.offset + row, at);
            (row, at) = (row + 1, at + n);
        }
        put(words, l.edit_starts.offset + row, at);
        for (e, edit) in self.edits.iter().flatten().enumerate() {
            let w = l.logit_edits.offset + e * LOGIT_EDIT_WORDS;
            edit.write(&mut words[w..w + LOGIT_EDIT_WORDS]);
        }
        p.num_logit_edits = at;
    }
}

/// Whether the device kernels may pick the token and report its logprobs (the rank and up to
/// [`MAX_LOGPROBS`] alternatives included); the bias and penalties go as logit edits when they
/// fit the step's list. A constrained output's row is chosen on the host, where its mask (most of
/// the vocabulary ruled out, in most states) applies as it does on the CPU, and so are the rows
/// of a request that names tokens for their logprobs and of one with bad words (whose bans
/// depend on the output's last tokens).
pub fn on_device(params: &SamplingParams) -> bool {
    params.logprobs.is_none_or(|n| n <= MAX_LOGPROBS && params.logprob_token_ids.is_empty())
        && !params.is_constrained()
        && params.bad_words.is_empty()
}

/// Whether a chunk's prompt positions are scored on the host: every one of them when the packer
/// finishes everything there, else those of a request that names tokens for their logprobs
/// (which the device kernels do not gather).
pub(super) fn scores_on_host(host_only: bool, s: &ScheduledSeq) -> bool {
    s.prompt_logprobs.is_some()
        && (host_only || s.context.as_ref().is_some_and(|c| !c.logprob_token_ids.is_empty()))
}

/// The kernels' `SampleParams`: seed and index (u64, little-endian words), temperature, top-p,
/// top-k (0 keeps all), min-p (0 keeps all).
fn sample_params(params: &SamplingParams, index: u64, out: &mut [u32]) {
    out[0] = params.seed as u32;
    out[1] = (params.seed >> 32) as u32;
    out[2] = index as u32;
    out[3] = (index >> 32) as u32;
    out[4] = params.temperature.to_bits();
    out[5] = params.top_p.to_bits();
    // The CPU sampler keeps at least one candidate; the kernel reads 0 as "keep all".
    out[6] = params.top_k.map_or(0, |k| k.max(1));
    out[7] = params.min_p.to_bits();
}
