//! Mamba2: conv1d, the selective scan and the gated norm, against the CPU's token-by-token
//! recurrence; chunked prefill, one-token steps and a batch of sequences give the same bits, and
//! snapshot taps hold the state after exactly their position.

use super::support::*;
use routed_backend::{
    cpu,
    cuda::{
        ArenaLayout, CudaDevice, DeviceArena,
        ops::{ConvParams, MambaSeqs, ScanParams, ScanWeights},
        pools::StatePool,
    },
};

const HEADS: usize = 4;
const HEAD_DIM: usize = 32;
const GROUPS: usize = 2;
const STATE: usize = 16;
const CONV_K: usize = 4;
const D_INNER: usize = HEADS * HEAD_DIM;
const CONV_DIM: usize = D_INNER + 2 * GROUPS * STATE;
const PROJ_DIM: usize = D_INNER + CONV_DIM + HEADS;
const CONV_LEN: usize = (CONV_K - 1) * CONV_DIM;
const SSM_LEN: usize = HEADS * STATE * HEAD_DIM;
/// Prompt-position clamp of dt (active: softplus of the inputs spans it).
const DT_MIN: f32 = 0.3;
const DT_MAX: f32 = 1.5;

struct Weights {
    conv_w: Vec<f32>,
    conv_b: Vec<f32>,
    dt_bias: Vec<f32>,
    a: Vec<f32>,
    d: Vec<f32>,
}

/// One sequence: its in_proj outputs `[len, PROJ_DIM]` and prompt length.
struct Seq {
    proj: Vec<f32>,
    num_prompt: usize,
}

impl Seq {
    fn len(&self) -> usize {
        self.proj.len() / PROJ_DIM
    }
}

/// The CPU's per-token recurrence (the model's Mamba layer without the projections): returns
/// the scan outputs `[len, D_INNER]` and the state (conv then SSM) after every position.
fn reference(w: &Weights, seq: &Seq) -> (Vec<f32>, Vec<Vec<f32>>) {
    let (mut conv, mut ssm) = (vec![0.0f32; CONV_LEN], vec![0.0f32; SSM_LEN]);
    let mut states = vec![[conv.clone(), ssm.clone()].concat()];
    let mut y = vec![0.0f32; seq.len() * D_INNER];
    for t in 0..seq.len() {
        let row = &seq.proj[t * PROJ_DIM..(t + 1) * PROJ_DIM];
        let mut xbc = vec![0.0; CONV_DIM];
        cpu::conv_step(
            &mut conv,
            &w.conv_w,
            Some(&w.conv_b),
            &row[D_INNER..D_INNER + CONV_DIM],
            &mut xbc,
        );
        cpu::silu_inplace(&mut xbc);
        for h in 0..HEADS {
            let g = h / (HEADS / GROUPS);
            let mut dt = cpu::softplus(row[D_INNER + CONV_DIM + h] + w.dt_bias[h]);
            if t < seq.num_prompt {
                dt = dt.clamp(DT_MIN, DT_MAX);
            }
            let decay = (dt * w.a[h]).exp();
            let b = &xbc[D_INNER + g * STATE..][..STATE];
            let c = &xbc[D_INNER + (GROUPS + g) * STATE..][..STATE];
            let dtb: Vec<f32> = b.iter().map(|&bv| dt * bv).collect();
            let x = &xbc[h * HEAD_DIM..(h + 1) * HEAD_DIM];
            let state = &mut ssm[h * STATE * HEAD_DIM..(h + 1) * STATE * HEAD_DIM];
            cpu::ssm_step(
                state,
                x,
                &dtb,
                c,
                decay,
                w.d[h],
                &mut y[t * D_INNER + h * HEAD_DIM..][..HEAD_DIM],
            );
        }
        states.push([conv.clone(), ssm.clone()].concat());
    }
    (y, states)
}

/// Runs the sequences through conv1d and scan on the device in steps: step `r` gives sequence `s`
/// its next `chunks[(r + s) % chunks.len()]` tokens. Taps store the state after each position in
/// `taps_at`. Returns every sequence's outputs and the snapshot pool.
fn run(
    dev: &'static CudaDevice,
    w: &Weights,
    seqs: &[Seq],
    chunks: &[usize],
    taps_at: &[(usize, usize)],
) -> (Vec<Vec<f32>>, Vec<f32>) {
    let mut layout = ArenaLayout::new("state");
    let pool =
        StatePool::reserve(&mut layout, 1, CONV_LEN, SSM_LEN, seqs.len(), taps_at.len().max(1));
    let states = DeviceArena::new(dev, &layout).unwrap();
    let mut p = Plan::new(dev);
    let (cw, cb, dtb, a, d) =
        (p.input(&w.conv_w), p.input(&w.conv_b), p.input(&w.dt_bias), p.input(&w.a), p.input(&w.d));
    let weights = p.alloc();
    let mut done = vec![0usize; seqs.len()];
    let mut outs = vec![Vec::new(); seqs.len()];
    let mut round = 0;
    while seqs.iter().zip(&done).any(|(s, &d)| d < s.len()) {
        let live: Vec<usize> = (0..seqs.len()).filter(|&s| done[s] < seqs[s].len()).collect();
        let (mut proj, mut pos, mut starts, mut slots, mut num_prompt, mut tap_starts, mut taps) =
            (vec![], vec![], vec![0i32], vec![], vec![], vec![0i32], vec![]);
        let mut lens = Vec::new();
        for &s in &live {
            let len = chunks[(round + s) % chunks.len()].min(seqs[s].len() - done[s]);
            proj.extend_from_slice(&seqs[s].proj[done[s] * PROJ_DIM..(done[s] + len) * PROJ_DIM]);
            pos.extend((done[s]..done[s] + len).map(|t| t as i32));
            starts.push(pos.len() as i32);
            slots.push(s as i32);
            num_prompt.push(seqs[s].num_prompt as i32);
            for (slot, &(ts, at)) in taps_at.iter().enumerate() {
                if ts == s && (done[s]..=done[s] + len).contains(&at) {
                    taps.extend([at as i32, slot as i32]);
                }
            }
            tap_starts.push((taps.len() / 2) as i32);
            lens.push(len);
        }
        let n = pos.len();
        let mut p = Plan::new(dev);
        let (ps, ss, ls, np, tst, tps) = (
            p.input(&pos),
            p.input(&starts),
            p.input(&slots),
            p.input(&num_prompt),
            p.input(&tap_starts),
            p.input(&taps),
        );
        let (prs, xbc, y) =
            (p.input(&proj), p.output::<f32>(n * CONV_DIM), p.output::<f32>(n * D_INNER));
        let m = p.alloc();
        let sq = MambaSeqs {
            seq_starts: m.get(ss),
            positions: m.get(ps),
            live_slots: m.get(ls),
            tap_starts: m.get(tst),
            taps: m.get(tps),
            num_seqs: live.len(),
            num_tokens: n,
        };
        let pools = (states.get(pool.live).unwrap(), states.get(pool.snapshots).unwrap());
        let conv = ConvParams {
            proj_dim: PROJ_DIM,
            xbc_offset: D_INNER,
            conv_dim: CONV_DIM,
            conv_kernel: CONV_K,
            slot_len: pool.slot_len(),
            conv_offset: pool.conv_offset(0),
        };
        dev.mamba_conv1d(
            &conv,
            m.get(prs),
            weights.get(cw),
            Some(weights.get(cb)),
            pools,
            &sq,
            m.get(xbc),
        )
        .unwrap();
        let scan = ScanParams {
            proj_dim: PROJ_DIM as i32,
            dt_offset: (D_INNER + CONV_DIM) as i32,
            conv_dim: CONV_DIM as i32,
            num_heads: HEADS as i32,
            head_dim: HEAD_DIM as i32,
            num_groups: GROUPS as i32,
            state_size: STATE as i32,
            slot_len: pool.slot_len() as i32,
            ssm_offset: pool.ssm_offset(0) as i32,
            dt_min: DT_MIN,
            dt_max: DT_MAX,
        };
        let sw = ScanWeights { dt_bias: weights.get(dtb), a: weights.get(a), d: weights.get(d) };
        dev.mamba_scan(&scan, &sw, (m.get(xbc), m.get(prs)), m.get(np), pools, &sq, m.get(y))
            .unwrap();
        let got = m.read(y);
        let mut at = 0;
        for (&s, &len) in live.iter().zip(&lens) {
            outs[s].extend_from_slice(&got[at * D_INNER..(at + len) * D_INNER]);
            at += len;
            done[s] += len;
        }
        round += 1;
    }
    (outs, states.download(pool.snapshots).unwrap())
}

#[test]
fn the_scan_matches_the_cpu_recurrence_however_tokens_are_chunked() {
    let Some(dev) = gpu_or_skip("the_scan_matches_the_cpu_recurrence_however_tokens_are_chunked")
    else {
        return;
    };
    let mut rng = Rng::new(31);
    let w = Weights {
        conv_w: rng.vec(CONV_K * CONV_DIM, -0.5, 0.5),
        conv_b: rng.vec(CONV_DIM, -0.1, 0.1),
        dt_bias: rng.vec(HEADS, -1.0, 1.0),
        a: rng.vec(HEADS, -2.0, -0.2),
        d: rng.vec(HEADS, 0.5, 1.5),
    };
    // Prompt lengths below the sequence lengths: the later positions are generated (no clamp).
    let seqs: Vec<Seq> = [(64, 40), (23, 23), (5, 3)]
        .iter()
        .map(|&(len, num_prompt)| Seq { proj: rng.vec(len * PROJ_DIM, -2.0, 2.0), num_prompt })
        .collect();
    let taps_at = [(0, 16), (0, 39), (0, 64), (1, 0), (1, 7), (2, 4)];
    let (whole, snaps) = run(dev, &w, &seqs, &[usize::MAX], &taps_at);
    let slot_len = CONV_LEN + SSM_LEN;
    for (s, seq) in seqs.iter().enumerate() {
        let (want_y, want_states) = reference(&w, seq);
        assert_close(
            &format!("scan output of sequence {s}"),
            &whole[s],
            &want_y,
            tol::SCAN,
            max_abs(&want_y),
        );
        for (slot, &(ts, at)) in taps_at.iter().enumerate().filter(|(_, t)| t.0 == s) {
            let got = &snaps[slot * slot_len..(slot + 1) * slot_len];
            let want = &want_states[at];
            // The conv state is plain multiply-add and SiLU: exact. The SSM state carries dt.
            assert_bits(
                &format!("conv snapshot of sequence {ts} at {at}"),
                &got[..CONV_LEN],
                &want[..CONV_LEN],
            );
            assert_close(
                &format!("ssm snapshot of sequence {ts} at {at}"),
                &got[CONV_LEN..],
                &want[CONV_LEN..],
                tol::SCAN,
                max_abs(&want[CONV_LEN..]).max(1e-3),
            );
        }
    }
    for chunks in [vec![1], vec![7, 1, 16], vec![3, 64], vec![16]] {
        let (got, got_snaps) = run(dev, &w, &seqs, &chunks, &taps_at);
        for s in 0..seqs.len() {
            assert_bits(&format!("sequence {s} in chunks {chunks:?}"), &got[s], &whole[s]);
        }
        assert_bits(&format!("snapshots with chunks {chunks:?}"), &got_snaps, &snaps);
    }
    let (alone, _) = run(dev, &w, &seqs[1..2], &[usize::MAX], &[]);
    assert_bits("sequence 1 alone", &alone[0], &whole[1]);
}

/// The gated norm at the test model's shape (groups of a quarter of the channels, many tokens),
/// and with one group wider than the norms' staging chunk (4,096 elements), summed over chunks.
#[test]
fn the_gated_norm_equals_the_cpu() {
    let Some(dev) = gpu_or_skip("the_gated_norm_equals_the_cpu") else { return };
    gated_norm_case(dev, 300, (D_INNER, PROJ_DIM), 4);
    gated_norm_case(dev, 3, (9000, 9000 + 7), 1);
}

fn gated_norm_case(
    dev: &'static CudaDevice,
    n: usize,
    (d_inner, proj_dim): (usize, usize),
    groups: usize,
) {
    let group = d_inner / groups;
    let mut rng = Rng::new(32);
    let (y, proj, weight) = (
        rng.vec(n * d_inner, -2.0, 2.0),
        rng.vec(n * proj_dim, -3.0, 3.0),
        rng.vec(d_inner, 0.5, 1.5),
    );
    let mut p = Plan::new(dev);
    let (ys, ps, ws) = (p.input(&y), p.input(&proj), p.input(&weight));
    let m = p.alloc();
    dev.mamba_gated_norm(m.get(ys), m.get(ps), m.get(ws), n, (d_inner, proj_dim), group, 1e-5)
        .unwrap();
    let mut want = y.clone();
    for (row, pr) in want.chunks_exact_mut(d_inner).zip(proj.chunks_exact(proj_dim)) {
        cpu::mul_silu_inplace(row, &pr[..d_inner]);
        for (chunk, w) in row.chunks_exact_mut(group).zip(weight.chunks_exact(group)) {
            cpu::rms_norm_inplace(chunk, w, 1e-5);
        }
    }
    let full = m.read(ys);
    assert_bits(&format!("gated norm, groups of {group}"), &full, &want);
}
