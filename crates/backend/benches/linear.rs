//! Throughput of the CPU `linear` kernel at decode (1 and 8 rows) and prefill (64 rows) shapes,
//! with `f32` weights, `bf16` weights, and `bf16` weights in bf16 precision (`bf16*`):
//! `cargo bench -p routed-backend --bench linear`.

use half::bf16;
use rayon::prelude::*;
use routed_backend::cpu::{MatmulPrecision, Matrix, MatrixData, linear, linear_rows_serial};
use std::time::Instant;

fn median_secs(mut f: impl FnMut(), reps: usize) -> f64 {
    let mut times: Vec<f64> = (0..reps)
        .map(|_| {
            let t = Instant::now();
            f();
            t.elapsed().as_secs_f64()
        })
        .collect();
    times.sort_by(f64::total_cmp);
    times[reps / 2]
}

fn main() {
    cold_experts();
    for (name, n, k) in
        [("lm_head", 151_936, 1024), ("expert_up", 384, 1024), ("in_proj", 3088, 1024)]
    {
        let values: Vec<f32> =
            (0..n * k).map(|i| ((i * 7919) % 1000) as f32 * 1e-3 - 0.5).collect();
        let weights = [
            ("f32", Matrix::from_f32(n, k, values.clone())),
            (
                "bf16",
                Matrix::new(
                    n,
                    k,
                    MatrixData::Bf16(values.iter().map(|&v| bf16::from_f32(v)).collect()),
                ),
            ),
            ("bf16*", {
                let mut w = Matrix::new(
                    n,
                    k,
                    MatrixData::Bf16(values.iter().map(|&v| bf16::from_f32(v)).collect()),
                );
                w.set_precision(MatmulPrecision::Bf16);
                w
            }),
        ];
        for (dtype, w) in &weights {
            for m in [1, 8, 64] {
                let x: Vec<f32> = (0..m * k).map(|i| (i % 13) as f32 * 0.1).collect();
                let mut out = vec![0.0; m * n];
                let secs = median_secs(|| linear(&x, w, &mut out), if n > 10_000 { 7 } else { 51 });
                let gbs = w.bytes() as f64 / secs / 1e9;
                let gflops = 2.0 * (m * n * k) as f64 / secs / 1e9;
                println!(
                    "{name:>9} [{n}x{k}] {dtype:>4} m={m:<3} {:>9.3} ms  {gbs:>6.1} GB/s of weights  {gflops:>6.1} GFLOP/s",
                    secs * 1e3
                );
            }
        }
    }
}

/// MoE traffic: 64 cold experts (up `[384, 1024]`, down `[1024, 384]`, bf16, 100 MB in all, more
/// than the caches), 8 picked per token with one input row each (batch-1 decode), or all 64 with
/// 8 rows each (a batch of 64 spread evenly), in both precisions.
fn cold_experts() {
    let (inter, hidden, num_experts, top_k) = (384, 1024, 64, 8);
    for precision in [MatmulPrecision::F32, MatmulPrecision::Bf16] {
        let mk = |n: usize, k: usize, seed: usize| {
            let v =
                (0..n * k).map(|i| bf16::from_f32(((i * 31 + seed) % 997) as f32 * 1e-3)).collect();
            let mut w = Matrix::new(n, k, MatrixData::Bf16(v));
            w.set_precision(precision);
            w
        };
        let ups: Vec<Matrix> = (0..num_experts).map(|e| mk(inter, hidden, e)).collect();
        let downs: Vec<Matrix> = (0..num_experts).map(|e| mk(hidden, inter, e + 99)).collect();
        for (picked, rows) in [(top_k, 1), (num_experts, 8)] {
            let x: Vec<f32> = (0..rows * hidden).map(|i| (i % 13) as f32 * 0.1).collect();
            let ids: Vec<usize> = (0..rows).collect();
            let mut token = 0usize;
            let bytes = (picked * 2 * inter * hidden * 2) as f64;
            // As the MoE layer runs them: one task per expert, each product on its task's thread.
            let secs = median_secs(
                || {
                    token += 1;
                    let picks: Vec<usize> =
                        (0..picked).map(|j| (token * 7 + j * 13) % num_experts).collect();
                    picks.par_iter().for_each(|&e| {
                        let mut mid = vec![0.0; rows * inter];
                        let mut out = vec![0.0; rows * hidden];
                        linear_rows_serial(&x, &ids, &ups[e], &mut mid);
                        linear_rows_serial(&mid, &ids, &downs[e], &mut out);
                        std::hint::black_box(&out);
                    });
                },
                if rows == 1 { 101 } else { 21 },
            );
            println!(
                "cold experts {:>4}: {picked} of {num_experts}, m={rows} {:>9.3} ms  {:>6.1} GB/s of weights  {:>6.1} GFLOP/s",
                precision.as_str(),
                secs * 1e3,
                bytes / secs / 1e9,
                2.0 * bytes / 2.0 * rows as f64 / secs / 1e9
            );
        }
    }
}
