//! The scheduler actor: owns the request lifecycle (the `routed_scheduler` policy), every
//! request's event stream, and the step loop: one [`PlanStep`] round trip to the cache manager,
//! one [`ExecuteStep`] to the executor, then the output is applied and streamed. One step is in
//! flight at a time.
//!
//! * `mod.rs`: the actor and the step loop;
//! * [`requests`]: a request's life (submission, streaming, finishing, aborting, failing);
//! * [`handlers`]: the messages the scheduler answers, the stats and the drain on shutdown;
//! * [`weights`]: weight updates between requests;
//! * [`pause`]: pausing and continuing generation, flushing the cache when nothing runs;
//! * [`memory`]: giving memory back between rollout steps and taking it again.

mod handlers;
mod memory;
mod pause;
mod requests;
mod weights;

pub use handlers::{Abort, ExpertLoadStats, GetStats, Health, ResetCache, Shutdown, Submit};
pub use memory::{GetMemory, ReleaseMemory, ResumeMemory};
pub use pause::{ContinueGeneration, FlushCache, GetAdmission, PauseGeneration};
pub use weights::{GetWeights, SetWeightVersion, UpdateWeights};

use crate::{
    EngineStats, ModelInfo, RequestEvent, WeightVersions, WeightsInfo,
    cache_manager::{CacheManagerActor, PlanError, PlanStep},
    executor::{ExecuteStep, ExecutorActor, ExecutorError},
    heartbeat::{HeartbeatActor, SetIdle},
    metrics as names,
    outbox::Outbox,
    routing_cache::{FreeBlocks, RoutingCacheActor},
    timings::Timings,
};
use actix::{Actor, ActorFutureExt, Addr, AsyncContext, Context, MailboxError, WrapFuture};
use routed_model::Tokenizer;
use routed_scheduler::{GrantedStep, Scheduler};
use routed_types::{RequestId, SeqId, StepId, StepOutput};
use std::{collections::HashMap, sync::Arc, time::Instant};
use tokio::sync::{mpsc::UnboundedSender, oneshot};

/// One submitted request: its stream and what its sequences share.
struct Group {
    events: UnboundedSender<RequestEvent>,
    /// Sequences: `SeqId::new(request, 0..n)`.
    n: usize,
    return_routing: bool,
    routing_start: usize,
    /// Sequences not finished yet.
    num_open: usize,
    /// Per sequence, the versions of the weights that sampled its tokens.
    versions: Vec<WeightVersions>,
}

/// The peers the scheduler talks to.
pub struct Peers {
    /// The cache manager.
    pub cache: Addr<CacheManagerActor>,
    /// The executor over the model runners.
    pub executor: Addr<ExecutorActor>,
    /// The routing host-cache.
    pub routing: Addr<RoutingCacheActor>,
    /// The idle heartbeat, when on.
    pub heartbeat: Option<Addr<HeartbeatActor>>,
    /// Pipeline timings the other actors write.
    pub timings: Arc<Timings>,
    /// The ranks' collectives, for their timings.
    pub ranks: Vec<Arc<dyn routed_backend::collective::Collective>>,
    /// The delivery thread, which sends the requests' events on their streams.
    pub outbox: Outbox,
}

/// Drives engine steps and owns every request's stream.
pub struct SchedulerActor {
    policy: Scheduler,
    tokenizer: Arc<Tokenizer>,
    info: Arc<ModelInfo>,
    peers: Peers,
    groups: HashMap<RequestId, Group>,
    next_request: u64,
    /// The last step that computed each sequence (its routing watermark).
    last_step: HashMap<SeqId, StepId>,
    step_in_flight: bool,
    /// The sequences of the step in flight.
    in_flight: Vec<SeqId>,
    /// Aborts waiting for the step in flight: a request's sequences, all or one.
    pending_aborts: Vec<(RequestId, Option<usize>)>,
    idle: Option<bool>,
    stats: EngineStats,
    unhealthy: Option<String>,
    shutting_down: bool,
    drained: Vec<oneshot::Sender<()>>,
    /// Weight updates and the requests they (or a pause) hold.
    updates: weights::Updates,
    /// Generation paused.
    pause: Option<pause::Pause>,
    /// Memory given back, and the releases and resumes waiting.
    memory: memory::Memory,
}

impl SchedulerActor {
    /// A scheduler with `policy` and its peers, serving `weights`.
    pub fn new(
        policy: Scheduler,
        tokenizer: Arc<Tokenizer>,
        info: Arc<ModelInfo>,
        peers: Peers,
        weights: WeightsInfo,
    ) -> Self {
        Self {
            policy,
            tokenizer,
            info,
            peers,
            groups: HashMap::new(),
            next_request: 1,
            last_step: HashMap::new(),
            step_in_flight: false,
            in_flight: Vec::new(),
            pending_aborts: Vec::new(),
            idle: None,
            stats: EngineStats::default(),
            unhealthy: None,
            shutting_down: false,
            drained: Vec::new(),
            updates: weights::Updates::new(weights),
            pause: None,
            memory: memory::Memory::default(),
        }
    }

    /// Starts a step when none is in flight and there is work (and generation is not paused,
    /// and the memory it needs is not released).
    fn schedule(&mut self, ctx: &mut Context<Self>) {
        let busy = self.step_in_flight || self.updates.is_swapping() || self.memory.is_busy();
        if busy || self.unhealthy.is_some() {
            return;
        }
        if self.memory_op_is_due() {
            return self.run_memory_op(ctx);
        }
        if self.update_is_due() {
            return self.swap_weights(ctx);
        }
        if self.pause.is_some() && !self.pause_lets_requests_run() {
            return self.keep_paused(ctx);
        }
        if self.memory.stops_steps() {
            return self.keep_released(ctx);
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
                if let Some(granted) = act.take_grant(res) {
                    act.on_granted(granted, started, ctx);
                }
            });
        ctx.spawn(plan);
    }

    /// The cache manager's answer to a [`PlanStep`], with the rows of the blocks it dropped freed
    /// and its figures taken; `None`, the engine made unhealthy, when it refused or is gone.
    fn take_grant(
        &mut self,
        res: Result<Result<GrantedStep, PlanError>, MailboxError>,
    ) -> Option<GrantedStep> {
        let granted = match res {
            Ok(Ok(granted)) => granted,
            Ok(Err(e)) => {
                self.fail_engine(e.to_string());
                return None;
            }
            Err(e) => {
                self.fail_engine(format!("cache manager unreachable: {e}"));
                return None;
            }
        };
        if !granted.dropped_blocks.is_empty() {
            self.peers.routing.do_send(FreeBlocks(granted.dropped_blocks.clone()));
        }
        self.stats.apply_cache(&granted.stats);
        self.publish_stats();
        Some(granted)
    }

    fn on_granted(&mut self, granted: GrantedStep, started: Instant, ctx: &mut Context<Self>) {
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
        self.in_flight.clear();
        self.in_flight.extend(plan.seqs.iter().map(|s| s.seq_id));
        let step_id = plan.step_id;
        let run = self.peers.executor.send(ExecuteStep(plan)).into_actor(self).map(
            move |res, act, ctx| {
                let ids = std::mem::take(&mut act.in_flight);
                act.on_output(res, &ids, step_id, ctx);
                act.in_flight = ids;
                act.in_flight.clear();
                act.run_pending_aborts(ctx);
                let elapsed = started.elapsed().as_secs_f64();
                act.stats.step_seconds += elapsed;
                metrics::histogram!(names::STEP_DURATION).record(elapsed);
                act.step_in_flight = false;
                act.schedule(ctx);
            },
        );
        ctx.spawn(run);
    }

    fn on_output(
        &mut self,
        res: Result<Result<StepOutput, ExecutorError>, MailboxError>,
        ids: &[SeqId],
        step_id: StepId,
        ctx: &mut Context<Self>,
    ) {
        let output = match res {
            Ok(Ok(output)) => output,
            Ok(Err(e @ ExecutorError::Rank { .. })) => {
                return self.fail_step(ids, e.to_string(), ctx);
            }
            Ok(Err(e)) => return self.fail_engine(e.to_string()),
            Err(e) => return self.fail_engine(format!("executor unreachable: {e}")),
        };
        self.stats.num_steps += 1;
        for &id in ids {
            self.last_step.insert(id, step_id);
        }
        self.apply_output(ids, &output, ctx);
    }

    /// Tells the heartbeat whether to send dummy forwards: while idle, and with the memory they
    /// need in place.
    fn tell_heartbeat(&mut self) {
        let idle = self.policy.is_idle() && !self.memory.stops_steps();
        if self.idle != Some(idle) {
            self.idle = Some(idle);
            if let Some(h) = &self.peers.heartbeat {
                h.do_send(SetIdle(idle));
            }
        }
    }

    fn publish_stats(&mut self) {
        self.stats.num_running = self.policy.num_running();
        self.stats.num_waiting = self.policy.num_waiting();
        names::publish_step(&self.stats);
    }
}

impl Actor for SchedulerActor {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Context<Self>) {
        self.tell_heartbeat();
        names::publish_memory(self.memory.released());
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
