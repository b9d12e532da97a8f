//! The scheduler proper: queues, the per-step exchange with the cache manager, and applying a
//! step's output.

use crate::{
    CacheStep, GrantedStep, NewSeq, SchedulerError, Seq, SeqStatus, check_stop,
    json_mode::{JsonConstraint, JsonMasks, JsonVocabulary},
};
use routed_cache::{CacheRequest, CommitEntry, SlotRequest};
use routed_types::{
    BlockRef, FinishReason, SampledToken, ScheduledSeq, SeqContext, SeqId, StepId, StepOutput,
    StepPlan, TokenCounts, TokenId,
};
use std::{
    collections::{HashMap, VecDeque},
    sync::Arc,
};

/// Limits and model facts the policy needs.
#[derive(Clone, Debug)]
pub struct SchedulerConfig {
    /// Most tokens computed in one step.
    pub max_num_batched_tokens: usize,
    /// Most sequences running at once (also the number of live state slots).
    pub max_num_seqs: usize,
    /// Most sequences waiting before `add` refuses.
    pub max_waiting_requests: usize,
    /// Longest prompt + output.
    pub max_model_len: usize,
    /// Whether sequences need a live Mamba state slot.
    pub hybrid: bool,
    /// Tokens that end generation unless a request ignores EOS.
    pub eos_token_ids: Vec<TokenId>,
    /// Whether steps hand their routing to the copy worker.
    pub capture_routing: bool,
}

/// What happened to a sequence in a step.
#[derive(Clone, Debug, PartialEq)]
pub enum SeqEvent {
    /// A token was sampled.
    Token {
        /// The sequence.
        id: SeqId,
        /// The token and its logprobs.
        sampled: SampledToken,
    },
    /// The sequence stopped; its routing must be read before [`Scheduler::release`].
    Finished {
        /// The sequence.
        id: SeqId,
        /// Why it stopped.
        reason: FinishReason,
        /// Where a matched stop string cuts the decoded text, in bytes.
        text_len: Option<usize>,
    },
}

/// The request lifecycle and the step policy.
pub struct Scheduler {
    config: SchedulerConfig,
    seqs: HashMap<SeqId, Seq>,
    waiting: VecDeque<SeqId>,
    running: Vec<SeqId>,
    free_live_states: Vec<u32>,
    next_step: u64,
    outbox: CacheStep,
    /// Commit entries of the step in flight, aligned with its plan.
    in_flight: Vec<CommitEntry>,
    /// The masks of `json_object` outputs, when the vocabulary's bytes were given.
    json: Option<JsonMasks>,
    /// The bans of a sequence's bad words, built here and kept by the sequence only when they
    /// changed, so that a decode step allocates nothing per sequence.
    banned: Vec<TokenId>,
}

impl Scheduler {
    /// An empty scheduler.
    pub fn new(config: SchedulerConfig) -> Self {
        let free_live_states = (0..config.max_num_seqs as u32).rev().collect();
        Self {
            config,
            seqs: HashMap::new(),
            waiting: VecDeque::new(),
            running: Vec::new(),
            free_live_states,
            next_step: 0,
            outbox: CacheStep::default(),
            in_flight: Vec::new(),
            json: None,
            banned: Vec::new(),
        }
    }

    /// Lets requests constrain their output (`response_format: json_object`) over `vocabulary`;
    /// without it such a request is refused.
    pub fn with_json_vocabulary(mut self, vocabulary: Arc<JsonVocabulary>) -> Self {
        self.json = Some(JsonMasks::new(vocabulary));
        self
    }

    /// The configuration.
    pub fn config(&self) -> &SchedulerConfig {
        &self.config
    }

    /// Sequences waiting for admission.
    pub fn num_waiting(&self) -> usize {
        self.waiting.len()
    }

    /// Sequences running.
    pub fn num_running(&self) -> usize {
        self.running.len()
    }

    /// The running sequences, oldest admission first.
    pub fn running(&self) -> &[SeqId] {
        &self.running
    }

    /// Live state slots held by sequences.
    pub fn num_live_states_held(&self) -> usize {
        if self.config.hybrid { self.config.max_num_seqs - self.free_live_states.len() } else { 0 }
    }

    /// Nothing running and nothing waiting (sequences still finishing don't count).
    pub fn is_idle(&self) -> bool {
        self.waiting.is_empty() && self.running.is_empty()
    }

    /// Whether a step would do anything: candidates to schedule or messages for the cache.
    pub fn has_work(&self) -> bool {
        !self.is_idle() || self.has_messages()
    }

    /// Whether the cache manager has something to hear (commits, frees, retractions...) even
    /// when no step is planned.
    pub fn has_messages(&self) -> bool {
        let o = &self.outbox;
        !(o.commit.is_empty()
            && o.free.is_empty()
            && o.preempt.is_empty()
            && o.add.is_empty()
            && o.append.is_empty())
    }

    /// A tracked sequence.
    pub fn seq(&self, id: SeqId) -> Option<&Seq> {
        self.seqs.get(&id)
    }

    /// Queues sequences (all continuations of one request at once, or none).
    pub fn add(&mut self, new: Vec<NewSeq>) -> Result<(), SchedulerError> {
        if self.waiting.len() + new.len() > self.config.max_waiting_requests {
            return Err(SchedulerError::Overloaded(self.waiting.len()));
        }
        if let Some(dup) = new.iter().find(|s| self.seqs.contains_key(&s.id)) {
            return Err(SchedulerError::Duplicate(dup.id));
        }
        if self.json.is_none() && new.iter().any(|s| s.params.is_constrained()) {
            return Err(SchedulerError::NoVocabulary);
        }
        // A request's continuations share its prompt, and so their counts until they sample.
        let mut shared: Option<(Arc<Vec<TokenId>>, Arc<TokenCounts>)> = None;
        for mut s in new {
            self.outbox.add.push(CacheRequest {
                seq_id: s.id,
                prompt_token_ids: s.prompt.to_vec(),
                cache_salt: s.cache_salt.take(),
                // Prompt logprobs need every prompt position computed.
                skip_reading_prefix_cache: s.params.prompt_logprobs.is_some(),
            });
            self.waiting.push_back(s.id);
            let history = s.params.needs_history().then(|| match &shared {
                Some((prompt, counts)) if Arc::ptr_eq(prompt, &s.prompt) => counts.clone(),
                _ => {
                    let counts = Arc::new(TokenCounts::new(&s.prompt, &[]));
                    shared = Some((s.prompt.clone(), counts.clone()));
                    counts
                }
            });
            let mut seq = Seq::waiting(s, history);
            if let Some(masks) = self.json.as_mut() {
                let (format, thinking) = (&seq.params.response_format, seq.params.thinking_tags);
                seq.json = JsonConstraint::start(masks, format, &seq.prompt, thinking);
            }
            self.seqs.insert(seq.id, seq);
        }
        Ok(())
    }

    /// Drops a sequence wherever it is and releases what it holds. Returns it, if it existed.
    pub fn abort(&mut self, id: SeqId) -> Option<Seq> {
        let mut seq = self.seqs.remove(&id)?;
        self.waiting.retain(|&w| w != id);
        self.running.retain(|&r| r != id);
        if let Some(slot) = seq.live_state.take() {
            self.free_live_states.push(slot);
        }
        let before = self.outbox.add.len();
        self.outbox.add.retain(|a| a.seq_id != id);
        self.outbox.append.retain(|a| a.0 != id);
        self.outbox.commit.retain(|c| c.seq_id != id);
        self.outbox.preempt.retain(|&p| p != id);
        if self.outbox.add.len() == before {
            // The cache manager knows it: release its blocks there.
            self.outbox.free.push(id);
        }
        Some(seq)
    }

    /// Stops a running sequence where it is (an abort) but keeps its blocks, so the routing rows
    /// of the tokens it computed can still be read: it becomes `Finishing` until
    /// [`Scheduler::release`]. Returns `false`, changing nothing, for a sequence that holds no
    /// blocks (waiting, never admitted or preempted) or is not tracked.
    pub fn stop_keeping_blocks(&mut self, id: SeqId) -> bool {
        let Some(seq) = self.seqs.get_mut(&id) else { return false };
        if seq.status != SeqStatus::Running || seq.blocks.is_empty() {
            return false;
        }
        seq.status = SeqStatus::Finishing;
        if let Some(slot) = seq.live_state.take() {
            self.free_live_states.push(slot);
        }
        self.running.retain(|&r| r != id);
        // Its sampled token, if any, is never fed back.
        self.outbox.append.retain(|a| a.0 != id);
        true
    }

    /// Frees a finished sequence's blocks once its routing rows have been read.
    pub fn release(&mut self, id: SeqId) {
        if self.seqs.get(&id).is_some_and(|s| s.status == SeqStatus::Finishing) {
            self.seqs.remove(&id);
            self.outbox.free.push(id);
        }
    }

    /// Starts a step: everything the cache manager must hear plus the candidates.
    pub fn begin_step(&mut self) -> CacheStep {
        let mut step = std::mem::take(&mut self.outbox);
        let room = self.config.max_num_seqs.saturating_sub(self.running.len());
        // Sized once: grown by pushes it would reallocate a few times a step, more the larger
        // the batch.
        step.candidates.reserve_exact(self.running.len() + room.min(self.waiting.len()));
        step.candidates.extend(self.running.iter().map(|&id| SlotRequest::new(id)));
        step.candidates.extend(self.waiting.iter().take(room).map(|&id| SlotRequest::new(id)));
        step.token_budget = self.config.max_num_batched_tokens;
        step
    }

    /// What the cache manager must hear, without candidates: a round trip that plans nothing
    /// (generation paused), so finished sequences still free their blocks and retracted ones
    /// release theirs.
    pub fn begin_housekeeping(&mut self) -> CacheStep {
        std::mem::take(&mut self.outbox)
    }

    /// Retracts every running sequence (generation paused): each goes back to the head of the
    /// waiting queue, oldest first, keeping its tokens, and the next round trip releases its
    /// blocks (publishing what it computed first, so its re-admission hits them). Returns how
    /// many were running. Must not be called while a step is in flight.
    pub fn retract_running(&mut self) -> usize {
        let running = std::mem::take(&mut self.running);
        for &id in running.iter().rev() {
            self.preempted(id);
        }
        self.outbox.preempt.extend_from_slice(&running);
        running.len()
    }

    /// Turns the cache manager's grants into the runner's plan, admitting and preempting as they
    /// say.
    pub fn build_plan(&mut self, granted: GrantedStep) -> StepPlan {
        for &id in &granted.allocation.preempted {
            self.preempted(id);
        }
        let step_id = StepId(self.next_step);
        self.next_step += 1;
        let seqs = Vec::with_capacity(granted.allocation.grants.len());
        let mut plan = StepPlan { step_id, seqs, capture_routing: self.config.capture_routing };
        self.in_flight.clear();
        for (grant, table) in granted.allocation.grants.iter().zip(granted.tables) {
            if grant.is_admission {
                self.admit(grant.seq_id, table, grant.num_cached_tokens);
            } else if let Some(seq) = self.seqs.get_mut(&grant.seq_id)
                && !grant.new_blocks.is_empty()
            {
                // A new table once a block is added, every `block_size` tokens of a decode.
                seq.blocks = seq.blocks.iter().chain(&grant.new_blocks).copied().collect();
            }
            let Some(seq) = self.seqs.get_mut(&grant.seq_id) else { continue };
            if seq.status != SeqStatus::Running {
                // Aborted while the cache manager was granting it (its live state is gone and its
                // final output already lists its tokens): it computes nothing more; the blocks
                // granted go back with the rest when its rows have been read.
                continue;
            }
            seq.num_computed_tokens = grant.end();
            seq.ever_computed = true;
            let sample = (grant.end() == seq.num_tokens())
                .then(|| (seq.params.clone(), seq.output.len() as u64));
            // A chunk predicts prompt tokens while it has a position before the prompt's last.
            let prompt_logprobs = seq
                .params
                .prompt_logprobs
                .filter(|_| grant.num_computed_tokens + 1 < seq.prompt.len());
            let bans = !seq.params.bad_words.is_empty();
            if bans && sample.is_some() {
                seq.params.banned_after(&seq.output, &mut self.banned);
                if seq.banned[..] != self.banned[..] {
                    seq.banned = Arc::from(&self.banned[..]);
                }
            }
            let context = (seq.params.needs_history()
                || prompt_logprobs.is_some()
                || seq.json.is_some()
                || bans)
                .then(|| SeqContext {
                    prompt: seq.prompt.clone(),
                    history: seq.history.clone(),
                    allowed: seq.json.as_ref().and_then(JsonConstraint::allowed).cloned(),
                    // A chunk that samples nothing bans nothing.
                    banned: if sample.is_some() { seq.banned.clone() } else { Arc::default() },
                    logprob_token_ids: Arc::clone(&seq.params.logprob_token_ids),
                });
            plan.seqs.push(ScheduledSeq {
                seq_id: seq.id,
                token_ids: seq.tokens(grant.num_computed_tokens..grant.end()),
                num_computed_tokens: grant.num_computed_tokens,
                num_prompt_tokens: seq.prompt.len(),
                block_table: Arc::clone(&seq.blocks),
                live_state: seq.live_state,
                restore_from: grant.restore_from,
                snapshots: grant.snapshots.iter().map(|s| (s.position, s.slot)).collect(),
                sample,
                context,
                prompt_logprobs,
            });
            self.in_flight.push(grant.commit_entry());
        }
        plan
    }

    fn admit(&mut self, id: SeqId, table: Vec<BlockRef>, num_cached_tokens: usize) {
        let Some(seq) = self.seqs.get_mut(&id) else { return };
        seq.status = SeqStatus::Running;
        seq.blocks = table.into();
        seq.num_cached_tokens = num_cached_tokens;
        if self.config.hybrid {
            seq.live_state =
                Some(self.free_live_states.pop().expect("a live state per running sequence"));
        }
        self.waiting.retain(|&w| w != id);
        self.running.push(id);
    }

    fn preempted(&mut self, id: SeqId) {
        let Some(seq) = self.seqs.get_mut(&id) else { return };
        seq.status = SeqStatus::Waiting;
        seq.blocks = Arc::from([]);
        seq.num_computed_tokens = 0;
        if let Some(slot) = seq.live_state.take() {
            self.free_live_states.push(slot);
        }
        self.running.retain(|&r| r != id);
        // A preempted sequence goes back to the head of the queue: it was admitted first.
        self.waiting.push_front(id);
    }

    /// Applies a step's output (`ids`: the plan's sequences, in plan order): appends sampled
    /// tokens, checks stop conditions, queues the commits. `text` decodes tokens for stop strings
    /// (skipping special tokens or not).
    pub fn apply_output(
        &mut self,
        ids: &[SeqId],
        output: &StepOutput,
        text: &mut dyn FnMut(&[TokenId], bool) -> String,
    ) -> Vec<SeqEvent> {
        let mut events = Vec::with_capacity(ids.len());
        self.outbox.commit.reserve(ids.len());
        self.outbox.append.reserve(ids.len());
        for chunk in &output.prompt_logprobs {
            let Some(seq) = ids.get(chunk.seq_index).and_then(|id| self.seqs.get_mut(id)) else {
                continue;
            };
            // A chunk recomputed after preemption repeats positions already recorded.
            let skip = (seq.prompt_logprobs.len() + 1).saturating_sub(chunk.first_position);
            if chunk.first_position <= seq.prompt_logprobs.len() + 1 {
                seq.prompt_logprobs.extend(chunk.entries.iter().skip(skip).cloned());
            }
        }
        // Taken and put back empty, so the next plan's entries reuse its buffer.
        let mut in_flight = std::mem::take(&mut self.in_flight);
        for ((&id, sampled), commit) in ids.iter().zip(&output.sampled).zip(in_flight.drain(..)) {
            let Some(seq) = self.seqs.get_mut(&id) else { continue };
            self.outbox.commit.push(commit);
            let Some(sampled) = sampled else { continue };
            seq.output.push(sampled.token);
            if let Some(history) = &mut seq.history {
                // In place once the last plan that shared it is gone.
                Arc::make_mut(history).push_output(sampled.token);
            }
            if let (Some(json), Some(masks)) = (&mut seq.json, &mut self.json) {
                json.advance(sampled.token, masks);
            }
            events.push(SeqEvent::Token { id, sampled: sampled.clone() });
            let stop = check_stop(
                &seq.output,
                &seq.params,
                &self.config.eos_token_ids,
                seq.num_tokens(),
                self.config.max_model_len,
                text,
            );
            match stop {
                Some((reason, text_len)) => {
                    seq.status = SeqStatus::Finishing;
                    if let Some(slot) = seq.live_state.take() {
                        self.free_live_states.push(slot);
                    }
                    self.running.retain(|&r| r != id);
                    events.push(SeqEvent::Finished { id, reason, text_len });
                }
                None => self.outbox.append.push((id, sampled.token)),
            }
        }
        self.in_flight = in_flight;
        events
    }
}
