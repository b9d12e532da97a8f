//! Graphs: a capture queues nothing, and a replay runs the captured launches on whatever the
//! captured addresses hold now, with the captured sizes: the same bits as the eager launches.

use super::support::*;
use routed_backend::{
    BackendError,
    cpu::{self, Matrix, MatrixData},
    cuda::ops::Weights,
};

#[test]
fn a_replay_reads_the_buffers_as_they_are_now() {
    let Some(dev) = gpu_or_skip("a_replay_reads_the_buffers_as_they_are_now") else { return };
    let (m, k, n) = (5, 64, 40);
    let mut rng = Rng::new(51);
    let w = rng.bf16_vec(n * k, -1.0, 1.0);
    let norm = rng.vec(n, 0.5, 1.5);
    let mut p = Plan::new(dev);
    let (xs, ws, ns) = (p.input(&rng.vec(m * k, -1.0, 1.0)), p.input(&w), p.input(&norm));
    let (ys, zs) = (p.output::<f32>(m * n), p.output::<f32>(m * n));
    let mut mem = p.alloc();
    let step = |mem: &Mem| -> Result<(), BackendError> {
        dev.gemm(mem.get(xs), Weights::Bf16(mem.get(ws)), mem.get(ys), (m, n, k))?;
        dev.rms_norm(mem.get(ys), mem.get(ns), mem.get(zs), m, n, n, 1e-6)
    };
    let graph = dev.capture(|| step(&mem)).unwrap();
    dev.synchronize().unwrap();
    assert!(mem.read(zs).iter().all(|&v| v == 0.0), "a capture runs nothing");
    for round in 0..3 {
        let x = rng.vec(m * k, -2.0, 2.0);
        mem.write(xs, &x);
        dev.replay(&graph).unwrap();
        let got = mem.read(zs);
        let mut y = vec![0.0; m * n];
        cpu::linear(&x, &Matrix::new(n, k, MatrixData::Bf16(w.clone())), &mut y);
        let mut want = vec![0.0; m * n];
        cpu::rms_norm(&y, &norm, 1e-6, &mut want);
        assert_bits(&format!("replay {round}"), &got, &want);
        step(&mem).unwrap();
        assert_bits(&format!("eager {round}"), &mem.read(zs), &got);
    }
}
