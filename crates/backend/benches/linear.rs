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

/// Decode-shaped MoE traffic: 64 cold experts (up `[384, 1024]`, down `[1024, 384]`, bf16, 100 MB
/// in all, more than the caches), 8 picked per token, one input row each.
fn cold_experts() {
    let (inter, hidden, num_experts, top_k) = (384, 1024, 64, 8);
    let mk = |n: usize, k: usize, seed: usize| {
        let v = (0..n * k).map(|i| bf16::from_f32(((i * 31 + seed) % 997) as f32 * 1e-3)).collect();
        Matrix::new(n, k, MatrixData::Bf16(v))
    };
    let ups: Vec<Matrix> = (0..num_experts).map(|e| mk(inter, hidden, e)).collect();
    let downs: Vec<Matrix> = (0..num_experts).map(|e| mk(hidden, inter, e + 99)).collect();
    let x: Vec<f32> = (0..hidden).map(|i| (i % 13) as f32 * 0.1).collect();
    let mut token = 0usize;
    let bytes = (top_k * 2 * inter * hidden * 2) as f64;
    // As the MoE layer runs them: one task per expert, each product on its task's thread.
    let secs = median_secs(
        || {
            token += 1;
            let picks: Vec<usize> =
                (0..top_k).map(|j| (token * 7 + j * 13) % num_experts).collect();
            picks.par_iter().for_each(|&e| {
                let mut mid = vec![0.0; inter];
                let mut out = vec![0.0; hidden];
                linear_rows_serial(&x, &[0], &ups[e], &mut mid);
                linear_rows_serial(&mid, &[0], &downs[e], &mut out);
                std::hint::black_box(&out);
            });
        },
        101,
    );
    println!(
        "cold experts: {top_k} of {num_experts} per token, m=1 {:>9.3} ms  {:>6.1} GB/s of weights",
        secs * 1e3,
        bytes / secs / 1e9
    );
}
