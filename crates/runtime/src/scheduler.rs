//! The scheduler actor: owns the request lifecycle (the `routed_scheduler` policy), every
//! request's event stream, and the step loop: one [`PlanStep`] round trip to the cache manager,
//! one [`Execute`] to the runner, then the output is applied and streamed. One step is in flight
//! at a time.

use crate::{
    EngineError, EngineStats, FinalOutput, GenerateRequest, ModelInfo, RequestEvent, TokenEvent,
    cache_manager::CacheManagerActor, heartbeat::HeartbeatActor, messages::*, metrics as names,
    routing_cache::RoutingCacheActor, runner::RunnerActor, timings::Timings,
};
use actix::{
    Actor, ActorFutureExt, Addr, AsyncContext, Context, Handler, MailboxError, ResponseActFuture,
    ResponseFuture, WrapFuture,
};
use routed_model::Tokenizer;
use routed_scheduler::{GrantedStep, NewSeq, Scheduler, SchedulerError, SeqEvent};
use routed_types::{FinishReason, RequestId, SamplingParams, StepId, StepOutput};
use std::{collections::HashMap, sync::Arc, time::Instant};
use tokio::sync::{mpsc::UnboundedSender, oneshot};

/// The largest `n` a request may ask for.
pub const MAX_N: usize = 128;

/// One submitted request: its stream and what its continuations share.
struct Group {
    events: UnboundedSender<RequestEvent>,
    /// Continuations: sequence ids `seq_id(group, 0..n)`.
    n: usize,
    return_routing: bool,
    routing_start: usize,
    /// Continuations not finished yet.
    num_open: usize,
}

/// The peers the scheduler talks to.
pub struct Peers {
    /// The cache manager.
    pub cache: Addr<CacheManagerActor>,
    /// The model runner(s).
    pub runners: Vec<Addr<RunnerActor>>,
    /// The routing host-cache.
    pub routing: Addr<RoutingCacheActor>,
    /// The idle heartbeat, when on.
    pub heartbeat: Option<Addr<HeartbeatActor>>,
    /// Pipeline timings the other actors write.
    pub timings: Arc<Timings>,
}

/// Drives engine steps and owns every request's stream.
pub struct SchedulerActor {
    policy: Scheduler,
    tokenizer: Arc<Tokenizer>,
    info: Arc<ModelInfo>,
    peers: Peers,
    groups: HashMap<RequestId, Group>,
    next_group: u64,
    /// The last step that computed each sequence (its routing watermark).
    last_step: HashMap<RequestId, StepId>,
    step_in_flight: bool,
    idle: Option<bool>,
    stats: EngineStats,
    unhealthy: Option<String>,
    shutting_down: bool,
    drained: Vec<oneshot::Sender<()>>,
}

/// A request's sequence ids are `group << 8 | index`: `n` is at most 128, so the group id and
/// index are recovered without a lookup table.
fn group_of(seq: RequestId) -> (RequestId, usize) {
    (RequestId(seq.0 >> 8), (seq.0 & 0xff) as usize)
}

fn seq_id(group: RequestId, index: usize) -> RequestId {
    RequestId(group.0 << 8 | index as u64)
}

impl SchedulerActor {
    /// A scheduler with `policy` and its peers.
    pub fn new(
        policy: Scheduler,
        tokenizer: Arc<Tokenizer>,
        info: Arc<ModelInfo>,
        peers: Peers,
    ) -> Self {
        Self {
            policy,
            tokenizer,
            info,
            peers,
            groups: HashMap::new(),
            next_group: 1,
            last_step: HashMap::new(),
            step_in_flight: false,
            idle: None,
            stats: EngineStats::default(),
            unhealthy: None,
            shutting_down: false,
            drained: Vec::new(),
        }
    }

    fn validate(&self, r: &GenerateRequest) -> Result<(), EngineError> {
        let bad = |param: &'static str, message: String| {
            Err(EngineError::InvalidRequest { param, message })
        };
        let p = r.prompt_token_ids.len();
        if p == 0 {
            return bad("prompt", "the prompt is empty".into());
        }
        if let Some(t) = r.prompt_token_ids.iter().find(|&&t| t as usize >= self.info.vocab_size) {
            return bad(
                "prompt",
                format!("token id {t} is outside the vocabulary (size {})", self.info.vocab_size),
            );
        }
        if p + r.sampling.max_tokens as usize > self.info.max_model_len {
            let msg = format!(
                "prompt ({p} tokens) + max_tokens ({}) exceeds the model length {}",
                r.sampling.max_tokens, self.info.max_model_len
            );
            return bad("max_tokens", msg);
        }
        let capacity = self.info.num_kv_blocks * self.info.block_size;
        if p + r.sampling.max_tokens as usize > capacity {
            // Such a request could never hold all its blocks at once: it would be preempted
            // forever.
            let msg = format!(
                "prompt + max_tokens needs more than the KV cache's {capacity} token slots"
            );
            return bad("max_tokens", msg);
        }
        if r.sampling.max_tokens == 0 {
            return bad("max_tokens", "max_tokens must be at least 1".into());
        }
        if r.n == 0 || r.n > MAX_N {
            return bad("n", format!("n must be in 1..={MAX_N}, got {}", r.n));
        }
        if r.return_routing && r.routing_start > p {
            return bad(
                "routed_experts_start_len",
                format!("start {} is past the prompt's {p} tokens", r.routing_start),
            );
        }
        if r.return_routing && !self.info.routing_capture {
            return bad(
                "return_routed_experts",
                "routing capture is off (--enable-return-routed-experts)".into(),
            );
        }
        Ok(())
    }

    fn submit(&mut self, msg: Submit, ctx: &mut Context<Self>) -> Result<RequestId, EngineError> {
        if self.shutting_down {
            return Err(EngineError::ShutDown);
        }
        if let Some(reason) = &self.unhealthy {
            return Err(EngineError::Unhealthy(reason.clone()));
        }
        let r = msg.request;
        self.validate(&r)?;
        let group = RequestId(self.next_group);
        self.next_group += 1;
        let prompt = Arc::new(r.prompt_token_ids);
        let seqs = (0..r.n)
            .map(|i| NewSeq {
                id: seq_id(group, i),
                prompt: prompt.clone(),
                params: Arc::new(SamplingParams {
                    seed: r.sampling.seed.wrapping_add(i as u64),
                    ..r.sampling.clone()
                }),
                cache_salt: r.cache_salt.clone(),
            })
            .collect();
        self.policy.add(seqs).map_err(|e| match e {
            SchedulerError::Overloaded(n) => EngineError::Overloaded(n),
            other => EngineError::Internal(other.to_string()),
        })?;
        let entry = Group {
            events: msg.events,
            return_routing: r.return_routing,
            routing_start: r.routing_start,
            num_open: r.n,
            n: r.n,
        };
        self.groups.insert(group, entry);
        self.schedule(ctx);
        Ok(group)
    }

    /// Starts a step when none is in flight and there is work.
    fn schedule(&mut self, ctx: &mut Context<Self>) {
        if self.step_in_flight || self.unhealthy.is_some() {
            return;
        }
        self.tell_heartbeat();
        if !self.policy.has_work() {
            self.check_drained();
            return;
        }
        self.step_in_flight = true;
        let started = Instant::now();
        let step = self.policy.begin_step();
        let plan =
            self.peers.cache.send(PlanStep(step)).into_actor(self).map(move |res, act, ctx| {
                match res {
                    Ok(Ok(granted)) => act.on_granted(granted, started, ctx),
                    Ok(Err(e)) => act.fail_engine(format!("cache manager: {e}")),
                    Err(e) => act.fail_engine(format!("cache manager unreachable: {e}")),
                }
            });
        ctx.spawn(plan);
    }

    fn on_granted(&mut self, granted: GrantedStep, started: Instant, ctx: &mut Context<Self>) {
        if !granted.dropped_blocks.is_empty() {
            self.peers.routing.do_send(FreeBlocks(granted.dropped_blocks.clone()));
        }
        self.mirror_cache_stats(&granted.stats);
        let plan = self.policy.build_plan(granted);
        if plan.seqs.is_empty() {
            self.step_in_flight = false;
            // Nothing fit: wait for a finishing request to free room rather than spin.
            if self.policy.num_running() == 0
                && self.policy.num_waiting() > 0
                && self.policy.has_work()
            {
                ctx.run_later(std::time::Duration::from_millis(5), |act, ctx| act.schedule(ctx));
            } else {
                self.schedule(ctx);
            }
            return;
        }
        let ids: Vec<RequestId> = plan.seqs.iter().map(|s| s.request_id).collect();
        let step_id = plan.step_id;
        let runner = self.peers.runners[0].clone();
        let run = runner.send(Execute(plan)).into_actor(self).map(move |res, act, ctx| {
            act.on_output(res, &ids, step_id, ctx);
            let elapsed = started.elapsed().as_secs_f64();
            act.stats.step_seconds += elapsed;
            metrics::histogram!(names::STEP_DURATION).record(elapsed);
            act.step_in_flight = false;
            act.schedule(ctx);
        });
        ctx.spawn(run);
    }

    fn on_output(
        &mut self,
        res: Result<Result<StepOutput, String>, MailboxError>,
        ids: &[RequestId],
        step_id: StepId,
        ctx: &mut Context<Self>,
    ) {
        let output = match res {
            Ok(Ok(output)) => output,
            Ok(Err(e)) => return self.fail_step(ids, format!("model runner: {e}"), ctx),
            Err(e) => return self.fail_engine(format!("model runner unreachable: {e}")),
        };
        self.stats.num_steps += 1;
        for &id in ids {
            self.last_step.insert(id, step_id);
        }
        let tokenizer = self.tokenizer.clone();
        let mut decode = |t: &[u32]| tokenizer.decode(t).unwrap_or_default();
        let mut gone = Vec::new();
        for event in self.policy.apply_output(ids, &output, &mut decode) {
            match event {
                SeqEvent::Token { id, sampled } => {
                    let (group, index) = group_of(id);
                    if let Some(g) = self.groups.get(&group) {
                        let token = TokenEvent {
                            index,
                            token: sampled.token,
                            logprob: sampled.logprob,
                            top_logprobs: sampled.top_logprobs,
                        };
                        if g.events.send(RequestEvent::Token(token)).is_err() {
                            // Nobody listens any more (the submitter went away before it got
                            // its stream): stop computing for it.
                            gone.push(group);
                        }
                    }
                }
                SeqEvent::Finished { id, reason, text_len } => {
                    self.finish(id, reason, text_len, ctx)
                }
            }
        }
        for group in gone {
            self.abort(group, ctx);
        }
    }

    /// Builds a finished sequence's final output, reading its routing first when asked.
    fn finish(
        &mut self,
        id: RequestId,
        reason: FinishReason,
        text_len: Option<usize>,
        ctx: &mut Context<Self>,
    ) {
        let (group, index) = group_of(id);
        let Some(seq) = self.policy.seq(id) else { return };
        let mut text = self.tokenizer.decode(&seq.output).unwrap_or_default();
        if let Some(len) = text_len {
            text.truncate(len);
        }
        let output = FinalOutput {
            index,
            token_ids: seq.output.clone(),
            text,
            finish_reason: reason,
            num_prompt_tokens: seq.prompt.len(),
            num_cached_tokens: seq.num_cached_tokens,
            routing: None,
        };
        let wants_routing = self.groups.get(&group).is_some_and(|g| g.return_routing)
            && self.info.routing.is_some();
        if !wants_routing {
            return self.deliver(id, output);
        }
        let read = Reconstruct {
            table: seq.blocks.clone(),
            num_rows: seq.num_tokens() - 1,
            start: self.groups[&group].routing_start,
            after_step: self.last_step.get(&id).copied().unwrap_or_default(),
        };
        let fut = self.peers.routing.send(read).into_actor(self).map(move |res, act, ctx| {
            match res {
                Ok(Ok(rows)) => act.deliver(id, FinalOutput { routing: Some(rows), ..output }),
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

    fn deliver(&mut self, id: RequestId, output: FinalOutput) {
        let (group, _) = group_of(id);
        if let Some(g) = self.groups.get_mut(&group) {
            let _ = g.events.send(RequestEvent::Finished(Box::new(output)));
            g.num_open -= 1;
            if g.num_open == 0 {
                self.groups.remove(&group);
            }
        }
        self.last_step.remove(&id);
        self.policy.release(id);
    }

    /// Ends a request with an error: the error ends its stream, and every continuation is
    /// dropped (the sequence that failed included).
    fn fail_seq(&mut self, id: RequestId, error: EngineError) {
        let (group, _) = group_of(id);
        if let Some(g) = self.groups.remove(&group) {
            let _ = g.events.send(RequestEvent::Error(error));
            for i in 0..g.n {
                self.policy.abort(seq_id(group, i));
                self.last_step.remove(&seq_id(group, i));
            }
        }
    }

    /// A step failed in the runner: its requests fail; the prefix cache and routing rows are
    /// reset because the runner's tensors can no longer be trusted.
    fn fail_step(&mut self, ids: &[RequestId], reason: String, ctx: &mut Context<Self>) {
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
    fn fail_engine(&mut self, reason: String) {
        tracing::error!("engine unhealthy: {reason}");
        self.unhealthy = Some(reason.clone());
        self.step_in_flight = false;
        for (_, g) in self.groups.drain() {
            let _ = g.events.send(RequestEvent::Error(EngineError::Unhealthy(reason.clone())));
        }
        self.check_drained();
    }

    fn abort(&mut self, group: RequestId, ctx: &mut Context<Self>) {
        let Some(g) = self.groups.remove(&group) else { return };
        for i in 0..g.n {
            let id = seq_id(group, i);
            if let Some(seq) = self.policy.abort(id) {
                self.last_step.remove(&id);
                let output = FinalOutput {
                    index: i,
                    text: self.tokenizer.decode(&seq.output).unwrap_or_default(),
                    token_ids: seq.output,
                    finish_reason: FinishReason::Abort,
                    num_prompt_tokens: seq.prompt.len(),
                    num_cached_tokens: seq.num_cached_tokens,
                    routing: None,
                };
                let _ = g.events.send(RequestEvent::Finished(Box::new(output)));
            }
        }
        self.schedule(ctx);
    }

    fn tell_heartbeat(&mut self) {
        let idle = self.policy.is_idle();
        if self.idle != Some(idle) {
            self.idle = Some(idle);
            if let Some(h) = &self.peers.heartbeat {
                h.do_send(SetIdle(idle));
            }
        }
    }

    fn mirror_cache_stats(&mut self, c: &routed_cache::CacheStats) {
        let s = &mut self.stats;
        s.num_kv_blocks_total = c.num_blocks_total;
        s.num_kv_blocks_free = c.num_blocks_free;
        s.num_kv_blocks_cached = c.num_blocks_cached;
        s.num_kv_blocks_evictable = c.num_blocks_evictable;
        s.num_snapshot_slots_total = c.num_snapshot_slots_total;
        s.num_snapshot_slots_used = c.num_snapshot_slots_used;
        s.num_prefill_tokens_computed = c.num_prefill_tokens_computed;
        s.num_prefill_tokens_skipped = c.num_prefill_tokens_skipped;
        s.num_prefix_cache_hits = c.num_prefix_cache_hits;
        s.num_deferrals = c.num_deferrals;
        s.num_preemptions = c.num_preemptions;
        s.num_running = self.policy.num_running();
        s.num_waiting = self.policy.num_waiting();
        names::publish(s);
    }

    fn check_drained(&mut self) {
        if !self.shutting_down
            || self.step_in_flight
            || !self.groups.is_empty() && self.unhealthy.is_none()
        {
            return;
        }
        if self.drained.is_empty() {
            return;
        }
        for tx in self.drained.drain(..) {
            let _ = tx.send(());
        }
        // Everything is drained: stop the actors (the system stops them in order, mailboxes
        // first) and let the engine thread end.
        actix::System::current().stop();
    }
}

impl Actor for SchedulerActor {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Context<Self>) {
        self.tell_heartbeat();
        ctx.run_interval(std::time::Duration::from_secs(10), |act, _| {
            let s = &act.stats;
            tracing::info!(
                running = s.num_running,
                waiting = s.num_waiting,
                steps = s.num_steps,
                prefill_computed = s.num_prefill_tokens_computed,
                prefill_skipped = s.num_prefill_tokens_skipped,
                prefix_hits = s.num_prefix_cache_hits,
                kv_cached = s.num_kv_blocks_cached,
                kv_evictable = s.num_kv_blocks_evictable,
                kv_total = s.num_kv_blocks_total,
                snapshots_used = s.num_snapshot_slots_used,
                dummy_forwards = s.num_dummy_forwards,
                "engine"
            );
        });
    }
}

impl Handler<Submit> for SchedulerActor {
    type Result = Result<RequestId, EngineError>;

    fn handle(&mut self, msg: Submit, ctx: &mut Context<Self>) -> Self::Result {
        self.submit(msg, ctx)
    }
}

impl Handler<Abort> for SchedulerActor {
    type Result = ();

    fn handle(&mut self, msg: Abort, ctx: &mut Context<Self>) {
        self.abort(msg.0, ctx);
    }
}

impl Handler<DummyForwardDone> for SchedulerActor {
    type Result = ();

    fn handle(&mut self, _: DummyForwardDone, _: &mut Context<Self>) {
        self.stats.num_dummy_forwards += 1;
        metrics::counter!(names::DUMMY_FORWARDS).increment(1);
    }
}

impl Handler<GetStats> for SchedulerActor {
    type Result = ResponseFuture<EngineStats>;

    fn handle(&mut self, _: GetStats, _: &mut Context<Self>) -> Self::Result {
        let mut stats = self.stats.clone();
        stats.num_running = self.policy.num_running();
        stats.num_waiting = self.policy.num_waiting();
        stats.num_live_states_held = self.policy.num_live_states_held();
        let t = &self.peers.timings;
        stats.forward_seconds = Timings::seconds(&t.forward_ns);
        stats.routing_capture_seconds = Timings::seconds(&t.capture_ns);
        stats.routing_copy_seconds = Timings::seconds(&t.copy_ns);
        stats.routing_store_seconds = Timings::seconds(&t.store_ns);
        let (cache, routing) = (self.peers.cache.clone(), self.peers.routing.clone());
        Box::pin(async move {
            if let Ok(c) = cache.send(GetCacheStats).await {
                stats.num_kv_blocks_total = c.num_blocks_total;
                stats.num_kv_blocks_free = c.num_blocks_free;
                stats.num_kv_blocks_cached = c.num_blocks_cached;
                stats.num_kv_blocks_evictable = c.num_blocks_evictable;
                stats.num_snapshot_slots_total = c.num_snapshot_slots_total;
                stats.num_snapshot_slots_used = c.num_snapshot_slots_used;
                stats.num_prefill_tokens_computed = c.num_prefill_tokens_computed;
                stats.num_prefill_tokens_skipped = c.num_prefill_tokens_skipped;
                stats.num_prefix_cache_hits = c.num_prefix_cache_hits;
                stats.num_deferrals = c.num_deferrals;
                stats.num_preemptions = c.num_preemptions;
            }
            stats.routing_bytes_held = routing.send(GetRoutingBytes).await.unwrap_or(0);
            names::publish(&stats);
            stats
        })
    }
}

impl Handler<ResetCache> for SchedulerActor {
    type Result = ResponseFuture<bool>;

    fn handle(&mut self, _: ResetCache, _: &mut Context<Self>) -> Self::Result {
        let (cache, routing) = (self.peers.cache.clone(), self.peers.routing.clone());
        Box::pin(async move {
            match cache.send(ResetPrefixCache).await {
                Ok(dropped) => {
                    routing.do_send(FreeBlocks(dropped));
                    true
                }
                Err(_) => false,
            }
        })
    }
}

impl Handler<Health> for SchedulerActor {
    type Result = Result<(), EngineError>;

    fn handle(&mut self, _: Health, _: &mut Context<Self>) -> Self::Result {
        match &self.unhealthy {
            Some(reason) => Err(EngineError::Unhealthy(reason.clone())),
            None if self.shutting_down => Err(EngineError::ShutDown),
            None => Ok(()),
        }
    }
}

impl Handler<Shutdown> for SchedulerActor {
    type Result = ResponseActFuture<Self, ()>;

    fn handle(&mut self, _: Shutdown, _: &mut Context<Self>) -> Self::Result {
        self.shutting_down = true;
        let (tx, rx) = oneshot::channel();
        self.drained.push(tx);
        self.check_drained();
        Box::pin(
            async move {
                let _ = rx.await;
            }
            .into_actor(self),
        )
    }
}
