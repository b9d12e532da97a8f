//! The KV/Mamba cache manager actor: owns `routed_cache::KvCacheManager` and answers one
//! [`PlanStep`] per engine step.

use actix::{Actor, Context, Handler, Message, MessageResult};
use routed_cache::{CacheError, CacheStats, KvCacheManager};
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

/// A [`PlanStep`] the cache refused: which part of it, and why.
#[derive(Debug, thiserror::Error)]
#[error("cache manager, {stage}: {source}")]
pub struct PlanError {
    /// The part of the step: `commit`, `free`, `preempt`, `add`, `append` or `allocate`.
    pub stage: &'static str,
    /// Why.
    pub source: CacheError,
}

/// Owns the block pool, prefix hashes and snapshot pool.
pub struct CacheManagerActor {
    manager: KvCacheManager,
}

impl CacheManagerActor {
    /// An actor around `manager`.
    pub fn new(manager: KvCacheManager) -> Self {
        Self { manager }
    }

    fn plan(&mut self, step: CacheStep) -> Result<GrantedStep, PlanError> {
        let m = &mut self.manager;
        let at = |stage| move |source| PlanError { stage, source };
        // Order matters: publish what the last forward wrote, forget the finished, release the
        // retracted, learn the new and the sampled, and only then plan.
        m.commit(&step.commit).map_err(at("commit"))?;
        m.free(&step.free).map_err(at("free"))?;
        m.preempt(&step.preempt).map_err(at("preempt"))?;
        for seq in step.add {
            m.add_request(seq).map_err(at("add"))?;
        }
        for (id, token) in &step.append {
            m.append_token_ids(*id, std::slice::from_ref(token)).map_err(at("append"))?;
        }
        let allocation =
            m.allocate_slots(&step.candidates, step.token_budget).map_err(at("allocate"))?;
        let tables = allocation
            .grants
            .iter()
            .map(|g| {
                if g.is_admission {
                    let table = m.block_table(g.seq_id).expect("granted sequences are tracked");
                    table.iter().map(|&b| BlockRef::new(b, m.block_pool().generation(b))).collect()
                } else {
                    g.new_blocks.clone()
                }
            })
            .collect();
        Ok(GrantedStep {
            allocation,
            tables,
            dropped_blocks: m.take_dropped_blocks(),
            stats: m.stats(),
        })
    }
}

impl Actor for CacheManagerActor {
    type Context = Context<Self>;
}

impl Handler<PlanStep> for CacheManagerActor {
    type Result = Result<GrantedStep, PlanError>;

    fn handle(&mut self, msg: PlanStep, _: &mut Context<Self>) -> Self::Result {
        self.plan(msg.0)
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
