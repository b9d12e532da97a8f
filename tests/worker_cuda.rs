//! The CUDA worker's routing copy, driven step by step below the actors: a step's rows go to a
//! host slot on the copy stream while the next step computes, and must be that step's rows
//! whenever they are read.
//!
//! On the CUDA simulator a stream's work runs only when something waits for it, so a copy that
//! the next forward does not wait for really is overtaken by it here (on a GPU the same mistake
//! is a race that shows now and then). Without a GPU or the simulator (a build without `cuda`)
//! the test skips, saying why.

use routed::runtime::{
    routing_ring::{CopyEngine, SlotId},
    worker::{CacheShape, CudaLimits, CudaWorker, LockstepId, Worker},
};
use routed::types::{BlockGeneration, BlockId, BlockRef, ScheduledSeq, SeqId, StepId, StepPlan};
use routed_backend::{BackendError, cuda::CudaDevice};
use routed_model::Model;
use routed_test_support::golden_root;
use std::sync::Arc;

const BLOCK_SIZE: usize = 4;

/// A worker for the golden checkpoint of `arch` on GPU 0, else on the simulator, with its caches
/// made; `None` (with the reason printed) in a build without CUDA, or where neither opens outside
/// CI.
fn worker(arch: &str, test: &str) -> Option<CudaWorker> {
    let dev = match std::env::var("ROUTED_CUDA_SIM").is_ok_and(|v| v == "1") {
        true => CudaDevice::simulated(),
        false => CudaDevice::open(0).or_else(|_| CudaDevice::simulated()),
    };
    let dev = match dev {
        Ok(dev) => dev,
        Err(e @ BackendError::CudaNotCompiled) => {
            eprintln!("skipping {test}: {e}");
            return None;
        }
        // A build with CUDA always has the simulator in CI (`.ci/run` builds it).
        Err(e) if std::env::var("CI").is_ok_and(|v| v == "true") => panic!("{test}: {e}"),
        Err(e) => {
            eprintln!("skipping {test}: no GPU and no simulator: {e}");
            return None;
        }
    };
    let model = Model::load(&golden_root().join(arch).join("model"), &mut |_, _| {}).unwrap();
    let limits = CudaLimits {
        max_tokens_per_step: 64,
        max_num_seqs: 4,
        num_snapshot_slots: 0,
        max_model_len: 64,
        cuda_graphs: false,
        device_sampling: true,
    };
    let mut worker = CudaWorker::new(dev, &model, limits).unwrap();
    worker
        .initialize_cache(&CacheShape {
            num_blocks: 9,
            block_size: BLOCK_SIZE,
            num_live_states: 4,
            num_snapshot_slots: 0,
            scratch_block: BlockId(8),
            max_tokens_per_step: 64,
            max_model_len: 64,
            num_routing_slots: 2,
        })
        .unwrap();
    Some(worker)
}

/// A prefill of `prompt` on blocks `first..`, routing captured, nothing sampled.
fn prefill(step: u64, prompt: &[u32], first: u32) -> StepPlan {
    let blocks = prompt.len().div_ceil(BLOCK_SIZE) as u32;
    let table = (first..first + blocks).map(|b| BlockRef::new(BlockId(b), BlockGeneration(1)));
    let seq = ScheduledSeq::prompt_chunk(
        SeqId(first as u64),
        prompt.to_vec(),
        0,
        table.collect::<Vec<_>>(),
    );
    StepPlan { step_id: StepId(step), seqs: vec![seq], capture_routing: true }
}

fn read(engine: &Arc<dyn CopyEngine>, slot: usize, num_tokens: usize) -> Vec<i16> {
    let mut rows = Vec::new();
    engine.read(SlotId(slot), num_tokens, &mut rows).unwrap();
    rows
}

#[test]
fn a_routing_copy_read_after_the_next_step_holds_its_own_step() {
    let test = "a_routing_copy_read_after_the_next_step_holds_its_own_step";
    let Some(mut worker) = worker("qwen3_moe", test) else { return };
    let engine = worker.routing_engine().expect("a MoE model captures routing");
    let a: Vec<u32> = (0..8).map(|i| 3 + 17 * i).collect();
    let b: Vec<u32> = (0..8).map(|i| 500 - 29 * i).collect();

    // Each step's rows, read before anything else runs.
    let mut alone = Vec::new();
    for (step, prompt) in [(0, &a), (1, &b)] {
        worker.execute(&prefill(step, prompt, 0), LockstepId(step)).unwrap();
        engine.submit(SlotId(0), prompt.len()).unwrap();
        alone.push(read(&engine, 0, prompt.len()));
    }
    assert_ne!(alone[0], alone[1], "the prompts must route differently for the test to mean much");

    // A's copy queued, B's forward run (its router writes the same device buffer), then A read.
    worker.execute(&prefill(2, &a, 0), LockstepId(2)).unwrap();
    engine.submit(SlotId(0), a.len()).unwrap();
    worker.execute(&prefill(3, &b, 4), LockstepId(3)).unwrap();
    engine.submit(SlotId(1), b.len()).unwrap();
    assert_eq!(read(&engine, 0, a.len()), alone[0], "step A's slot");
    assert_eq!(read(&engine, 1, b.len()), alone[1], "step B's slot");
}
