//! Test-only fault injection (the `fault-injection` feature): a step containing a sequence sampled
//! with one of these seeds fails in a chosen way, so the failure handling of the runner, the
//! executor and the scheduler can be tested on real steps.

use super::WorkerError;
use routed_types::StepPlan;

/// Every rank fails the step with [`WorkerError::Injected`] before running it.
pub const FAIL_SEED: u64 = 0xFA17_FA17;

/// Every rank panics inside the step, after the routing buffer was taken and the ranks began it.
pub const PANIC_SEED: u64 = 0xFA17_0BAD;

/// Only the last rank fails (before beginning the step); the others are already waiting for it
/// in the step's first collective, which must release them.
pub const FAIL_LAST_RANK_SEED: u64 = 0xFA17_0001;

fn has_seed(plan: &StepPlan, seed: u64) -> bool {
    plan.seqs.iter().any(|s| s.sample.as_ref().is_some_and(|p| p.0.seed == seed))
}

/// Called by a worker before it begins a step.
pub fn before_step(plan: &StepPlan, rank: usize, num_ranks: usize) -> Result<(), WorkerError> {
    let fails =
        has_seed(plan, FAIL_SEED) || (has_seed(plan, FAIL_LAST_RANK_SEED) && rank + 1 == num_ranks);
    if fails { Err(WorkerError::Injected) } else { Ok(()) }
}

/// Called by a worker inside the step's computation.
pub fn inside_step(plan: &StepPlan) {
    if has_seed(plan, PANIC_SEED) {
        panic!("injected panic inside the forward");
    }
}
