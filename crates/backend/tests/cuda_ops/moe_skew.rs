//! The expert sort and the grouped expert products under skewed routing: many chunks of pairs,
//! more experts than the sort has threads, and experts so busy that their rows take several
//! passes in each of the blocks sharing them.

use super::{
    moe::{Experts, Storage, check_sort, moe_forward},
    support::*,
};
use routed_backend::cuda::ops::{ExpertActivation, ExpertShard, MoeSortBuffers};

/// The sort of `ids` over `e` experts on the device: sorted pairs, each pair's row, the starts.
fn sort_on_device(
    dev: &'static routed_backend::cuda::CudaDevice,
    ids: &[i32],
    e: usize,
) -> [Vec<i32>; 3] {
    let mut p = Plan::new(dev);
    let input = p.input(ids);
    let (sorted, rows, starts) =
        (p.output::<i32>(ids.len()), p.output::<i32>(ids.len()), p.output::<i32>(e + 1));
    let m = p.alloc();
    let s = MoeSortBuffers {
        sorted_pairs: m.get(sorted),
        pair_rows: m.get(rows),
        expert_starts: m.get(starts),
    };
    dev.moe_sort(m.get(input), &s, ids.len(), e).unwrap();
    [m.read(sorted), m.read(rows), m.read(starts)]
}

/// The sort equals a stable sort by expert on the host: across chunk boundaries (a chunk is a
/// pair per thread), with an expert's pairs spread over every warp of a chunk and with more
/// experts than threads.
#[test]
fn the_expert_sort_is_a_stable_sort_by_expert() {
    let Some(dev) = gpu_or_skip("the_expert_sort_is_a_stable_sort_by_expert") else { return };
    let mut rng = Rng::new(31);
    // (pairs, experts, share of the pairs on expert 3): one partial chunk; many chunks, skewed;
    // more experts than the sort's 256 threads.
    for (num_pairs, e, hot) in [(5usize, 8usize, 0.0f32), (1_000, 16, 0.7), (2_311, 300, 0.3)] {
        let ids: Vec<i32> = (0..num_pairs)
            .map(|_| match rng.uniform(0.0, 1.0) < hot {
                true => 3,
                false => rng.below(e) as i32,
            })
            .collect();
        let [sorted, rows, starts] = sort_on_device(dev, &ids, e);
        check_sort(&ids, &sorted, &rows, &starts, e);
        let mut want: Vec<i32> = (0..num_pairs as i32).collect();
        want.sort_by_key(|&pair| ids[pair as usize]);
        assert_eq!(sorted, want, "{num_pairs} pairs over {e} experts");
    }
}

/// Router logits that send most tokens to experts 0 and 1, the rest spread over clear margins.
fn skewed_logits(rng: &mut Rng, n: usize, e: usize) -> Vec<f32> {
    let mut logits = super::moe::clear_logits(rng, n, e);
    for row in logits.chunks_exact_mut(e) {
        if rng.uniform(0.0, 1.0) < 0.9 {
            row[0] += 10.0;
            row[1] += 9.0;
        }
    }
    logits
}

/// With most tokens on two experts, each of their column tiles is shared by several blocks that
/// take several passes each: every token's output is still the CPU block's (the `f32` kernels)
/// and, on tensor cores, bitwise the token's output alone.
#[test]
fn busy_experts_split_over_blocks_keep_every_rows_bits() {
    let Some(dev) = gpu_or_skip("busy_experts_split_over_blocks_keep_every_rows_bits") else {
        return;
    };
    let (n, e, k, h, i) = (600, 16, 2, 48, 24);
    let mut rng = Rng::new(32);
    let mut ex = Experts::random(&mut rng, e, h, i);
    let x = rng.vec(n * h, -1.0, 1.0);
    let logits = skewed_logits(&mut rng, n, e);
    let all = ExpertShard::all(e);
    for act in [ExpertActivation::SwiGlu, ExpertActivation::Relu2] {
        ex.storage = Storage::Bf16;
        let run = moe_forward(dev, &ex, &x, &logits, n, k, act, all);
        let busiest = run.expert_starts.windows(2).map(|w| w[1] - w[0]).max().unwrap();
        // 1,200 pairs over 16 experts: up to 19 blocks of 8-row passes share a column tile.
        assert!(busiest > 19 * 8 * 2, "{act:?}: a busy expert's blocks take several passes");
        for t in 0..n {
            let (ids, w) = (&run.ids[t * k..(t + 1) * k], &run.weights[t * k..(t + 1) * k]);
            let want = ex.reference(&x[t * h..(t + 1) * h], ids, w, act);
            assert_bits(&format!("{act:?}: token {t}"), &run.out[t * h..(t + 1) * h], &want);
        }
        ex.storage = Storage::Bf16Mma;
        let run = moe_forward(dev, &ex, &x, &logits, n, k, act, all);
        for t in [0, 1, 299, 599] {
            let alone = moe_forward(dev, &ex, &x[t * h..], &logits[t * e..], 1, k, act, all).out;
            let what = format!("{act:?}: token {t} on tensor cores");
            assert_bits(&what, &run.out[t * h..(t + 1) * h], &alone);
        }
    }
}
