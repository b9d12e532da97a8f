//! Embedding, norms, rotary, the matrix products, activations, cache writes and copies, argmax
//! and log-softmax.

use super::support::*;
use half::bf16;
use routed_backend::{
    cpu::{self, Matrix, MatrixData},
    cuda::{
        host::rope_table,
        ops::{GemmTiling, QkvHeadsBuffers, QkvHeadsParams, Weights},
    },
};

/// Rows of the full batch of the row-invariance tests.
pub const ROWS: usize = 512;

#[test]
fn embedding_gathers_rows_exactly() {
    let Some(dev) = gpu_or_skip("embedding_gathers_rows_exactly") else { return };
    let (vocab, hidden, n) = (300, 96, 40);
    let mut rng = Rng::new(1);
    let table = rng.bf16_vec(vocab * hidden, -2.0, 2.0);
    let table32 = rng.vec(vocab * hidden, -2.0, 2.0);
    let ids: Vec<u32> = (0..n).map(|_| rng.below(vocab) as u32).collect();
    let mut p = Plan::new(dev);
    let (t, t32, i) = (p.input(&table), p.input(&table32), p.input(&ids));
    let (o, o32) = (p.output::<f32>(n * hidden), p.output::<f32>(n * hidden));
    let m = p.alloc();
    dev.embed_gather(Weights::Bf16(m.get(t)), m.get(i), m.get(o), n, hidden, 0.5).unwrap();
    dev.embed_gather(Weights::F32(m.get(t32)), m.get(i), m.get(o32), n, hidden, 0.5).unwrap();
    for (what, matrix, got) in [
        ("bf16 table", Matrix::new(vocab, hidden, MatrixData::Bf16(table)), o),
        ("f32 table", Matrix::from_f32(vocab, hidden, table32), o32),
    ] {
        let mut want = vec![0.0; n * hidden];
        for (row, &id) in want.chunks_exact_mut(hidden).zip(&ids) {
            matrix.row_into(id as usize, row);
        }
        cpu::scale_inplace(&mut want, 0.5);
        assert_bits(what, &m.read(got), &want);
    }
}

/// Runs `launch(rows, offset)` for the first `b` rows of every batch size and for single rows at
/// several offsets; `read` returns the outputs of rows `offset..offset + rows`. Every result must
/// equal the same rows of the full batch bit for bit.
pub fn check_row_invariance(
    what: &str,
    width: usize,
    full: &[f32],
    mut run: impl FnMut(usize, usize) -> Vec<f32>,
) {
    for b in BATCHES {
        assert_bits(&format!("{what}: first {b} rows"), &run(b, 0), &full[..b * width]);
    }
    for i in [1, 77, 300, ROWS - 1] {
        assert_bits(
            &format!("{what}: row {i} alone"),
            &run(1, i),
            &full[i * width..(i + 1) * width],
        );
    }
}

#[test]
fn rms_norms_equal_the_cpu_and_do_not_depend_on_the_batch() {
    let Some(dev) = gpu_or_skip("rms_norms_equal_the_cpu_and_do_not_depend_on_the_batch") else {
        return;
    };
    let width = 1000;
    let mut rng = Rng::new(2);
    let (x, branch, w) = (
        rng.vec(ROWS * width, -3.0, 3.0),
        rng.vec(ROWS * width, -1.0, 1.0),
        rng.vec(width, 0.5, 1.5),
    );
    let mut p = Plan::new(dev);
    let (xs, bs, ws) = (p.input(&x), p.input(&branch), p.input(&w));
    let (out, normed) = (p.output::<f32>(ROWS * width), p.output::<f32>(ROWS * width));
    let mut m = p.alloc();
    dev.rms_norm(m.get(xs), m.get(ws), m.get(out), ROWS, width, width, 1e-6).unwrap();
    let full = m.read(out);
    let mut want = vec![0.0; ROWS * width];
    cpu::rms_norm(&x, &w, 1e-6, &mut want);
    assert_bits("rms_norm vs cpu", &full, &want);
    check_row_invariance("rms_norm", width, &full, |rows, at| {
        let (xv, ov) = (
            m.get(xs).sub(at * width, rows * width).unwrap(),
            m.get(out).sub(at * width, rows * width).unwrap(),
        );
        dev.rms_norm(xv, m.get(ws), ov, rows, width, width, 1e-6).unwrap();
        m.read(out)[at * width..(at + rows) * width].to_vec()
    });

    // Residual add then norm, with Granite's residual multiplier.
    dev.add_rms_norm(m.get(xs), m.get(bs), m.get(ws), m.get(normed), ROWS, width, 0.22, 1e-5)
        .unwrap();
    let (new_x, full) = (m.read(xs), m.read(normed));
    let mut want_x = x.clone();
    want_x.iter_mut().zip(&branch).for_each(|(a, b)| *a += 0.22 * b);
    let mut want = vec![0.0; ROWS * width];
    cpu::rms_norm(&want_x, &w, 1e-5, &mut want);
    assert_bits("add_rms_norm residual", &new_x, &want_x);
    assert_bits("add_rms_norm vs cpu", &full, &want);
    check_row_invariance("add_rms_norm", width, &full, |rows, at| {
        m.write(xs, &x);
        let r = at * width..(at + rows) * width;
        let sub = |s| m.get(s).sub(r.start, r.len()).unwrap();
        dev.add_rms_norm(sub(xs), sub(bs), m.get(ws), sub(normed), rows, width, 0.22, 1e-5)
            .unwrap();
        m.read(normed)[r].to_vec()
    });
}

/// Rows wider than the norms' staging chunk (4,096 elements) are summed over several chunks in
/// the CPU's order; `rms_norm` in place (`out` aliasing `x`) reads each element before writing it.
#[test]
fn rms_norms_of_rows_wider_than_a_chunk_equal_the_cpu() {
    let Some(dev) = gpu_or_skip("rms_norms_of_rows_wider_than_a_chunk_equal_the_cpu") else {
        return;
    };
    let (rows, width) = (3, 9001);
    let mut rng = Rng::new(3);
    let (x, branch, w) = (
        rng.vec(rows * width, -3.0, 3.0),
        rng.vec(rows * width, -1.0, 1.0),
        rng.vec(width, 0.5, 1.5),
    );
    let mut want = vec![0.0; rows * width];
    cpu::rms_norm(&x, &w, 1e-6, &mut want);
    let mut p = Plan::new(dev);
    let (xs, bs, ws) = (p.input(&x), p.input(&branch), p.input(&w));
    let normed = p.output::<f32>(rows * width);
    let mut m = p.alloc();
    dev.rms_norm(m.get(xs), m.get(ws), m.get(xs), rows, width, width, 1e-6).unwrap();
    assert_bits("wide rms_norm in place", &m.read(xs), &want);

    m.write(xs, &x);
    dev.add_rms_norm(m.get(xs), m.get(bs), m.get(ws), m.get(normed), rows, width, 0.5, 1e-5)
        .unwrap();
    let mut want_x = x.clone();
    want_x.iter_mut().zip(&branch).for_each(|(a, b)| *a += 0.5 * b);
    cpu::rms_norm(&want_x, &w, 1e-5, &mut want);
    assert_bits("wide add_rms_norm residual", &m.read(xs), &want_x);
    assert_bits("wide add_rms_norm", &m.read(normed), &want);
}

/// The CPU attention layer's rotation, written out: pairs (i, i + rot/2) of the first `rot` dims,
/// angles per position.
fn rotate_like_the_cpu(head: &mut [f32], pos: i32, rot: usize) {
    let half = rot / 2;
    for i in 0..half {
        let f = 1.0 / 1e6f32.powf((2 * i) as f32 / rot as f32);
        let (sin, cos) = (pos as f32 * f).sin_cos();
        let (x0, x1) = (head[i], head[i + half]);
        head[i] = x0 * cos - x1 * sin;
        head[i + half] = x1 * cos + x0 * sin;
    }
}

/// The fused projection's heads: queries normed and rotated, keys normed, rotated and rounded into
/// their slots, values rounded into theirs, bit for bit the CPU layer's; a negative slot writes
/// nothing. Head widths whose rotation pairs sit in one lane (64) and in different lanes (80,
/// partially rotated), with and without the per-head norms.
#[test]
fn qkv_heads_norm_rotate_and_cache_like_the_cpu() {
    let Some(dev) = gpu_or_skip("qkv_heads_norm_rotate_and_cache_like_the_cpu") else { return };
    let (n, nq, nk, num_slots) = (19, 4, 2, 64);
    let mut rng = Rng::new(3);
    for (hd, rot, normed) in [(64, 64, true), (80, 48, true), (64, 64, false)] {
        let (qw, kw) = (nq * hd, nk * hd);
        let qkv = rng.vec(n * (qw + 2 * kw), -2.0, 2.0);
        let (qn, kn) = (rng.vec(hd, 0.5, 1.5), rng.vec(hd, 0.5, 1.5));
        let positions: Vec<i32> = (0..n as i32).map(|i| i * 37 % 500).collect();
        let slots: Vec<i32> = (0..n as i32).map(|i| if i % 7 == 3 { -1 } else { i * 3 }).collect();
        let table = rope_table(1e6, rot, 512);
        let mut p = Plan::new(dev);
        let (xs, qns, kns, ts) = (p.input(&qkv), p.input(&qn), p.input(&kn), p.input(&table));
        let (ps, ss, qs) = (p.input(&positions), p.input(&slots), p.output::<f32>(n * qw));
        let (kc, vc) = (p.output::<bf16>(num_slots * kw), p.output::<bf16>(num_slots * kw));
        let m = p.alloc();
        let params = QkvHeadsParams {
            num_heads: nq,
            num_kv_heads: nk,
            head_dim: hd,
            rot_dim: rot,
            eps: 1e-6,
        };
        let buffers = QkvHeadsBuffers {
            qkv: m.get(xs),
            q_norm: normed.then(|| m.get(qns)),
            k_norm: normed.then(|| m.get(kns)),
            cos_sin: Some(m.get(ts)),
            positions: m.get(ps),
            slots: m.get(ss),
            q: m.get(qs),
            k_cache: m.get(kc),
            v_cache: m.get(vc),
        };
        dev.qkv_heads(&params, &buffers, n).unwrap();
        let (mut want_q, mut want_k, mut want_v) =
            (Vec::new(), vec![bf16::ZERO; num_slots * kw], vec![bf16::ZERO; num_slots * kw]);
        for (t, token) in qkv.chunks_exact(qw + 2 * kw).enumerate() {
            let (mut q, mut k, v) =
                (token[..qw].to_vec(), token[qw..qw + kw].to_vec(), &token[qw + kw..]);
            if normed {
                cpu::rms_norm_inplace(&mut q, &qn, 1e-6);
                cpu::rms_norm_inplace(&mut k, &kn, 1e-6);
            }
            for head in q.chunks_exact_mut(hd).chain(k.chunks_exact_mut(hd)) {
                rotate_like_the_cpu(head, positions[t], rot);
            }
            want_q.extend_from_slice(&q);
            if slots[t] >= 0 {
                let at = slots[t] as usize * kw;
                for i in 0..kw {
                    want_k[at + i] = bf16::from_f32(k[i]);
                    want_v[at + i] = bf16::from_f32(v[i]);
                }
            }
        }
        let what = format!("head_dim {hd}, rot_dim {rot}, normed {normed}");
        assert_bits(&format!("{what}: queries"), &m.read(qs), &want_q);
        let same =
            |a: &[bf16], b: &[bf16]| a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits());
        assert!(same(&m.read(kc), &want_k), "{what}: keys");
        assert!(same(&m.read(vc), &want_v), "{what}: values");
    }
}

#[test]
fn matrix_products_equal_cpu_linear_and_do_not_depend_on_the_batch() {
    let Some(dev) = gpu_or_skip("matrix_products_equal_cpu_linear_and_do_not_depend_on_the_batch")
    else {
        return;
    };
    // k not a multiple of 16 (the lanes' tail) and n not a multiple of the block's 32 columns.
    let (n, k) = (200, 333);
    let mut rng = Rng::new(4);
    let x = rng.vec(ROWS * k, -1.0, 1.0);
    let w16 = rng.bf16_vec(n * k, -0.5, 0.5);
    let w32 = rng.vec(n * k, -0.5, 0.5);
    let mut p = Plan::new(dev);
    let (xs, w16s, w32s, out) =
        (p.input(&x), p.input(&w16), p.input(&w32), p.output::<f32>(ROWS * n));
    let m = p.alloc();
    for bf in [true, false] {
        let run = |rows: usize, at: usize| {
            let xv = m.get(xs).sub(at * k, rows * k).unwrap();
            let ov = m.get(out).sub(at * n, rows * n).unwrap();
            match bf {
                true => dev.gemm(xv, Weights::Bf16(m.get(w16s)), ov, (rows, n, k)).unwrap(),
                false => dev.gemm(xv, Weights::F32(m.get(w32s)), ov, (rows, n, k)).unwrap(),
            }
            m.read(out)[at * n..(at + rows) * n].to_vec()
        };
        let full = run(ROWS, 0);
        let matrix = match bf {
            true => Matrix::new(n, k, MatrixData::Bf16(w16.clone())),
            false => Matrix::from_f32(n, k, w32.clone()),
        };
        let mut want = vec![0.0; ROWS * n];
        cpu::linear(&x, &matrix, &mut want);
        assert_bits(&format!("gemm (bf16 weights: {bf}) vs cpu::linear"), &full, &want);
        check_row_invariance("gemm", n, &full, run);
    }
}

/// Every tiling of the `f32` products (row, thin, staged) gives cpu::linear's bits: staged blocks
/// whose rows are partly past m, half-warps past n, k inside one lane stripe, one chunk and a few
/// elements, several chunks, several of the row kernel's rounds; inputs whose rows or base defeat
/// 16-byte loads.
#[test]
fn every_tiling_of_the_f32_products_gives_cpu_linear_bits() {
    let name = "every_tiling_of_the_f32_products_gives_cpu_linear_bits";
    let Some(dev) = gpu_or_skip(name) else { return };
    // (m, n, k, first element of x in its buffer)
    // k of several rounds of the row kernel's 32 stripes and a tail (1030, 520).
    let cases = [
        (9, 33, 7, 0),
        (17, 70, 130, 0),
        (40, 32, 700, 0),
        (20, 45, 258, 1),
        (3, 50, 64, 0),
        (1, 77, 1030, 0),
        (2, 9, 520, 1),
    ];
    for (seed, (m, n, k, at)) in (80..).zip(cases) {
        let mut rng = Rng::new(seed);
        let x = rng.vec(at + m * k, -1.0, 1.0);
        let w16 = rng.bf16_vec(n * k, -0.5, 0.5);
        let w32 = rng.vec(n * k, -0.5, 0.5);
        let mut p = Plan::new(dev);
        let (xs, w16s, w32s) = (p.input(&x), p.input(&w16), p.input(&w32));
        let tilings = [GemmTiling::Row, GemmTiling::Thin, GemmTiling::Staged];
        let outs = tilings.map(|t| (t, p.output::<f32>(m * n)));
        let mem = p.alloc();
        let xv = mem.get(xs).sub(at, m * k).unwrap();
        for bf in [true, false] {
            let (w, matrix) = match bf {
                true => {
                    (Weights::Bf16(mem.get(w16s)), Matrix::new(n, k, MatrixData::Bf16(w16.clone())))
                }
                false => (Weights::F32(mem.get(w32s)), Matrix::from_f32(n, k, w32.clone())),
            };
            let mut want = vec![0.0; m * n];
            cpu::linear(&x[at..], &matrix, &mut want);
            for (tiling, out) in outs {
                dev.gemm_tiled(xv, w, mem.get(out), (m, n, k), tiling).unwrap();
                let what = format!("m {m} n {n} k {k} x at {at}, bf16 weights {bf}, {tiling:?}");
                assert_bits(&what, &mem.read(out), &want);
            }
        }
    }
}

#[test]
fn activations_equal_the_cpu() {
    let Some(dev) = gpu_or_skip("activations_equal_the_cpu") else { return };
    let n = 5000;
    let mut rng = Rng::new(5);
    let (a, g) = (rng.vec(n, -30.0, 30.0), rng.vec(n, -100.0, 100.0));
    let mut p = Plan::new(dev);
    let (a1, a2, gs) = (p.input(&a), p.input(&a), p.input(&g));
    let m = p.alloc();
    dev.silu_mul(m.get(a1), m.get(gs), n).unwrap();
    dev.relu2(m.get(a2), n).unwrap();
    let (mut want1, mut want2) = (a.clone(), a.clone());
    cpu::mul_silu_inplace(&mut want1, &g);
    cpu::relu2_inplace(&mut want2);
    assert_bits("silu_mul", &m.read(a1), &want1);
    assert_bits("relu2", &m.read(a2), &want2);
}

#[test]
fn state_copy_moves_slots() {
    let Some(dev) = gpu_or_skip("state_copy_moves_slots") else { return };
    let mut rng = Rng::new(6);
    let slot_len = 1000;
    let live = rng.vec(4 * slot_len, -1.0, 1.0);
    let snaps = rng.vec(3 * slot_len, -1.0, 1.0);
    let mut p = Plan::new(dev);
    let (ls, ss) = (p.input(&live), p.input(&snaps));
    let pairs = p.input(&[2i32, 0, -1, 3]);
    let m = p.alloc();
    // Restore snapshot 2 into live slot 0, clear live slot 3.
    dev.state_copy(m.get(ss), m.get(ls), m.get(pairs), 2, slot_len).unwrap();
    let mut want = live.clone();
    want[..slot_len].copy_from_slice(&snaps[2 * slot_len..3 * slot_len]);
    want[3 * slot_len..].fill(0.0);
    assert_bits("state copy", &m.read(ls), &want);
}

#[test]
fn argmax_and_log_softmax_agree_with_the_cpu_and_the_batch() {
    let Some(dev) = gpu_or_skip("argmax_and_log_softmax_agree_with_the_cpu_and_the_batch") else {
        return;
    };
    let (rows, vocab) = (64, 32_000);
    let mut rng = Rng::new(7);
    let mut logits = rng.vec(rows * vocab, -12.0, 12.0);
    // Ties: row 0's maximum twice (the lower index wins), row 1 all equal.
    logits[5] = 40.0;
    logits[900] = 40.0;
    logits[vocab..2 * vocab].fill(1.5);
    let mut p = Plan::new(dev);
    let (ls, am, lp, lz) = (
        p.input(&logits),
        p.output::<u32>(rows),
        p.output::<f32>(rows * vocab),
        p.output::<f32>(rows),
    );
    let (fused_ids, fused_z) = (p.output::<u32>(rows), p.output::<f32>(rows));
    let (fused_lps, lps) = (p.output::<f32>(rows), p.output::<f32>(rows));
    let m = p.alloc();
    dev.argmax(m.get(ls), m.get(am), rows, vocab).unwrap();
    dev.log_softmax(m.get(ls), Some(m.get(lp)), m.get(lz), rows, vocab).unwrap();
    let fused = (m.get(fused_ids), m.get(fused_lps));
    dev.log_softmax_argmax(m.get(ls), m.get(fused_z), fused, rows, vocab).unwrap();
    dev.gather_logprob(m.get(ls), m.get(am), m.get(lz), m.get(lps), rows, vocab).unwrap();
    // A greedy row's token and logprob from one kernel: the same tokens and bits.
    assert_eq!(m.read(fused_ids), m.read(am), "log_softmax_argmax's tokens");
    assert_bits("log_softmax_argmax's log_z", &m.read(fused_z), &m.read(lz));
    assert_bits("log_softmax_argmax's logprobs", &m.read(fused_lps), &m.read(lps));
    let (ids, log_z, lps) = (m.read(am), m.read(lz), m.read(lp));
    for r in 0..rows {
        let row = &logits[r * vocab..(r + 1) * vocab];
        assert_eq!(ids[r] as usize, cpu::argmax(row), "argmax of row {r}");
        let want = cpu::log_sum_exp(row);
        assert!((log_z[r] - want).abs() <= tol::LOG_Z, "log_z of row {r}: {} vs {want}", log_z[r]);
        assert_eq!(lps[r * vocab + 3], row[3] - log_z[r], "log-probability = logit - log_z");
    }
    assert_eq!((ids[0], ids[1]), (5, 0));
    // Any subset of rows gives the same bits.
    for (at, b) in [(0, 1), (17, 1), (0, 7), (3, 61)] {
        dev.log_softmax(
            m.get(ls).sub(at * vocab, b * vocab).unwrap(),
            None,
            m.get(lz).sub(at, b).unwrap(),
            b,
            vocab,
        )
        .unwrap();
        assert_bits("log_z rows", &m.read(lz)[at..at + b], &log_z[at..at + b]);
    }
}

#[test]
fn scaling_equals_the_cpu_scale() {
    let Some(dev) = gpu_or_skip("scaling_equals_the_cpu_scale") else { return };
    let mut rng = Rng::new(47);
    let x = rng.vec(10_001, -30.0, 30.0);
    let s = 1.0 / 7.5f32;
    let mut p = Plan::new(dev);
    let xs = p.input(&x);
    let m = p.alloc();
    dev.scale(m.get(xs), s, x.len()).unwrap();
    let mut want = x.clone();
    routed_backend::cpu::scale_inplace(&mut want, s);
    assert_bits("scale", &m.read(xs), &want);
}
