//! The products in bf16 precision on tensor cores (`--matmul-precision bf16`): the dense product
//! against the exact products of the rounded inputs within a summation bound (and the CPU's bf16
//! mode within twice it), the grouped expert kernels bit for bit against the dense one, and
//! every row's bits the same whatever the batch.

use super::{
    dense::{ROWS, check_row_invariance},
    moe::{Experts, Storage, clear_logits, moe_forward},
    support::*,
};
use half::bf16;
use routed_backend::{
    cpu::{self, MatmulPrecision, Matrix, MatrixData},
    cuda::{
        CudaDevice,
        ops::{ExpertActivation, ExpertShard, GemmTiling, Weights},
    },
};

/// The largest error of an output whose `k` products (exact in f32: bf16 by bf16) sum to
/// `sum_abs` in absolute value, whatever the order of the additions and however each rounds:
/// at most one ulp of the running sum per addition (2^-23 relative, enough for adders that
/// truncate as well as for those that round, as tensor cores may), and no running sum exceeds
/// `sum_abs`.
fn summation_bound(k: usize, sum_abs: f64) -> f64 {
    k as f64 * 2f64.powi(-23) * sum_abs
}

/// `out[m, n] = x[m, :] . w[n, :]` by the tensor-core kernel.
fn dense_mma(dev: &'static CudaDevice, x: &[f32], w: &[bf16], n: usize, k: usize) -> Vec<f32> {
    let m = x.len() / k;
    let mut p = Plan::new(dev);
    let (xs, ws, out) = (p.input(x), p.input(w), p.output::<f32>(m * n));
    let mem = p.alloc();
    dev.gemm(mem.get(xs), Weights::Bf16Mma(mem.get(ws)), mem.get(out), (m, n, k)).unwrap();
    mem.read(out)
}

#[test]
fn tensor_core_products_sum_the_rounded_inputs_products_whatever_the_batch() {
    let name = "tensor_core_products_sum_the_rounded_inputs_products_whatever_the_batch";
    let Some(dev) = gpu_or_skip(name) else { return };
    // k a multiple of 32 (whole steps), of 8 but not 32 (a last step with lanes past k), and
    // of neither (unaligned rows: element loads); n with lanes past its last column.
    for (n, k, seed) in [(200, 256, 40), (64, 200, 41), (77, 333, 42)] {
        let mut rng = Rng::new(seed);
        let x = rng.vec(ROWS * k, -1.0, 1.0);
        let w = rng.bf16_vec(n * k, -0.5, 0.5);
        let mut p = Plan::new(dev);
        let (xs, ws, out) = (p.input(&x), p.input(&w), p.output::<f32>(ROWS * n));
        let m = p.alloc();
        let run = |rows: usize, at: usize| {
            let xv = m.get(xs).sub(at * k, rows * k).unwrap();
            let ov = m.get(out).sub(at * n, rows * n).unwrap();
            dev.gemm(xv, Weights::Bf16Mma(m.get(ws)), ov, (rows, n, k)).unwrap();
            m.read(out)[at * n..(at + rows) * n].to_vec()
        };
        let full = run(ROWS, 0);
        let mut matrix = Matrix::new(n, k, MatrixData::Bf16(w.clone()));
        matrix.set_precision(MatmulPrecision::Bf16);
        let mut cpu_bf16 = vec![0.0; ROWS * n];
        cpu::linear(&x, &matrix, &mut cpu_bf16);
        let rounded: Vec<f64> = x.iter().map(|&v| f64::from(bf16::from_f32(v).to_f32())).collect();
        for (r, row) in rounded.chunks_exact(k).enumerate() {
            for c in 0..n {
                let wr = &w[c * k..(c + 1) * k];
                let products = row.iter().zip(wr).map(|(a, b)| a * f64::from(b.to_f32()));
                let (exact, sum_abs) = products.fold((0.0, 0.0), |(s, a), p| (s + p, a + p.abs()));
                let bound = summation_bound(k, sum_abs);
                let (got, cpu) = (f64::from(full[r * n + c]), f64::from(cpu_bf16[r * n + c]));
                assert!(
                    (got - exact).abs() <= bound,
                    "n {n} k {k}: [{r}, {c}] is {got}, the exact sum {exact} (bound {bound})"
                );
                assert!((got - cpu).abs() <= 2.0 * bound, "[{r}, {c}]: {got} vs the CPU's {cpu}");
            }
        }
        check_row_invariance(&format!("gemm_bf16_mma n {n} k {k}"), n, &full, run);
    }
}

/// The three tilings of the dense tensor-core product give every output the same bits: blocks whose
/// row groups are partly or wholly past m, warps past n, k of several staged chunks or of one
/// partial step, inputs whose rows or base defeat 16-byte loads.
#[test]
fn every_tiling_of_the_tensor_core_product_gives_the_same_bits() {
    let name = "every_tiling_of_the_tensor_core_product_gives_the_same_bits";
    let Some(dev) = gpu_or_skip(name) else { return };
    // (m, n, k, first element of x in its buffer)
    let cases = [
        (9, 200, 300, 0),
        (64, 136, 512, 0),
        (130, 40, 1000, 0),
        (70, 16, 36, 0),
        (3, 300, 20, 0),
        (33, 150, 264, 1),
    ];
    for (seed, (m, n, k, at)) in (70..).zip(cases) {
        let mut rng = Rng::new(seed);
        let x = rng.vec(at + m * k, -1.0, 1.0);
        let w = rng.bf16_vec(n * k, -0.5, 0.5);
        let mut p = Plan::new(dev);
        let (xs, ws) = (p.input(&x), p.input(&w));
        let outs = [GemmTiling::Thin, GemmTiling::Staged, GemmTiling::StagedWide]
            .map(|tiling| (tiling, p.output::<f32>(m * n)));
        let mem = p.alloc();
        let xv = mem.get(xs).sub(at, m * k).unwrap();
        for (tiling, out) in outs {
            let w = Weights::Bf16Mma(mem.get(ws));
            dev.gemm_tiled(xv, w, mem.get(out), (m, n, k), tiling).unwrap();
        }
        let thin = mem.read(outs[0].1);
        let what = format!("m {m} n {n} k {k} x at {at}");
        assert!(thin.iter().all(|v| v.is_finite() && *v != 0.0), "{what}: outputs written");
        for (tiling, out) in &outs[1..] {
            assert_bits(&format!("{what}: {tiling:?} against thin"), &mem.read(*out), &thin);
        }
    }
}

/// The grouped tensor-core kernels compute each expert row with the dense kernel's operations:
/// the activations equal the CPU's activation of the dense products of the token with the
/// expert's up (and gate) weights, and the down rows equal the dense product of those
/// activations, bit for bit, whichever pass of its expert's rows a row falls in; the block's
/// output for a token is bitwise the same in any batch.
#[test]
fn tensor_core_expert_rows_are_the_dense_kernels_bits_whatever_the_batch() {
    let name = "tensor_core_expert_rows_are_the_dense_kernels_bits_whatever_the_batch";
    let Some(dev) = gpu_or_skip(name) else { return };
    let cases = [
        // hidden 144: a last step with lanes past it; inter 40 likewise for the down product.
        (ExpertActivation::SwiGlu, 144, 40, 50),
        // Widths that are no multiple of 8: element loads throughout.
        (ExpertActivation::Relu2, 150, 36, 51),
    ];
    for (act, h, i, seed) in cases {
        // About 50 rows per expert: every expert's rows take two passes of 32.
        let (n, e, k) = (200, 8, 2);
        let mut rng = Rng::new(seed);
        let mut ex = Experts::random(&mut rng, e, h, i);
        ex.storage = Storage::Bf16Mma;
        let x = rng.vec(n * h, -1.0, 1.0);
        let logits = clear_logits(&mut rng, n, e);
        let all = ExpertShard::all(e);
        let run = moe_forward(dev, &ex, &x, &logits, n, k, act, all);
        let expert =
            |w: &[bf16], ex_id: usize, per: usize| w[ex_id * per..(ex_id + 1) * per].to_vec();
        let rows = run.sorted_pairs.len();
        let widest = run.expert_starts.windows(2).map(|w| w[1] - w[0]).max().unwrap();
        assert!(widest > 32, "an expert's rows take more than one pass ({widest})");
        let mut checked = 0;
        for ex_id in 0..e {
            let mut up = dense_mma(dev, &x, &expert(&ex.up, ex_id, i * h), i, h);
            let gate = dense_mma(dev, &x, &expert(&ex.gate, ex_id, i * h), i, h);
            let down = dense_mma(dev, &run.act, &expert(&ex.down, ex_id, h * i), h, i);
            for (t, (u, g)) in up.chunks_exact_mut(i).zip(gate.chunks_exact(i)).enumerate() {
                match act {
                    ExpertActivation::SwiGlu => cpu::mul_silu_inplace(u, g),
                    ExpertActivation::Relu2 => cpu::relu2_inplace(u),
                }
                for rank in 0..k {
                    let pair = t * k + rank;
                    if run.ids[pair] as usize != ex_id {
                        continue;
                    }
                    let row = (0..rows).find(|&r| run.sorted_pairs[r] == pair as i32).unwrap();
                    let what = format!("{act:?}: token {t} expert {ex_id}");
                    assert_bits(&format!("{what} act"), &run.act[row * i..(row + 1) * i], u);
                    let out = &run.expert_out[row * h..(row + 1) * h];
                    assert_bits(&format!("{what} down"), out, &down[row * h..(row + 1) * h]);
                    checked += 1;
                }
            }
        }
        assert_eq!(checked, n * k, "every pair's row was checked");
        for b in [1, 2, 5, 17, 64, 150] {
            let got = moe_forward(dev, &ex, &x, &logits, b, k, act, all).out;
            assert_bits(&format!("{act:?}: first {b} tokens"), &got, &run.out[..b * h]);
        }
        for t in [3, 50, 199] {
            let got = moe_forward(dev, &ex, &x[t * h..], &logits[t * e..], 1, k, act, all).out;
            assert_bits(&format!("{act:?}: token {t} alone"), &got, &run.out[t * h..(t + 1) * h]);
        }
    }
}
