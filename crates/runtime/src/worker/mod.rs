//! The device-neutral seam between the actors and a model.
//!
//! A [`Worker`] is one rank's compute: its part of the weights, its KV blocks and Mamba states,
//! its routing buffer, and the step loop around the model (inputs, forward, sampling). The runner
//! actor that drives it knows nothing of the device: it hands the worker a [`StepPlan`] and gets
//! back an [`ExecutedStep`]; the step's routing leaves through the worker's [`CopyEngine`] (a
//! ring of host slots, see [`crate::routing_ring`]). [`CpuWorker`] runs the CPU reference
//! backend; [`CudaWorker`] a CUDA device (a stand-in that never opens without the `cuda`
//! feature, so no call site needs `cfg`).
//!
//! Sizing follows vLLM's worker protocol: load the model, ask how many bytes one KV block takes
//! ([`Worker::kv_block_bytes`]), choose the number of blocks, then [`Worker::initialize_cache`].

mod cpu;
#[cfg(feature = "cuda")]
mod cuda;
#[cfg(not(feature = "cuda"))]
#[path = "cuda_stub.rs"]
mod cuda;
#[cfg(feature = "cuda")]
mod cuda_copy;
#[cfg(feature = "fault-injection")]
pub mod faults;
mod sampling;

pub use cpu::CpuWorker;
pub use cuda::CudaWorker;

use crate::{
    MemoryTags,
    routing_ring::{CopyEngine, CopyError},
};
use routed_backend::{BackendError, collective::Collective, cpu::MatmulPrecision};
use routed_model::{Model, ModelConfig, ModelError};
use routed_types::{BlockId, BlockRef, RoutingMeta, StepOutput, StepPlan};
use std::{path::Path, sync::Arc, time::Duration};

/// Numbers the units the ranks execute in lockstep: every engine step and every dummy forward, in
/// the order the executor sends them. Every rank of a unit gets the same id, which the ranks'
/// collectives check.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct LockstepId(pub u64);

/// Aborts a lockstep unit for the other ranks unless disarmed: whatever makes this rank leave the
/// unit early (an error, a panic unwinding through the step) releases the ranks waiting for it.
pub(crate) struct AbortOnExit {
    ranks: Arc<dyn Collective>,
    unit: LockstepId,
    armed: bool,
}

impl AbortOnExit {
    pub(crate) fn new(ranks: Arc<dyn Collective>, unit: LockstepId) -> Self {
        Self { ranks, unit, armed: true }
    }

    pub(crate) fn disarm(mut self) {
        self.armed = false;
    }
}

impl Drop for AbortOnExit {
    fn drop(&mut self) {
        if self.armed {
            self.ranks.abort(self.unit.0);
        }
    }
}

/// How a worker's caches are sized. Identical on every rank.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CacheShape {
    /// KV blocks, the scratch block included.
    pub num_blocks: usize,
    /// Tokens per block.
    pub block_size: usize,
    /// Live Mamba state slots (one per running sequence).
    pub num_live_states: usize,
    /// Mamba snapshot slots.
    pub num_snapshot_slots: usize,
    /// The block dummy forwards write to; no sequence ever holds it.
    pub scratch_block: BlockId,
    /// Most tokens in one step: rows of the routing buffer.
    pub max_tokens_per_step: usize,
    /// Longest prompt + output: positions stay below it.
    pub max_model_len: usize,
    /// Host slots the routing buffer is copied into (see [`crate::routing_ring`]).
    pub num_routing_slots: usize,
}

/// What a device worker's pools besides the KV blocks are sized for, known before the KV pool is
/// (so the memory left for KV blocks can be computed).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CudaLimits {
    /// Most tokens in one step.
    pub max_tokens_per_step: usize,
    /// Most sequences running at once (live state slots, sequences in one step).
    pub max_num_seqs: usize,
    /// Mamba snapshot slots.
    pub num_snapshot_slots: usize,
    /// Longest prompt + output (rows of the rotary table, block-table entries).
    pub max_model_len: usize,
    /// Whether decode steps replay CUDA graphs (else every step is launched eagerly).
    pub cuda_graphs: bool,
    /// Whether tokens and logprobs are computed on the device (else on the host, from logits).
    pub device_sampling: bool,
}

/// One executed step: what the scheduler gets, and what the copy worker needs to store the step's
/// routing.
#[derive(Debug)]
pub struct ExecutedStep {
    /// Sampled tokens (rank 0; other ranks sample nothing).
    pub output: StepOutput,
    /// KV slot of every token of the step, in batch order.
    pub slot_mapping: Vec<usize>,
    /// Every block the step wrote, with its generation.
    pub blocks: Vec<BlockRef>,
    /// The time on the device's clock from the step's first work to its sampled tokens (two
    /// events; gaps while the device waited for launches count): set by a GPU worker, `None`
    /// where there is no device clock (the CPU, the CUDA simulator).
    pub device_time: Option<Duration>,
}

/// Why a worker could not execute a step or a dummy forward. The step's requests fail; the engine
/// resets its prefix cache, since the worker's tensors may be half-written.
#[derive(Debug, thiserror::Error)]
pub enum WorkerError {
    /// The model refused the step's inputs or failed in the forward (a collective included).
    #[error(transparent)]
    Model(#[from] ModelError),
    /// A step arrived before [`Worker::initialize_cache`].
    #[error("the worker's caches are not initialised")]
    NotInitialized,
    /// The step panicked; the panic was contained.
    #[error("panicked: {0}")]
    Panicked(String),
    /// The D2H copy worker is gone, so the step's routing cannot be stored.
    #[error("the D2H copy worker is gone; the step's routing cannot be stored")]
    CopyWorkerGone,
    /// The step's routing could not be queued for its copy to the host.
    #[error("routing copy: {0}")]
    RoutingCopy(#[from] CopyError),
    /// The device failed (a CUDA call, an allocation); the worker's tensors may be lost.
    #[error("device: {0}")]
    Device(String),
    /// The runner has no worker (it was lost to an earlier failure).
    #[error("the runner has no worker")]
    NoWorker,
    /// A fault injected by a test (`fault-injection` feature).
    #[error("injected runner failure")]
    Injected,
    /// New weights cannot replace the ones in use (another configuration or layout), or none are
    /// staged.
    #[error("{0}")]
    Weights(String),
    /// A step or dummy forward needs memory that is released ([`Worker::release_memory`]).
    #[error("the {0} are released")]
    Released(&'static str),
}

impl From<BackendError> for WorkerError {
    fn from(e: BackendError) -> Self {
        Self::Model(ModelError::Device(e))
    }
}

impl WorkerError {
    /// Whether this rank failed only because another rank aborted the unit: the other rank's
    /// error is the cause worth reporting.
    pub fn is_abort_by_peer(&self) -> bool {
        matches!(
            self,
            Self::Model(ModelError::Collective(
                routed_backend::collective::CollectiveError::Aborted { .. }
            ))
        )
    }
}

/// One rank's compute: weights, KV and Mamba tensors, and the step loop around the model.
pub trait Worker: Send {
    /// The device, in words (`cpu`, `cuda:0 (NVIDIA H100)`).
    fn device(&self) -> String;

    /// This worker's rank in the expert-parallel group.
    fn rank(&self) -> usize;

    /// The model's normalised configuration.
    fn config(&self) -> &ModelConfig;

    /// What a routing consumer needs to read this model's rows (`None` without MoE layers).
    fn routing_meta(&self) -> Option<RoutingMeta>;

    /// Bytes of weights one decoded token reads (for the bandwidth roofline).
    fn weight_bytes_per_token(&self) -> usize;

    /// Bytes one KV block of `block_size` tokens takes on this worker's device.
    fn kv_block_bytes(&self, block_size: usize) -> usize;

    /// Most bytes the KV blocks may take on the device: what is free once the weights and the
    /// other pools are accounted for. `None` when the device sets no limit of its own (the CPU).
    fn kv_memory_limit(&self, _block_size: usize) -> Option<usize> {
        None
    }

    /// Allocates the KV blocks, Mamba states and the routing buffer with its host slots; called
    /// once, before the first step.
    fn initialize_cache(&mut self, shape: &CacheShape) -> Result<(), WorkerError>;

    /// The engine that copies the routing buffer `(L, N, K)`, which every forward writes, into
    /// host slots. `None` before [`Worker::initialize_cache`] and for a model without MoE layers.
    fn routing_engine(&self) -> Option<Arc<dyn CopyEngine>>;

    /// Executes one step of lockstep unit `unit`: restores the snapshots the plan names, runs the
    /// forward (writing every MoE layer's expert ids into the routing buffer, where they stay
    /// until the next forward), samples (rank 0), takes the planned snapshots. A rank that fails
    /// aborts the unit for the other ranks before it returns.
    fn execute(&mut self, plan: &StepPlan, unit: LockstepId) -> Result<ExecutedStep, WorkerError>;

    /// One forward of a single token on the scratch block and the scratch state slot, as part of
    /// lockstep unit `unit`. Records no routing (the routing buffer is left as it was) and touches
    /// no sequence's KV, state or snapshot.
    fn dummy_forward(&mut self, unit: LockstepId) -> Result<(), WorkerError>;

    /// Releases the other ranks from unit `unit`, which this rank cannot take part in (it failed
    /// before handing the unit to the worker).
    fn abort(&self, unit: LockstepId);

    /// Loads this rank's part of the checkpoint in `dir` beside the weights in use, refusing one
    /// whose configuration or tensor layout differs from the served model's (the error names
    /// what). Nothing in use changes until [`Worker::commit_weights`]; a second stage replaces
    /// the first.
    fn stage_weights(&mut self, dir: &Path) -> Result<(), WorkerError>;

    /// Replaces the weights in use with the staged ones. No step is in flight; the KV blocks and
    /// states keep what the old weights computed, so the engine drops its prefix cache after.
    /// A failure here is the device's: the weights may then be half written.
    fn commit_weights(&mut self) -> Result<(), WorkerError>;

    /// Drops the staged weights, if any (another rank refused its part).
    fn discard_weights(&mut self);

    /// Gives back the memory of `tags` (see [`MemoryTags`]): the KV blocks and states lose what
    /// they held, the weights are dropped. No step or dummy forward that needs them is sent until
    /// they are resumed. Returns the bytes freed.
    fn release_memory(&mut self, tags: MemoryTags) -> Result<usize, WorkerError>;

    /// Takes the memory of `tags` again, if released: empty KV blocks and states, the weights
    /// loaded from the checkpoint in `dir` (the one served; refused as [`Worker::stage_weights`]
    /// refuses one, and then still released). Returns the bytes allocated.
    fn resume_memory(&mut self, tags: MemoryTags, dir: &Path) -> Result<usize, WorkerError>;
}

/// This rank's part of the checkpoint in `dir` for an update of a model configured as `served`,
/// loaded on the host for the rank of `ranks` with matrices in `precision`. Refused, naming the
/// first difference, when its configuration differs from `served`.
pub(crate) fn load_update(
    served: &ModelConfig,
    ranks: Arc<dyn Collective>,
    precision: MatmulPrecision,
    dir: &Path,
) -> Result<Model, WorkerError> {
    let config = ModelConfig::from_dir(dir)?;
    if let Some(difference) = served.mismatch(&config) {
        return Err(WorkerError::Weights(format!(
            "the checkpoint in {} is not the served model's: {difference}",
            dir.display()
        )));
    }
    let mut model = Model::load_rank(dir, ranks, &mut |_, _| {})?;
    model.set_matmul_precision(precision);
    Ok(model)
}

/// A checkpoint that cannot be loaded, as a refusal of the weights (not a failure of the device).
pub(crate) fn as_refusal(e: WorkerError) -> WorkerError {
    match e {
        WorkerError::Model(e) => WorkerError::Weights(e.to_string()),
        other => other,
    }
}

/// Every block a step writes: for each sequence, the blocks covering the positions it computes.
/// Sorted and without repeats.
pub fn written_blocks(plan: &StepPlan, block_size: usize) -> Vec<BlockRef> {
    let mut blocks = Vec::with_capacity(plan.seqs.len());
    for s in &plan.seqs {
        let end = s.num_computed_tokens + s.token_ids.len();
        if end > s.num_computed_tokens {
            let covering = s.num_computed_tokens / block_size..end.div_ceil(block_size);
            blocks.extend_from_slice(&s.block_table[covering]);
        }
    }
    blocks.sort_unstable();
    blocks.dedup();
    blocks
}

#[cfg(test)]
mod tests {
    use super::*;
    use routed_types::{BlockGeneration, ScheduledSeq, SeqId};

    /// A sequence of `len` tokens after `computed`, on the blocks of `table`, without sampling.
    pub(super) fn seq(computed: usize, len: usize, table: &[u32]) -> ScheduledSeq {
        let blocks: Vec<_> =
            table.iter().map(|&b| BlockRef::new(BlockId(b), BlockGeneration(b + 100))).collect();
        ScheduledSeq::prompt_chunk(SeqId(table[0] as u64), vec![1; len], computed, blocks)
    }

    #[test]
    fn written_blocks_are_the_blocks_under_the_computed_positions() {
        let plan = StepPlan {
            seqs: vec![
                // Positions 3..9 with blocks of 4: blocks 0, 1 and 2 of the table.
                seq(3, 6, &[7, 8, 9, 10]),
                // One decode token at position 4: the second block only.
                seq(4, 1, &[2, 5]),
            ],
            ..StepPlan::default()
        };
        let got: Vec<u32> = written_blocks(&plan, 4).iter().map(|b| b.block.0).collect();
        assert_eq!(got, [5, 7, 8, 9]);
        assert!(written_blocks(&plan, 4).iter().all(|b| b.generation.0 == b.block.0 + 100));
    }
}
