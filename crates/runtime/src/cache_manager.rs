//! The KV/Mamba cache manager actor: owns `routed_cache::KvCacheManager` and answers one
//! [`PlanStep`] per engine step.

use actix::{Actor, Context, Handler, Message, MessageResult};
use routed_cache::{CacheStats, KvCacheManager};
pub use routed_scheduler::PlanError;
use routed_scheduler::{CacheStep, GrantedStep};
use routed_types::BlockRef;

/// Scheduler -> cache manager, once per step: the commits of the last forward, new sequences,
/// sampled tokens, frees and retractions, then the step's candidates and budget (none while
/// generation is paused). Reply: the grants. A gone manager or an error (the scheduler broke the
/// protocol: a bug) makes the engine unhealthy.
#[derive(Message)]
#[rtype(result = "Result<GrantedStep, PlanError>")]
pub struct PlanStep(pub CacheStep);

/// Scheduler -> cache manager: drop every cached block no sequence holds
/// (`/reset_prefix_cache`, or after a failed step). Reply: the blocks whose contents were dropped,
/// for the routing host-cache.
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

/// Owns the block pool, prefix hashes and snapshot pool.
pub struct CacheManagerActor {
    manager: KvCacheManager,
}

impl CacheManagerActor {
    /// An actor around `manager`.
    pub fn new(manager: KvCacheManager) -> Self {
        Self { manager }
    }
}

impl Actor for CacheManagerActor {
    type Context = Context<Self>;
}

impl Handler<PlanStep> for CacheManagerActor {
    type Result = Result<GrantedStep, PlanError>;

    fn handle(&mut self, msg: PlanStep, _: &mut Context<Self>) -> Self::Result {
        msg.0.plan(&mut self.manager)
    }
}

impl Handler<ResetPrefixCache> for CacheManagerActor {
    type Result = Vec<BlockRef>;

    fn handle(&mut self, _: ResetPrefixCache, _: &mut Context<Self>) -> Self::Result {
        let mut dropped = self.manager.reset_prefix_cache();
        dropped.extend(self.manager.take_dropped_blocks());
        dropped
    }
}

impl Handler<Forget> for CacheManagerActor {
    type Result = ();

    fn handle(&mut self, msg: Forget, _: &mut Context<Self>) {
        self.manager.forget(&msg.0);
    }
}

impl Handler<GetCacheStats> for CacheManagerActor {
    type Result = MessageResult<GetCacheStats>;

    fn handle(&mut self, _: GetCacheStats, _: &mut Context<Self>) -> Self::Result {
        MessageResult(self.manager.stats())
    }
}
