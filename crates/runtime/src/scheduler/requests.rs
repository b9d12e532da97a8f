//! A request's life in the scheduler actor: submission, streaming tokens, finishing (reading the
//! routing first), aborting and failing.

use super::{Group, SchedulerActor};
use crate::{
    EngineError, FinalOutput, RequestEvent, TokenEvent, WeightVersions,
    cache_manager::ResetPrefixCache,
    outbox::FinalText,
    routing_cache::{FreeBlocks, Reconstruct},
    scheduler::Submit,
    validate::validate,
};
use actix::{ActorFutureExt, AsyncContext, Context, WrapFuture};
use routed_scheduler::{NewSeq, SeqEvent, SeqStatus};
use routed_types::{FinishReason, RequestId, SamplingParams, SeqId, StepOutput};
use std::sync::Arc;

impl SchedulerActor {
    pub(super) fn submit(
        &mut self,
        msg: Submit,
        ctx: &mut Context<Self>,
    ) -> Result<RequestId, EngineError> {
        if self.shutting_down {
            return Err(EngineError::ShutDown);
        }
        if let Some(reason) = &self.unhealthy {
            return Err(EngineError::Unhealthy(reason.clone()));
        }
        let r = msg.request;
        validate(&r, &self.info)?;
        let request = RequestId(self.next_request);
        self.next_request += 1;
        let prompt = Arc::new(r.prompt_token_ids);
        let seqs: Vec<NewSeq> = (0..r.n)
            .map(|i| NewSeq {
                id: SeqId::new(request, i),
                prompt: prompt.clone(),
                params: Arc::new(SamplingParams {
                    seed: r.sampling.seed.wrapping_add(i as u64),
                    ..r.sampling.clone()
                }),
                cache_salt: r.cache_salt.clone(),
            })
            .collect();
        if self.holds_new_requests() {
            // Held until the new weights serve and generation continues; counted against the
            // waiting queue meanwhile.
            let waiting = self.policy.num_waiting() + self.updates.num_held_seqs();
            if waiting + seqs.len() > self.policy.config().max_waiting_requests {
                return Err(EngineError::Overloaded(waiting));
            }
            self.updates.hold(request, seqs);
        } else {
            self.policy.add(seqs)?;
        }
        let entry = Group {
            events: msg.events,
            return_routing: r.return_routing,
            routing_start: r.routing_start,
            num_open: r.n,
            n: r.n,
            versions: vec![WeightVersions::default(); r.n],
        };
        self.groups.insert(request, entry);
        self.schedule(ctx);
        Ok(request)
    }

    /// Applies a step's output: streams tokens, finishes the sequences that stopped.
    pub(super) fn apply_output(
        &mut self,
        ids: &[SeqId],
        output: &StepOutput,
        ctx: &mut Context<Self>,
    ) {
        let tokenizer = self.tokenizer.clone();
        let mut decode = |t: &[u32], skip: bool| tokenizer.decode_with(t, skip).unwrap_or_default();
        let mut gone = Vec::new();
        for event in self.policy.apply_output(ids, output, &mut decode) {
            match event {
                SeqEvent::Token { id, sampled } => {
                    // A request whose abort waits for this step still streams what the step
                    // sampled: its final output lists exactly the tokens its stream carried.
                    let Some(g) = self.groups.get_mut(&id.request()) else { continue };
                    let version = self.updates.version();
                    let index = id.index_in_request();
                    g.versions[index].push(version);
                    let token = TokenEvent {
                        index,
                        token: sampled.token,
                        logprob: sampled.logprob,
                        top_logprobs: sampled.top_logprobs,
                        token_id_logprobs: sampled.token_id_logprobs,
                        weight_version: Arc::clone(version),
                    };
                    if g.events.is_closed() {
                        // Nobody listens any more (the submitter went away before it got its
                        // stream): stop computing for it.
                        gone.push(id.request());
                    } else {
                        // Shipped with the step's other events (below, or with a final output).
                        self.peers.outbox.push(&g.events, RequestEvent::Token(token));
                    }
                }
                SeqEvent::Finished { id, reason, text_len } => {
                    // Every token but the last sampled one was fed to the model.
                    let num_rows = self.policy.seq(id).map_or(0, |s| s.num_tokens() - 1);
                    self.finish(id, reason, text_len, num_rows, ctx)
                }
            }
        }
        self.peers.outbox.flush();
        for request in gone {
            self.abort(request, None, ctx);
        }
    }

    /// Builds a finished sequence's final output, reading its first `num_rows` routing rows first
    /// when asked; the sequence keeps its blocks until then.
    fn finish(
        &mut self,
        id: SeqId,
        reason: FinishReason,
        text_len: Option<usize>,
        num_rows: usize,
        ctx: &mut Context<Self>,
    ) {
        let Some(seq) = self.policy.seq(id) else { return };
        let text = FinalText::new(&self.tokenizer, &seq.params, &reason, text_len);
        let output = FinalOutput {
            index: id.index_in_request(),
            token_ids: seq.output.clone(),
            // Decoded on the delivery thread.
            text: String::new(),
            finish_reason: reason,
            num_prompt_tokens: seq.prompt.len(),
            num_cached_tokens: seq.num_cached_tokens,
            routing: None,
            prompt_logprobs: seq.params.prompt_logprobs.map(|_| seq.prompt_logprobs.clone()),
            // Stamped by `deliver`.
            weight_version: String::new(),
            weight_versions: Vec::new(),
        };
        let group = self.groups.get(&id.request());
        let Some(g) = group.filter(|g| g.return_routing && self.info.routing.is_some()) else {
            return self.deliver(id, output, text);
        };
        let read = Reconstruct {
            table: seq.blocks.clone(),
            num_rows,
            start: g.routing_start.min(num_rows),
            after_step: self.last_step.get(&id).copied().unwrap_or_default(),
        };
        let fut = self.peers.routing.send(read).into_actor(self).map(move |res, act, ctx| {
            match res {
                Ok(Ok(rows)) => {
                    act.deliver(id, FinalOutput { routing: Some(rows), ..output }, text)
                }
                Ok(Err(e)) => act
                    .fail_seq(id, EngineError::Internal(format!("routing rows unavailable: {e}"))),
                Err(e) => act.fail_seq(
                    id,
                    EngineError::Internal(format!("routing host-cache unreachable: {e}")),
                ),
            }
            act.schedule(ctx);
        });
        ctx.spawn(fut);
    }

    /// Sends a continuation's final output, stamped with its weights' versions, with its `text`
    /// made on the delivery thread, and releases it.
    pub(super) fn deliver(&mut self, id: SeqId, mut output: FinalOutput, text: FinalText) {
        if let Some(g) = self.groups.get_mut(&id.request()) {
            let versions = std::mem::take(&mut g.versions[id.index_in_request()]);
            let current = self.updates.version();
            output.weight_version = versions.last(current).to_string();
            output.weight_versions = versions.into_spans(current);
            self.peers.outbox.finish(&g.events, Box::new(output), text);
            g.num_open -= 1;
            if g.num_open == 0 {
                self.groups.remove(&id.request());
            }
        }
        self.last_step.remove(&id);
        self.policy.release(id);
    }

    /// Ends a request with an error: the error ends its stream, and every sequence of the
    /// request is dropped (the one that failed included).
    fn fail_seq(&mut self, id: SeqId, error: EngineError) {
        let request = id.request();
        if let Some(g) = self.groups.remove(&request) {
            self.peers.outbox.send(&g.events, RequestEvent::Error(error));
            for i in 0..g.n {
                self.policy.abort(SeqId::new(request, i));
                self.last_step.remove(&SeqId::new(request, i));
            }
        }
    }

    /// A step failed on a rank: its requests fail; the prefix cache and routing rows are reset
    /// because the ranks' tensors can no longer be trusted.
    pub(super) fn fail_step(&mut self, ids: &[SeqId], reason: String, ctx: &mut Context<Self>) {
        tracing::error!("step failed: {reason}");
        for &id in ids {
            self.fail_seq(id, EngineError::Internal(reason.clone()));
        }
        let routing = self.peers.routing.clone();
        let reset =
            self.peers.cache.send(ResetPrefixCache).into_actor(self).map(move |res, _, _| {
                if let Ok(dropped) = res {
                    routing.do_send(FreeBlocks(dropped));
                }
            });
        ctx.spawn(reset);
    }

    /// A peer is gone: nothing can be served any more.
    pub(super) fn fail_engine(&mut self, reason: String) {
        tracing::error!("engine unhealthy: {reason}");
        self.unhealthy = Some(reason.clone());
        self.step_in_flight = false;
        self.fail_updates(&reason);
        self.drop_pause(&EngineError::Unhealthy(reason.clone()));
        self.cancel_memory_ops(&EngineError::Unhealthy(reason.clone()));
        for (_, g) in self.groups.drain() {
            let error = EngineError::Unhealthy(reason.clone());
            self.peers.outbox.push(&g.events, RequestEvent::Error(error));
        }
        self.peers.outbox.flush();
        self.check_drained();
    }

    /// Ends every open sequence of `request` (or its continuation `only`) with
    /// `finish_reason: abort`. A sequence in the step now in flight is aborted once that step's
    /// output is applied (the abort waits in `pending_aborts`), so its rows are all stored and the
    /// token that step samples is streamed like any other; a sequence that computed tokens returns
    /// their routing rows. A sequence whose step the cache manager is still granting stops at
    /// once: the policy leaves it out of that step's plan.
    pub(super) fn abort(
        &mut self,
        request: RequestId,
        only: Option<usize>,
        ctx: &mut Context<Self>,
    ) {
        if self.abort_held(request, only) {
            return self.schedule(ctx);
        }
        let Some(g) = self.groups.get(&request) else { return };
        let picked = |i: usize| only.is_none_or(|o| o == i);
        let n = g.n;
        if self.in_flight.iter().any(|id| id.request() == request && picked(id.index_in_request()))
        {
            if !self.pending_aborts.contains(&(request, only)) {
                self.pending_aborts.push((request, only));
            }
            return;
        }
        for i in (0..n).filter(|&i| picked(i)) {
            let id = SeqId::new(request, i);
            let Some(seq) = self.policy.seq(id) else { continue };
            if seq.status == SeqStatus::Finishing {
                // Finished already; its final output is on its way.
                continue;
            }
            // Rows exist for every position in the sequence's blocks: computed or hit.
            let num_rows = seq.num_computed_tokens;
            if self.policy.stop_keeping_blocks(id) {
                self.finish(id, FinishReason::Abort, None, num_rows, ctx);
            } else if let Some(seq) = self.policy.abort(id) {
                self.last_step.remove(&id);
                let reason = FinishReason::Abort;
                let text = FinalText::new(&self.tokenizer, &seq.params, &reason, None);
                let output = FinalOutput {
                    index: i,
                    text: String::new(),
                    token_ids: seq.output,
                    finish_reason: reason,
                    num_prompt_tokens: seq.prompt.len(),
                    num_cached_tokens: seq.num_cached_tokens,
                    routing: None,
                    prompt_logprobs: None,
                    weight_version: String::new(),
                    weight_versions: Vec::new(),
                };
                self.deliver(id, output, text);
            }
        }
        self.schedule(ctx);
    }

    /// Aborts that waited for the step that was in flight.
    pub(super) fn run_pending_aborts(&mut self, ctx: &mut Context<Self>) {
        for (request, only) in std::mem::take(&mut self.pending_aborts) {
            self.abort(request, only, ctx);
        }
    }
}
