//! The router, the expert sort, the grouped expert products and the combine: against the CPU MoE
//! block's math, and bitwise the same for a token whatever else is routed with it.

use super::support::*;
use half::bf16;
use routed_backend::{
    cpu::{self, Matrix, MatrixData},
    cuda::{
        ArenaLayout, CudaDevice, DeviceArena, Span,
        host::PinnedBuffer,
        ops::{ExpertActivation, ExpertShard, MoeSortBuffers, RouterKind, RouterParams, Weights},
        pools::RoutingBuffer,
    },
};

/// The model crate's router (`layers/router.rs`) over one token, with backend primitives.
fn route(
    kind: RouterKind,
    logits: &[f32],
    bias: Option<&[f32]>,
    k: usize,
) -> (Vec<usize>, Vec<f32>) {
    let top_k = |scores: &[f32], k: usize| {
        let mut ids = Vec::with_capacity(k);
        for _ in 0..k {
            let mut best = usize::MAX;
            for (e, &s) in scores.iter().enumerate() {
                if !ids.contains(&e) && (best == usize::MAX || s > scores[best]) {
                    best = e;
                }
            }
            ids.push(best);
        }
        ids
    };
    let normalize = |w: &mut Vec<f32>, eps: f32| {
        let sum: f32 = w.iter().sum::<f32>() + eps;
        w.iter_mut().for_each(|x| *x /= sum);
    };
    let mut scores = logits.to_vec();
    match kind {
        RouterKind::SoftmaxTopK { renormalize } => {
            cpu::softmax_inplace(&mut scores);
            let ids = top_k(&scores, k);
            let mut w: Vec<f32> = ids.iter().map(|&e| scores[e]).collect();
            if renormalize {
                normalize(&mut w, 0.0);
            }
            (ids, w)
        }
        RouterKind::TopKSoftmax => {
            let ids = top_k(&scores, k);
            let mut w: Vec<f32> = ids.iter().map(|&e| scores[e]).collect();
            cpu::softmax_inplace(&mut w);
            (ids, w)
        }
        RouterKind::SigmoidGrouped { num_groups, topk_groups, renormalize, scaling } => {
            scores.iter_mut().for_each(|s| *s = 1.0 / (1.0 + (-*s).exp()));
            let mut choice: Vec<f32> =
                scores.iter().enumerate().map(|(e, s)| s + bias.map_or(0.0, |b| b[e])).collect();
            if num_groups > 1 && topk_groups < num_groups {
                let per = choice.len() / num_groups;
                let group_scores: Vec<f32> = choice
                    .chunks_exact(per)
                    .map(|g| top_k(g, 2.min(per)).iter().map(|&i| g[i]).sum())
                    .collect();
                let keep = top_k(&group_scores, topk_groups);
                for g in (0..num_groups).filter(|g| !keep.contains(g)) {
                    choice[g * per..(g + 1) * per].fill(f32::NEG_INFINITY);
                }
            }
            let ids = top_k(&choice, k);
            let mut w: Vec<f32> = ids.iter().map(|&e| scores[e]).collect();
            if renormalize {
                normalize(&mut w, 1e-20);
            }
            w.iter_mut().for_each(|x| *x *= scaling);
            (ids, w)
        }
    }
}

/// Logits on a grid of distinct values 0.05 apart, shuffled per token: every score margin is
/// clear.
pub fn clear_logits(rng: &mut Rng, n: usize, experts: usize) -> Vec<f32> {
    let mut out = Vec::with_capacity(n * experts);
    for _ in 0..n {
        let mut row: Vec<f32> = (0..experts).map(|e| e as f32 * 0.05 - 1.5).collect();
        rng.shuffle(&mut row);
        out.extend(row);
    }
    out
}

#[test]
fn router_ids_and_weights_equal_the_cpu_router() {
    let Some(dev) = gpu_or_skip("router_ids_and_weights_equal_the_cpu_router") else { return };
    let (n, e, k) = (300, 64, 8);
    let mut rng = Rng::new(21);
    let mut logits = clear_logits(&mut rng, n, e);
    // Exact ties: the lower id first, on both sides.
    logits[..e].fill(0.5);
    let bias = rng.vec(e, -0.05, 0.05);
    let kinds = [
        RouterKind::SoftmaxTopK { renormalize: true },
        RouterKind::SoftmaxTopK { renormalize: false },
        RouterKind::TopKSoftmax,
        RouterKind::SigmoidGrouped {
            num_groups: 8,
            topk_groups: 4,
            renormalize: true,
            scaling: 2.5,
        },
        RouterKind::SigmoidGrouped {
            num_groups: 1,
            topk_groups: 1,
            renormalize: false,
            scaling: 1.0,
        },
    ];
    for kind in kinds {
        let mut p = Plan::new(dev);
        let (ls, bs, ids, ws) =
            (p.input(&logits), p.input(&bias), p.output::<i32>(n * k), p.output::<f32>(n * k));
        let mut layout = ArenaLayout::new("routing");
        let routing = RoutingBuffer::reserve(&mut layout, 3, 512, k);
        let arena = DeviceArena::new(dev, &layout).unwrap();
        let m = p.alloc();
        let params = RouterParams { kind, num_experts: e, top_k: k };
        let plane = arena.get(routing.plane(1).unwrap()).unwrap();
        let sigmoid = matches!(kind, RouterKind::SigmoidGrouped { .. });
        let bias_arg = sigmoid.then(|| m.get(bs));
        dev.moe_router(&params, m.get(ls), bias_arg, m.get(ids), m.get(ws), Some(plane), n)
            .unwrap();
        let (got_ids, got_w) = (m.read(ids), m.read(ws));
        let planes = arena.download(routing.ids).unwrap();
        for t in 0..n {
            let (want_ids, want_w) =
                route(kind, &logits[t * e..(t + 1) * e], sigmoid.then_some(&bias[..]), k);
            let got: Vec<usize> = got_ids[t * k..(t + 1) * k].iter().map(|&i| i as usize).collect();
            assert_eq!(got, want_ids, "{kind:?}: ids of token {t}");
            let in_plane: Vec<usize> =
                planes[512 * k + t * k..][..k].iter().map(|&i| i as usize).collect();
            assert_eq!(in_plane, want_ids, "{kind:?}: routing buffer plane 1, token {t}");
            let scale = max_abs(&want_w);
            assert_close(
                &format!("{kind:?}: weights of token {t}"),
                &got_w[t * k..(t + 1) * k],
                &want_w,
                tol::ROUTER_WEIGHT,
                scale,
            );
        }
        assert!(planes[..512 * k].iter().all(|&i| i == 0), "{kind:?}: plane 0 untouched");
        // The routing rows reach the host through a flags-0 pinned buffer on the copy stream.
        let mut pinned = PinnedBuffer::<i16>::new(dev, n * k).unwrap();
        let done = dev.new_event().unwrap();
        done.record(dev.compute_stream()).unwrap();
        dev.copy_stream().wait(&done).unwrap();
        pinned.copy_from(plane.sub(0, n * k).unwrap(), dev.copy_stream()).unwrap();
        assert_eq!(pinned.wait().unwrap(), &planes[512 * k..512 * k + n * k]);
        // The step's rows of every plane in one strided copy, packed plane after plane.
        let mut rows = PinnedBuffer::<i16>::new(dev, 3 * n * k).unwrap();
        let all = arena.get(routing.ids).unwrap();
        rows.queue_copy_rows_from(all, (3, n * k, 512 * k), dev.copy_stream()).unwrap();
        rows.record(dev.copy_stream()).unwrap();
        let want: Vec<i16> =
            (0..3).flat_map(|l| planes[l * 512 * k..][..n * k].iter().copied()).collect();
        assert_eq!(rows.wait().unwrap(), &want[..], "{kind:?}: rows of every plane");
        let too_far = rows.queue_copy_rows_from(all, (3, n * k + 1, 512 * k), dev.copy_stream());
        assert!(too_far.is_err(), "the runs must fit the buffer");
    }
}

/// The exchange between expert-parallel ranks moves one rank's rows to the host at their own
/// offset and the other ranks' rows back around them.
#[test]
fn pinned_buffers_copy_at_an_offset() {
    let Some(dev) = gpu_or_skip("pinned_buffers_copy_at_an_offset") else { return };
    let data: Vec<f32> = (0..40).map(|i| i as f32).collect();
    let mut p = Plan::new(dev);
    let (src, dst) = (p.input(&data), p.output::<f32>(40));
    let m = p.alloc();
    let mut host = PinnedBuffer::<f32>::new(dev, 40).unwrap();
    host.host_mut().unwrap().fill(-1.0);
    let stream = dev.compute_stream();
    host.copy_from_at(m.get(src).sub(10, 5).unwrap(), 20, stream).unwrap();
    let got = host.wait().unwrap();
    assert_eq!(&got[20..25], &data[10..15]);
    assert!(got[..20].iter().chain(&got[25..]).all(|&v| v == -1.0), "only elements 20..25");
    host.copy_to_at(m.get(dst).sub(3, 6).unwrap(), 19, stream).unwrap();
    let mut want = vec![0.0f32; 40];
    want[3] = -1.0;
    want[4..9].copy_from_slice(&data[10..15]);
    assert_eq!(m.read(dst), want);
    assert!(host.copy_from_at(m.get(src).sub(0, 5).unwrap(), 36, stream).is_err(), "past the end");
    assert!(host.copy_to_at(m.get(dst).sub(0, 5).unwrap(), 36, stream).is_err(), "past the end");
}

/// The MoE block's weights: experts `[E, I, H]` (gate, up) and `[E, H, I]` (down).
pub struct Experts {
    pub gate: Vec<bf16>,
    pub up: Vec<bf16>,
    pub down: Vec<bf16>,
    pub e: usize,
    pub h: usize,
    pub i: usize,
    /// How the weights are uploaded, and so which expert kernels run.
    pub storage: Storage,
}

/// The expert kernels a run takes, by the weights' storage and arithmetic.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Storage {
    /// bf16, the CPU's arithmetic.
    Bf16,
    /// bf16 in bf16 precision: the tensor-core kernels.
    Bf16Mma,
    /// Widened to f32.
    F32,
}

/// A weight buffer in the storage [`Experts::storage`] picks.
#[derive(Clone, Copy)]
enum WeightSpan {
    Bf16(Span<bf16>),
    F32(Span<f32>),
}

impl Experts {
    /// `e` experts of width `i` over `h`, weights uniform in [-0.3, 0.3).
    pub fn random(rng: &mut Rng, e: usize, h: usize, i: usize) -> Self {
        Self {
            gate: rng.bf16_vec(e * i * h, -0.3, 0.3),
            up: rng.bf16_vec(e * i * h, -0.3, 0.3),
            down: rng.bf16_vec(e * h * i, -0.3, 0.3),
            e,
            h,
            i,
            storage: Storage::Bf16,
        }
    }

    fn matrix(&self, w: &[bf16], expert: usize, rows: usize, cols: usize) -> Matrix {
        Matrix::new(
            rows,
            cols,
            MatrixData::Bf16(w[expert * rows * cols..(expert + 1) * rows * cols].to_vec()),
        )
    }

    /// The CPU block's output for one token given its ids and weights (ranks in order).
    pub fn reference(&self, x: &[f32], ids: &[i32], w: &[f32], act: ExpertActivation) -> Vec<f32> {
        let mut out = vec![0.0f32; self.h];
        for (&e, &wt) in ids.iter().zip(w) {
            let e = e as usize;
            let mut up = vec![0.0; self.i];
            cpu::linear(x, &self.matrix(&self.up, e, self.i, self.h), &mut up);
            match act {
                ExpertActivation::SwiGlu => {
                    let mut gate = vec![0.0; self.i];
                    cpu::linear(x, &self.matrix(&self.gate, e, self.i, self.h), &mut gate);
                    cpu::mul_silu_inplace(&mut up, &gate);
                }
                ExpertActivation::Relu2 => cpu::relu2_inplace(&mut up),
            }
            let mut y = vec![0.0; self.h];
            cpu::linear(&up, &self.matrix(&self.down, e, self.h, self.i), &mut y);
            out.iter_mut().zip(&y).for_each(|(a, b)| *a += wt * b);
        }
        out
    }
}

/// What [`moe_forward`] read back.
pub struct MoeRun {
    pub out: Vec<f32>,
    pub ids: Vec<i32>,
    pub weights: Vec<f32>,
    /// The pair of each sorted row, -1 for padding.
    pub sorted_pairs: Vec<i32>,
    /// The activated up projections' rows, in sorted order.
    pub act: Vec<f32>,
    /// The expert products' rows, in sorted order.
    pub expert_out: Vec<f32>,
    /// Each expert's first sorted row, and the end.
    pub expert_starts: Vec<i32>,
}

/// Router, sort, the experts of `shard` and combine for the first `n` tokens.
#[allow(clippy::too_many_arguments)] // the block's inputs and shape
pub fn moe_forward(
    dev: &'static CudaDevice,
    ex: &Experts,
    x: &[f32],
    logits: &[f32],
    n: usize,
    k: usize,
    act: ExpertActivation,
    shard: ExpertShard,
) -> MoeRun {
    let (e, h, i) = (ex.e, ex.h, ex.i);
    // The sorted layout: a row per pair.
    let (pairs, rows) = (n * k, n * k);
    let local = |w: &[bf16]| {
        let per = w.len() / e;
        w[shard.first * per..(shard.first + shard.num_local) * per].to_vec()
    };
    let mut p = Plan::new(dev);
    let mut weights = |w: &[bf16]| match ex.storage {
        Storage::F32 => {
            WeightSpan::F32(p.input(&local(w).iter().map(|v| v.to_f32()).collect::<Vec<_>>()))
        }
        Storage::Bf16 | Storage::Bf16Mma => WeightSpan::Bf16(p.input(&local(w))),
    };
    let (gs, us, ds) = (weights(&ex.gate), weights(&ex.up), weights(&ex.down));
    let (xs, ls) = (p.input(&x[..n * h]), p.input(&logits[..n * e]));
    let (ids, ws) = (p.output::<i32>(pairs), p.output::<f32>(pairs));
    let sorted = p.output::<i32>(rows);
    let pair_rows = p.output::<i32>(pairs);
    let starts = p.output::<i32>(e + 1);
    let (acts, eout, out) =
        (p.output::<f32>(rows * i), p.output::<f32>(rows * h), p.output::<f32>(n * h));
    let m = p.alloc();
    let params = RouterParams {
        kind: RouterKind::SoftmaxTopK { renormalize: true },
        num_experts: e,
        top_k: k,
    };
    dev.moe_router(&params, m.get(ls), None, m.get(ids), m.get(ws), None, n).unwrap();
    let sort = MoeSortBuffers {
        sorted_pairs: m.get(sorted),
        pair_rows: m.get(pair_rows),
        expert_starts: m.get(starts),
    };
    dev.moe_sort(m.get(ids), &sort, pairs, e).unwrap();
    let get = |s: WeightSpan| match (s, ex.storage) {
        (WeightSpan::Bf16(s), Storage::Bf16Mma) => Weights::Bf16Mma(m.get(s)),
        (WeightSpan::Bf16(s), _) => Weights::Bf16(m.get(s)),
        (WeightSpan::F32(s), _) => Weights::F32(m.get(s)),
    };
    let gate = (act == ExpertActivation::SwiGlu).then(|| get(gs));
    let (x, up, a) = (m.get(xs), get(us), m.get(acts));
    dev.moe_expert_up(x, up, gate, &sort, a, act, (n, k), shard, (h, i)).unwrap();
    dev.moe_expert_down(a, get(ds), &sort, m.get(eout), (pairs, shard), (h, i)).unwrap();
    dev.moe_combine(m.get(eout), m.get(pair_rows), m.get(ws), None, m.get(out), (n, k), h).unwrap();
    let (got_ids, sorted_pairs, rows_of) = (m.read(ids), m.read(sorted), m.read(pair_rows));
    let starts = m.read(starts);
    check_sort(&got_ids, &sorted_pairs, &rows_of, &starts, e);
    MoeRun {
        out: m.read(out),
        ids: got_ids,
        weights: m.read(ws),
        sorted_pairs,
        act: m.read(acts),
        expert_out: m.read(eout),
        expert_starts: starts,
    }
}

/// The sort's invariants: experts ascending, pairs ascending within an expert, every pair once,
/// each expert's rows from its start to the next expert's.
pub fn check_sort(ids: &[i32], sorted: &[i32], rows_of: &[i32], starts: &[i32], e: usize) {
    assert_eq!((starts.len(), starts[0], starts[e]), (e + 1, 0, ids.len() as i32), "{starts:?}");
    let mut last: Option<(i32, i32)> = None;
    for (row, &pair) in sorted.iter().enumerate() {
        let expert = ids[pair as usize];
        let owner = starts.partition_point(|&s| s <= row as i32) - 1;
        assert_eq!(expert as usize, owner, "row {row} between expert {owner}'s starts");
        assert_eq!(rows_of[pair as usize], row as i32, "pair {pair}'s row");
        if let Some(prev) = last {
            assert!(
                prev < (expert, pair),
                "sorted by (expert, pair): {prev:?} then {:?}",
                (expert, pair)
            );
        }
        last = Some((expert, pair));
    }
    let mut seen = vec![false; ids.len()];
    for &pair in sorted {
        assert!(!std::mem::replace(&mut seen[pair as usize], true), "pair {pair} twice");
    }
}

fn moe_case(name: &str, act: ExpertActivation, seed: u64) {
    let Some(dev) = gpu_or_skip(name) else { return };
    // hidden 144: the up products run the dot loop's unrolled stripes and its tail.
    let (n, e, k, h, i) = (512, 16, 4, 144, 40);
    let mut rng = Rng::new(seed);
    let ex = Experts::random(&mut rng, e, h, i);
    let x = rng.vec(n * h, -1.0, 1.0);
    let logits = clear_logits(&mut rng, n, e);
    let all = ExpertShard::all(e);
    let MoeRun { out: full, ids, weights: w, .. } =
        moe_forward(dev, &ex, &x, &logits, n, k, act, all);
    for t in 0..n {
        let want = ex.reference(
            &x[t * h..(t + 1) * h],
            &ids[t * k..(t + 1) * k],
            &w[t * k..(t + 1) * k],
            act,
        );
        assert_bits(&format!("{name}: token {t}"), &full[t * h..(t + 1) * h], &want);
    }
    for b in BATCHES {
        let got = moe_forward(dev, &ex, &x, &logits, b, k, act, all).out;
        assert_bits(&format!("{name}: first {b} tokens"), &got, &full[..b * h]);
    }
    // A token alone, from the middle of the batch.
    for t in [3, 200, 511] {
        let got = moe_forward(dev, &ex, &x[t * h..], &logits[t * e..], 1, k, act, all).out;
        assert_bits(&format!("{name}: token {t} alone"), &got, &full[t * h..(t + 1) * h]);
    }
}

#[test]
fn swiglu_experts_equal_the_cpu_block_whatever_the_batch() {
    moe_case("swiglu_experts_equal_the_cpu_block_whatever_the_batch", ExpertActivation::SwiGlu, 22);
}

/// f32 expert weights (an f32 or f16 checkpoint) go through the `_f32w` kernels: with the same
/// values as bf16 weights widened, every output has the bf16 kernels' bits; in a step of 45
/// tokens (the staged kernels) and of 3 (at most a pair per expert: the row kernels).
#[test]
fn f32_expert_weights_give_the_bf16_kernels_bits() {
    let Some(dev) = gpu_or_skip("f32_expert_weights_give_the_bf16_kernels_bits") else { return };
    let (e, k, h, i) = (8, 2, 40, 24);
    let mut rng = Rng::new(26);
    let mut ex = Experts::random(&mut rng, e, h, i);
    for n in [45, 3] {
        let x = rng.vec(n * h, -1.0, 1.0);
        let logits = clear_logits(&mut rng, n, e);
        for act in [ExpertActivation::SwiGlu, ExpertActivation::Relu2] {
            let what = format!("{n} tokens, {act:?}");
            ex.storage = Storage::Bf16;
            let want = moe_forward(dev, &ex, &x, &logits, n, k, act, ExpertShard::all(e));
            ex.storage = Storage::F32;
            let got = moe_forward(dev, &ex, &x, &logits, n, k, act, ExpertShard::all(e));
            assert_bits(&format!("{what}: f32 storage"), &got.out, &want.out);
            assert!(want.out.iter().any(|&v| v != 0.0), "{what}: the outputs are not all zero");
        }
    }
}

#[test]
fn relu2_experts_equal_the_cpu_block_whatever_the_batch() {
    moe_case("relu2_experts_equal_the_cpu_block_whatever_the_batch", ExpertActivation::Relu2, 23);
}

/// Under expert parallelism each rank runs only its slice of the experts (weights stacked from
/// its first expert): its rows are bitwise the single rank's, the other ranks' rows are left
/// untouched, and the ranks' slices of the sorted rows tile the whole; with either kernels, and
/// in a step of 37 tokens (the staged kernels) and of 4 (at most a pair per expert: the `f32`
/// row kernels).
#[test]
fn expert_slices_compute_their_own_rows_only() {
    let Some(dev) = gpu_or_skip("expert_slices_compute_their_own_rows_only") else { return };
    let (e, k, h, i) = (16, 4, 48, 24);
    let mut rng = Rng::new(25);
    let mut ex = Experts::random(&mut rng, e, h, i);
    for n in [37, 4] {
        let x = rng.vec(n * h, -1.0, 1.0);
        let logits = clear_logits(&mut rng, n, e);
        // The CPU's arithmetic, then the tensor-core kernels.
        for storage in [Storage::Bf16, Storage::Bf16Mma] {
            ex.storage = storage;
            check_expert_slices(dev, &ex, &x, &logits, (n, k), &format!("{n} tokens, {storage:?}"));
        }
    }
}

/// One step's expert slices over 4 ranks against the whole
/// (`expert_slices_compute_their_own_rows_only`).
fn check_expert_slices(
    dev: &'static CudaDevice,
    ex: &Experts,
    x: &[f32],
    logits: &[f32],
    (n, k): (usize, usize),
    step: &str,
) {
    let (e, h, num_ranks) = (ex.e, ex.h, 4);
    let act = ExpertActivation::SwiGlu;
    let full = moe_forward(dev, ex, x, logits, n, k, act, ExpertShard::all(e));
    let starts: Vec<usize> = full.expert_starts.iter().map(|&s| s as usize).collect();
    let per = e / num_ranks;
    let mut gathered = vec![0.0f32; full.expert_out.len()];
    let mut ranks_with_rows = 0;
    for r in 0..num_ranks {
        let what = format!("{step}, rank {r}");
        let shard = ExpertShard { num_experts: e, first: r * per, num_local: per };
        let run = moe_forward(dev, ex, x, logits, n, k, act, shard);
        assert_eq!(run.expert_starts, full.expert_starts, "{what}: the same sort");
        let own = starts[r * per] * h..starts[(r + 1) * per] * h;
        ranks_with_rows += usize::from(!own.is_empty());
        for (at, &v) in run.expert_out.iter().enumerate() {
            if !own.contains(&at) {
                assert_eq!(v.to_bits(), 0, "{what} wrote element {at}, another rank's row");
            }
        }
        gathered[own.clone()].copy_from_slice(&run.expert_out[own]);
    }
    assert!(
        ranks_with_rows >= 2,
        "{step}: rows on several ranks (clear logits spread the experts)"
    );
    let used = starts[e] * h;
    let all = &full.expert_out[..used];
    assert_bits(&format!("{step}: the ranks' rows put together"), &gathered[..used], all);
}

#[test]
fn combine_adds_the_shared_expert_after_the_routed_ones() {
    let Some(dev) = gpu_or_skip("combine_adds_the_shared_expert_after_the_routed_ones") else {
        return;
    };
    let (n, k, h, rows) = (7, 2, 50, 20);
    let mut rng = Rng::new(24);
    let expert_out = rng.vec(rows * h, -1.0, 1.0);
    let pair_rows: Vec<i32> = (0..n * k).map(|_| rng.below(rows) as i32).collect();
    let (w, shared) = (rng.vec(n * k, 0.0, 1.0), rng.vec(n * h, -1.0, 1.0));
    let mut p = Plan::new(dev);
    let (eo, pr, ws, ss, out) = (
        p.input(&expert_out),
        p.input(&pair_rows),
        p.input(&w),
        p.input(&shared),
        p.output::<f32>(n * h),
    );
    let m = p.alloc();
    dev.moe_combine(m.get(eo), m.get(pr), m.get(ws), Some(m.get(ss)), m.get(out), (n, k), h)
        .unwrap();
    let mut want = vec![0.0f32; n * h];
    for t in 0..n {
        let o = &mut want[t * h..(t + 1) * h];
        for j in 0..k {
            let at = pair_rows[t * k + j] as usize * h;
            o.iter_mut().zip(&expert_out[at..at + h]).for_each(|(a, b)| *a += w[t * k + j] * b);
        }
        cpu::add_assign(o, &shared[t * h..(t + 1) * h]);
    }
    assert_bits("combine with shared expert", &m.read(out), &want);
}
