//! Every message the actors exchange. Each says who sends it, when, what the reply is and what
//! happens when the receiving actor is gone (a mailbox error, which the sender turns into a
//! failed request or an unhealthy engine, never a hang).

use crate::{EngineError, EngineStats, GenerateRequest, RequestEvent};
use actix::Message;
use routed_cache::CacheStats;
use routed_model::RoutingBuffer;
use routed_scheduler::{CacheStep, GrantedStep};
use routed_types::{
    BlockGeneration, BlockId, RequestId, RoutingRows, StepId, StepOutput, StepPlan,
};
use tokio::sync::mpsc::UnboundedSender;

/// A KV block with the generation it had when data was written for it.
pub type BlockRef = (BlockId, BlockGeneration);

// ---- to the cache manager -------------------------------------------------------------------

/// Scheduler -> cache manager, once per step: the commits of the last forward, new requests,
/// sampled tokens and frees, then the step's candidates and budget. Reply: the grants. Gone
/// manager: the scheduler fails every request and reports the engine unhealthy.
#[derive(Message)]
#[rtype(result = "Result<GrantedStep, String>")]
pub struct PlanStep(pub CacheStep);

/// Scheduler -> cache manager: drop every cached block no request holds (`/reset_prefix_cache`).
/// Reply: the blocks whose contents were dropped, for the routing host-cache.
#[derive(Message)]
#[rtype(result = "Vec<BlockRef>")]
pub struct ResetPrefixCache;

/// Routing host-cache -> cache manager: these blocks lost their routing rows, so they must stop
/// matching (a hit never lacks rows). No reply; dropped when the manager is gone.
#[derive(Message)]
#[rtype(result = "()")]
pub struct Forget(pub Vec<BlockRef>);

/// Scheduler -> cache manager: current cache figures.
#[derive(Message)]
#[rtype(result = "CacheStats")]
pub struct GetCacheStats;

// ---- to a model runner ----------------------------------------------------------------------

/// Scheduler -> runner: execute one step (restore snapshots, forward, sample, take snapshots) and
/// hand the routing buffer to the copy worker. Reply: the sampled tokens, or the error that
/// failed the step (its requests fail; the runner's tensors are reset).
#[derive(Message)]
#[rtype(result = "Result<StepOutput, String>")]
pub struct Execute(pub StepPlan);

/// Heartbeat -> runner: one dummy forward on the scratch block and scratch state; records no
/// routing, touches no request's KV, state or snapshot. Reply: whether it ran.
#[derive(Message)]
#[rtype(result = "Result<(), String>")]
pub struct DummyForward;

// ---- to the D2H copy worker -----------------------------------------------------------------

/// Runner -> copy worker: a step's routing buffer `(L, N, K)` with the step's slot mapping and
/// block generations. The worker copies it to host memory, returns the buffer to the runner's
/// pool and sends the rows to the routing host-cache. No reply; a gone worker means the buffer
/// is lost and the runner reports the step failed when it runs out of buffers.
#[derive(Message)]
#[rtype(result = "()")]
pub struct CopyRouting {
    /// The step the rows belong to.
    pub step_id: StepId,
    /// The device routing buffer (host memory on the CPU backend).
    pub buffer: RoutingBuffer,
    /// KV slot of each of the step's tokens.
    pub slot_mapping: Vec<usize>,
    /// Every block the step wrote to, with its generation.
    pub blocks: Vec<BlockRef>,
}

// ---- to the routing host-cache --------------------------------------------------------------

/// Copy worker -> routing host-cache: store a step's rows `(L, N, K)` through its slot mapping.
/// Steps arrive in order; the step id becomes the store's watermark. No reply.
#[derive(Message)]
#[rtype(result = "()")]
pub struct StoreStep {
    /// The step.
    pub step_id: StepId,
    /// Expert ids, `(L, N, K)`.
    pub ids: Vec<i16>,
    /// KV slot of each token.
    pub slot_mapping: Vec<usize>,
    /// Blocks written, with their generations.
    pub blocks: Vec<BlockRef>,
}

/// Scheduler -> routing host-cache: a finished sequence's rows `[start, num_rows)` from its block
/// table. Answered only once the store has stored `after_step` (the last step that computed the
/// sequence), so a lagging copy never leaves rows missing. Reply: the rows or the error naming
/// the missing position.
#[derive(Message)]
#[rtype(result = "Result<RoutingRows, String>")]
pub struct Reconstruct {
    /// The sequence's block table with generations.
    pub table: Vec<BlockRef>,
    /// Rows the sequence has: prompt + generated - 1.
    pub num_rows: usize,
    /// Rows to drop from the front.
    pub start: usize,
    /// The last step whose rows are needed.
    pub after_step: StepId,
}

/// Scheduler -> routing host-cache: blocks changed hands (freed, evicted, reset); their rows go.
/// No reply.
#[derive(Message)]
#[rtype(result = "()")]
pub struct FreeBlocks(pub Vec<BlockRef>);

/// Scheduler -> routing host-cache: bytes of rows held (for stats).
#[derive(Message)]
#[rtype(result = "usize")]
pub struct GetRoutingBytes;

// ---- to the heartbeat -----------------------------------------------------------------------

/// Scheduler -> heartbeat: the engine became idle (`true`: nothing running or waiting) or busy.
/// No reply.
#[derive(Message)]
#[rtype(result = "()")]
pub struct SetIdle(pub bool);

// ---- to the scheduler -----------------------------------------------------------------------

/// Handle -> scheduler: a new request; its events go to `events`. Reply: its id, or why it was
/// refused (overloaded, invalid, shutting down).
#[derive(Message)]
#[rtype(result = "Result<RequestId, EngineError>")]
pub struct Submit {
    /// The request.
    pub request: GenerateRequest,
    /// Where its events go.
    pub events: UnboundedSender<RequestEvent>,
}

/// Handle -> scheduler: abort a request (every continuation). No reply; unknown ids are ignored.
#[derive(Message)]
#[rtype(result = "()")]
pub struct Abort(pub RequestId);

/// Handle -> scheduler: the engine's figures.
#[derive(Message)]
#[rtype(result = "EngineStats")]
pub struct GetStats;

/// Handle -> scheduler: reset the prefix cache (between steps). Reply: whether it ran.
#[derive(Message)]
#[rtype(result = "bool")]
pub struct ResetCache;

/// Handle -> scheduler: whether the engine can serve.
#[derive(Message)]
#[rtype(result = "Result<(), EngineError>")]
pub struct Health;

/// Heartbeat -> scheduler: a dummy forward ran (for the stats). No reply.
#[derive(Message)]
#[rtype(result = "()")]
pub struct DummyForwardDone;

/// Handle -> scheduler: stop accepting requests, let in-flight ones finish, then stop the actor
/// system. Reply when drained.
#[derive(Message)]
#[rtype(result = "()")]
pub struct Shutdown;
