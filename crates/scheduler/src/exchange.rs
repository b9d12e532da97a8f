//! The one round trip per step between the scheduler and the cache manager: what the
//! scheduler tells it ([`CacheStep`]), what it answers ([`GrantedStep`]), and how the cache
//! manager turns one into the other ([`CacheStep::plan`]), so that the actor owning the manager
//! and the tests driving both halves without actors run the same exchange.

use routed_cache::{
    CacheError, CacheRequest, CacheStats, CommitEntry, KvCacheManager, SlotRequest, StepAllocation,
};
use routed_types::{BlockRef, SeqId, TokenId};

/// What the cache manager must hear this step, and the step's candidates: the payload of the one
/// round trip per step.
#[derive(Clone, Debug, Default)]
pub struct CacheStep {
    /// Commits of the last forward (publish after compute).
    pub commit: Vec<CommitEntry>,
    /// Requests to start tracking.
    pub add: Vec<CacheRequest>,
    /// Sampled tokens, appended before the step that feeds them back.
    pub append: Vec<(SeqId, TokenId)>,
    /// Finished or aborted sequences whose blocks can be released.
    pub free: Vec<SeqId>,
    /// Running sequences the scheduler retracted (generation paused): their blocks are released
    /// and they wait for re-admission with their tokens, as if the cache had preempted them.
    pub preempt: Vec<SeqId>,
    /// Candidates in priority order: running sequences first (oldest first), then waiting ones.
    pub candidates: Vec<SlotRequest>,
    /// Token budget of the step.
    pub token_budget: usize,
}

/// The cache manager's answer to a [`CacheStep`].
#[derive(Clone, Debug, Default)]
pub struct GrantedStep {
    /// The grants, deferrals and preemptions.
    pub allocation: StepAllocation,
    /// Per grant: the whole block table with generations for an admission; empty for a running
    /// sequence, whose blocks added by the grant are its `new_blocks`.
    pub tables: Vec<Vec<BlockRef>>,
    /// Blocks whose contents died since the last step (evicted, reset): their routing rows go.
    pub dropped_blocks: Vec<BlockRef>,
    /// Cache figures after the step was planned.
    pub stats: CacheStats,
}

/// A [`CacheStep`] the cache manager refused: which part of it, and why. The scheduler broke the
/// protocol (a bug), so the engine stops.
#[derive(Debug, thiserror::Error)]
#[error("cache manager, {stage}: {source}")]
pub struct PlanError {
    /// The part of the step: `commit`, `free`, `preempt`, `add`, `append` or `allocate`.
    pub stage: &'static str,
    /// Why.
    pub source: CacheError,
}

impl CacheStep {
    /// Tells `manager` everything this step carries and plans its candidates.
    pub fn plan(self, manager: &mut KvCacheManager) -> Result<GrantedStep, PlanError> {
        let m = manager;
        let at = |stage| move |source| PlanError { stage, source };
        // Order matters: publish what the last forward wrote, forget the finished, release the
        // retracted, learn the new and the sampled, and only then plan.
        m.commit(&self.commit).map_err(at("commit"))?;
        m.free(&self.free).map_err(at("free"))?;
        m.preempt(&self.preempt).map_err(at("preempt"))?;
        for seq in self.add {
            m.add_request(seq).map_err(at("add"))?;
        }
        for (id, token) in &self.append {
            m.append_token_ids(*id, std::slice::from_ref(token)).map_err(at("append"))?;
        }
        let allocation =
            m.allocate_slots(&self.candidates, self.token_budget).map_err(at("allocate"))?;
        let tables = allocation
            .grants
            .iter()
            .map(|g| {
                if g.is_admission {
                    let table = m.block_table(g.seq_id).expect("granted sequences are tracked");
                    table.iter().map(|&b| BlockRef::new(b, m.block_pool().generation(b))).collect()
                } else {
                    Vec::new()
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
