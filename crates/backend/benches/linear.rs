//! Throughput of the CPU `linear` kernel at decode (1 row) and prefill (64 rows) shapes, with
//! `f32` and `bf16` weights: `cargo bench -p routed-backend --bench linear`.

use half::bf16;
use routed_backend::cpu::{Matrix, MatrixData, linear};
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
