//! The KV/Mamba cache manager actor: owns `routed_cache::KvCacheManager` and answers one
//! [`PlanStep`] per engine step.

use crate::messages::{BlockRef, Forget, GetCacheStats, PlanStep, ResetPrefixCache};
use actix::{Actor, Context, Handler};
use routed_cache::{CacheStats, KvCacheManager};
use routed_scheduler::{CacheStep, GrantedStep};

/// Owns the block pool, prefix hashes and snapshot pool.
pub struct CacheManagerActor {
    manager: KvCacheManager,
}

impl CacheManagerActor {
    /// An actor around `manager`.
    pub fn new(manager: KvCacheManager) -> Self {
        Self { manager }
    }

    fn plan(&mut self, step: CacheStep) -> Result<GrantedStep, String> {
        let m = &mut self.manager;
        // Order matters: publish what the last forward wrote, forget the finished, learn the
        // new and the sampled, and only then plan.
        m.commit(&step.commit).map_err(|e| format!("commit: {e}"))?;
        m.free(&step.free).map_err(|e| format!("free: {e}"))?;
        for request in step.add {
            m.add_request(request).map_err(|e| format!("add: {e}"))?;
        }
        for (id, token) in &step.append {
            m.append_token_ids(*id, std::slice::from_ref(token))
                .map_err(|e| format!("append: {e}"))?;
        }
        let allocation = m
            .allocate_slots(&step.candidates, step.token_budget)
            .map_err(|e| format!("allocate: {e}"))?;
        let tables = allocation
            .grants
            .iter()
            .map(|g| {
                if g.is_admission {
                    let table = m.block_table(g.request_id).expect("granted requests are tracked");
                    table.iter().map(|&b| (b, m.block_pool().generation(b))).collect()
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
    type Result = Result<GrantedStep, String>;

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
    type Result = actix::MessageResult<GetCacheStats>;

    fn handle(&mut self, _: GetCacheStats, _: &mut Context<Self>) -> Self::Result {
        actix::MessageResult(self.manager.stats())
    }
}

/// The stats type the scheduler mirrors.
pub type Stats = CacheStats;
