//! Seeded sampling against the CPU sampler's definition (the model crate's `Sampler`), computed
//! here apart in floating point: the same token wherever the draw is not within rounding of a
//! boundary of the CDF or of the top-p cut (the model crate's `gpu::draw_tests` compares the
//! draw with the `Sampler` itself, every row);
//! logit edits (bias and penalties) exactly the CPU's passes, undone after the choice; greedy
//! tokens in the CPU's order on rows with NaN, infinities and signed zeros.

use super::support::*;
use routed_backend::{
    cuda::{CudaDevice, host::SampleParams},
    logit_edits::{EditBuilder, LOGIT_EDIT_WORDS, LogitEdit},
};
use routed_types::{SamplingParams, SeqContext};

/// SplitMix64's finaliser over (seed, index), as the CPU sampler draws.
fn uniform(seed: u64, index: u64) -> f64 {
    let mut z = seed.wrapping_add(index.wrapping_add(1).wrapping_mul(0x9E37_79B9_7F4A_7C15));
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^= z >> 31;
    (z >> 11) as f64 / (1u64 << 53) as f64
}

/// The CPU sampler's token, and whether every cut it made was clear of rounding (margins of
/// at least 1e-4 of the mass).
fn reference(logits: &[f32], p: &SampleParams) -> (u32, bool) {
    let mut order: Vec<u32> = (0..logits.len() as u32).collect();
    order.sort_by(|&a, &b| logits[b as usize].total_cmp(&logits[a as usize]).then(a.cmp(&b)));
    let keep = if p.top_k == 0 { logits.len() } else { (p.top_k as usize).min(logits.len()) };
    order.truncate(keep);
    let max = logits[order[0] as usize];
    let inv_t = 1.0 / p.temperature;
    // The CPU sampler's weights: its kernels' polynomial exp.
    let mut probs: Vec<f32> = order
        .iter()
        .map(|&i| routed_backend::cpu::exp_nonpositive((logits[i as usize] - max) * inv_t))
        .collect();
    let mut clear = true;
    if p.min_p > 0.0 {
        let cut = probs.iter().position(|&q| q < p.min_p).unwrap_or(probs.len());
        clear &= probs.iter().all(|&q| (q - p.min_p).abs() > 1e-6);
        probs.truncate(cut.max(1));
        order.truncate(cut.max(1));
    }
    let total: f32 = probs.iter().sum();
    if p.top_p < 1.0 {
        let mut mass = 0.0f32;
        let mut cut = probs.len();
        for (i, q) in probs.iter().enumerate() {
            let before = mass;
            mass += q / total;
            if mass >= p.top_p {
                cut = i + 1;
                clear &= p.top_p - before > 1e-4 && mass - p.top_p > 1e-4;
                break;
            }
        }
        probs.truncate(cut);
        order.truncate(cut);
    }
    let total: f64 = probs.iter().map(|&q| q as f64).sum();
    let mut target = uniform(p.seed, p.index) * total;
    for (i, &q) in probs.iter().enumerate() {
        let before = target;
        target -= q as f64;
        if target < 0.0 {
            clear &= before > 1e-4 * total && -target > 1e-4 * total;
            return (order[i], clear);
        }
    }
    (*order.last().unwrap(), false)
}

/// Checks each row's draw against the CPU sampler's where that is clear of a boundary, and that
/// no draw is a masked token; returns how many were clear.
fn check_draws(logits: &[f32], params: &[SampleParams], got: &[u32], vocab: usize) -> usize {
    let mut num_clear = 0;
    for (r, (p, &token)) in params.iter().zip(got).enumerate() {
        let row = &logits[r * vocab..(r + 1) * vocab];
        assert!(row[token as usize].is_finite(), "row {r}: a masked token");
        let (want, clear) = reference(row, p);
        if clear {
            assert_eq!(token, want, "row {r} ({p:?})");
            num_clear += 1;
        }
    }
    num_clear
}

/// One draw per row of `logits` by the device sampler, which also gives each row's log-softmax
/// normaliser and its token's logprob: bit for bit the log-softmax and gather kernels'.
fn draw(
    dev: &'static CudaDevice,
    logits: &[f32],
    params: &[SampleParams],
    vocab: usize,
) -> Vec<u32> {
    let rows = params.len();
    let mut p = Plan::new(dev);
    let (ls, ps, out) = (p.input(logits), p.input(params), p.output::<u32>(rows));
    let (z, want_z) = (p.output::<f32>(rows), p.output::<f32>(rows));
    let (lp, want_lp) = (p.output::<f32>(rows), p.output::<f32>(rows));
    let m = p.alloc();
    let own = (m.get(z), m.get(lp));
    dev.sample(m.get(ls), m.get(ps), m.get(out), Some(own), rows, vocab).unwrap();
    dev.log_softmax(m.get(ls), None, m.get(want_z), rows, vocab).unwrap();
    dev.gather_logprob(m.get(ls), m.get(out), m.get(want_z), m.get(want_lp), rows, vocab).unwrap();
    assert_bits("the draw's log_z", &m.read(z), &m.read(want_z));
    assert_bits("the draw's logprobs", &m.read(lp), &m.read(want_lp));
    m.read(out)
}

#[test]
fn seeded_samples_equal_the_cpu_sampler_and_do_not_depend_on_the_batch() {
    let Some(dev) =
        gpu_or_skip("seeded_samples_equal_the_cpu_sampler_and_do_not_depend_on_the_batch")
    else {
        return;
    };
    let (rows, vocab) = (96, 3000);
    let mut rng = Rng::new(41);
    let logits = rng.vec(rows * vocab, -6.0, 6.0);
    let params: Vec<SampleParams> = (0..rows)
        .map(|r| SampleParams {
            seed: rng.next_u64(),
            index: r as u64,
            temperature: [0.5, 1.0, 1.7][r % 3],
            top_p: [1.0, 0.9, 0.3, 1.0][r % 4],
            top_k: [0, 1, 20, 0, 500][r % 5],
            min_p: [0.0, 0.1, 0.0, 0.02, 0.0, 0.5, 0.0][r % 7],
        })
        .collect();
    let mut p = Plan::new(dev);
    let (ls, ps, out) = (p.input(&logits), p.input(&params), p.output::<u32>(rows));
    let m = p.alloc();
    dev.sample(m.get(ls), m.get(ps), m.get(out), None, rows, vocab).unwrap();
    let got = m.read(out);
    let num_clear = check_draws(&logits, &params, &got, vocab);
    // Rows without a top-k cut spread their mass over 3000 tokens (about 3e-4 of it each), so
    // the 1e-4 margins on both sides of a draw leave out about a third of those rows; three in
    // four rows clear keeps the comparison from being vacuous.
    assert!(num_clear >= rows * 3 / 4, "only {num_clear} of {rows} draws were clear of a boundary");
    // Rows alone and in other batches draw the same tokens.
    for (at, b) in [(0, 1), (50, 1), (5, 17), (0, 95)] {
        let sub = |s, w| m.get(s).sub(at * w, b * w).unwrap();
        dev.sample(
            sub(ls, vocab),
            m.get(ps).sub(at, b).unwrap(),
            m.get(out).sub(at, b).unwrap(),
            None,
            b,
            vocab,
        )
        .unwrap();
        assert_eq!(m.read(out)[at..at + b], got[at..at + b], "rows {at}..{}", at + b);
    }
}

/// Coarse logits (many ties, which only the token ids order) and masked tokens (-inf): the
/// sampler's search must narrow down to the id part of the rank keys and never pick a masked
/// token.
#[test]
fn seeded_samples_with_ties_and_masked_tokens_equal_the_cpu_sampler() {
    let Some(dev) = gpu_or_skip("seeded_samples_with_ties_and_masked_tokens_equal_the_cpu_sampler")
    else {
        return;
    };
    let (rows, vocab) = (60, 2000);
    let mut rng = Rng::new(44);
    let mut logits: Vec<f32> =
        (0..rows * vocab).map(|_| rng.below(24) as f32 * 0.25 - 3.0).collect();
    for _ in 0..rows * 300 {
        logits[rng.below(rows * vocab)] = f32::NEG_INFINITY;
    }
    let params: Vec<SampleParams> = (0..rows)
        .map(|r| SampleParams {
            seed: rng.next_u64(),
            index: r as u64,
            temperature: [0.6, 1.0, 1.5][r % 3],
            top_p: [1.0, 0.8, 0.5][r % 3],
            top_k: [0, 7, 300, 0][r % 4],
            min_p: [0.0, 0.0, 0.05, 0.0, 0.3][r % 5],
        })
        .collect();
    let num_clear = check_draws(&logits, &params, &draw(dev, &logits, &params, vocab), vocab);
    assert!(num_clear >= rows / 2, "only {num_clear} of {rows} draws were clear of a boundary");
}

/// Rows whose likely tokens all fall in one thread's stripe (token ids a row's threads apart, so
/// one block holds every candidate of the search's later levels and the others none) and rows
/// whose likely tokens spread over the threads and blocks: both draw the CPU sampler's tokens, at a vocabulary that spreads a row over a cluster of
/// blocks on devices with clusters (the simulator's too) and over one block elsewhere, and
/// whatever rows share the launch.
#[test]
fn seeded_samples_whatever_the_threads_holding_the_likely_tokens() {
    let name = "seeded_samples_whatever_the_threads_holding_the_likely_tokens";
    let Some(dev) = gpu_or_skip(name) else { return };
    let (rows, vocab) = (12, 40_000);
    // A row's threads: 4,096 in a cluster of 8 blocks (about 10 tokens a stripe), 512 in one
    // block (about 78).
    let threads = 512 * dev.sample_blocks_per_row(vocab);
    let mut rng = Rng::new(45);
    let mut logits = vec![0.0f32; rows * vocab];
    for (r, row) in logits.chunks_exact_mut(vocab).enumerate() {
        for (i, l) in row.iter_mut().enumerate() {
            // Even rows: the likely tokens are one thread's; odd rows: every 37th token, spread
            // over the threads.
            let likely = if r % 2 == 0 { i % threads == 7 } else { i % 37 == 0 };
            *l = if likely { rng.uniform(2.0, 4.0) } else { rng.uniform(-30.0, -20.0) };
        }
    }
    let params: Vec<SampleParams> = (0..rows)
        .map(|r| SampleParams {
            seed: rng.next_u64(),
            index: r as u64,
            temperature: [1.0, 0.7][r / 2 % 2],
            top_p: [1.0, 1.0, 0.8][r / 4 % 3],
            top_k: [0, 0, 0, 5][r / 2 % 4],
            min_p: 0.0,
        })
        .collect();
    let got = draw(dev, &logits, &params, vocab);
    let num_clear = check_draws(&logits, &params, &got, vocab);
    assert!(num_clear >= rows * 3 / 4, "only {num_clear} of {rows} draws were clear of a boundary");
    for (r, &token) in got.iter().enumerate() {
        let likely = if r % 2 == 0 { token as usize % threads == 7 } else { token % 37 == 0 };
        assert!(likely, "row {r} drew the unlikely token {token}");
    }
    let (at, b) = (5, 3);
    let part = draw(dev, &logits[at * vocab..(at + b) * vocab], &params[at..at + b], vocab);
    assert_eq!(part, got[at..at + b], "rows {at}..{} drawn apart", at + b);
}

#[test]
fn chosen_logprobs_are_the_logit_minus_the_normaliser() {
    let Some(dev) = gpu_or_skip("chosen_logprobs_are_the_logit_minus_the_normaliser") else {
        return;
    };
    let (rows, vocab) = (37, 5000);
    let mut rng = Rng::new(43);
    let logits = rng.vec(rows * vocab, -8.0, 8.0);
    let ids: Vec<u32> = (0..rows).map(|_| rng.below(vocab) as u32).collect();
    let mut p = Plan::new(dev);
    let (ls, is) = (p.input(&logits), p.input(&ids));
    let (log_z, out) = (p.output::<f32>(rows), p.output::<f32>(rows));
    let m = p.alloc();
    dev.log_softmax(m.get(ls), None, m.get(log_z), rows, vocab).unwrap();
    dev.gather_logprob(m.get(ls), m.get(is), m.get(log_z), m.get(out), rows, vocab).unwrap();
    let (z, got) = (m.read(log_z), m.read(out));
    for r in 0..rows {
        let row = &logits[r * vocab..(r + 1) * vocab];
        // Exactly the logit minus the device's own normaliser...
        assert_eq!(got[r].to_bits(), (row[ids[r] as usize] - z[r]).to_bits(), "row {r}");
        // ...which is the CPU's within the log_z tolerance.
        let want = row[ids[r] as usize] - routed_backend::cpu::log_sum_exp(row);
        assert_close(&format!("row {r}"), &[got[r]], &[want], tol::LOG_Z, 1.0);
    }
}

#[test]
fn ranks_and_alternatives_are_the_cpu_samplers_exactly() {
    let Some(dev) = gpu_or_skip("ranks_and_alternatives_are_the_cpu_samplers_exactly") else {
        return;
    };
    // A row in one block, and (on devices with clusters) over a cluster of 8; the most likely
    // token alone, a few, the most a request may ask for (a search among tied logits), and the
    // whole of a tiny vocabulary.
    for (rows, vocab, n) in [(9, 3001, 1), (9, 3001, 5), (9, 3001, 20), (3, 20_000, 20), (2, 7, 7)]
    {
        ranks_and_alternatives(dev, rows, vocab, n);
    }
}

fn ranks_and_alternatives(dev: &'static CudaDevice, rows: usize, vocab: usize, n: usize) {
    let mut rng = Rng::new(47);
    // Coarse values, so that many logits tie; some -inf (a masked vocabulary).
    let mut logits: Vec<f32> = (0..rows * vocab).map(|_| (rng.below(40) as f32) * 0.25).collect();
    for _ in 0..vocab / 15 {
        logits[rng.below(rows * vocab)] = f32::NEG_INFINITY;
    }
    let chosen: Vec<u32> = (0..rows).map(|_| rng.below(vocab) as u32).collect();
    let mut p = Plan::new(dev);
    let (ls, cs) = (p.input(&logits), p.input(&chosen));
    let (log_z, ids, lps, ranks) = (
        p.output::<f32>(rows),
        p.output::<u32>(rows * n),
        p.output::<f32>(rows * n),
        p.output::<u32>(rows),
    );
    let m = p.alloc();
    dev.log_softmax(m.get(ls), None, m.get(log_z), rows, vocab).unwrap();
    let top = (m.get(ids), m.get(lps), n);
    dev.top_logprobs(m.get(ls), m.get(cs), m.get(log_z), top, m.get(ranks), rows, vocab).unwrap();
    let (z, got_ids, got_lps, got_ranks) = (m.read(log_z), m.read(ids), m.read(lps), m.read(ranks));
    for r in 0..rows {
        let row = &logits[r * vocab..(r + 1) * vocab];
        // The CPU sampler's order: logits descending in total order, ties to the lower id.
        let mut order: Vec<u32> = (0..vocab as u32).collect();
        order.sort_by(|&a, &b| row[b as usize].total_cmp(&row[a as usize]).then(a.cmp(&b)));
        let rank = order.iter().position(|&t| t == chosen[r]).unwrap() as u32 + 1;
        assert_eq!(got_ranks[r], rank, "row {r} of {vocab}: rank of {}", chosen[r]);
        assert_eq!(got_ids[r * n..(r + 1) * n], order[..n], "row {r} of {vocab}: alternatives");
        for j in 0..n {
            let want = row[order[j] as usize] - z[r];
            assert_eq!(got_lps[r * n + j].to_bits(), want.to_bits(), "row {r}, alternative {j}");
        }
        let want_z = routed_backend::cpu::log_sum_exp(row);
        assert_close(&format!("row {r} of {vocab}: log_z"), &[z[r]], &[want_z], tol::LOG_Z, 1.0);
    }
    // Ranks alone (no alternatives) are the same.
    let none = (m.get(ids).sub(0, 0).unwrap(), m.get(lps).sub(0, 0).unwrap(), 0);
    dev.top_logprobs(m.get(ls), m.get(cs), m.get(log_z), none, m.get(ranks), rows, vocab).unwrap();
    assert_eq!(m.read(ranks), got_ranks);
    // More alternatives than a request may ask for are refused.
    let many = (m.get(ids), m.get(lps), 21);
    let refused =
        dev.top_logprobs(m.get(ls), m.get(cs), m.get(log_z), many, m.get(ranks), 0, vocab);
    assert!(refused.is_err(), "21 alternatives");
}

/// The CPU sampler's passes over a row (`Sampler::process`) by their definition over the whole
/// history: the bias, the repetition penalty over the distinct tokens of prompt and output, the
/// frequency and presence penalties over the output's.
fn processed(row: &[f32], params: &SamplingParams, (prompt, output): (&[u32], &[u32])) -> Vec<f32> {
    let mut out = row.to_vec();
    for &(t, b) in &params.logit_bias {
        if let Some(l) = out.get_mut(t as usize) {
            *l += b;
        }
    }
    let rp = params.repetition_penalty;
    let mut seen: Vec<u32> = prompt.iter().chain(output).copied().collect();
    seen.sort_unstable();
    seen.dedup();
    if rp != 1.0 {
        for &t in &seen {
            let l = &mut out[t as usize];
            *l = if *l > 0.0 { *l / rp } else { *l * rp };
        }
    }
    let mut output = output.to_vec();
    output.sort_unstable();
    if params.presence_penalty != 0.0 || params.frequency_penalty != 0.0 {
        for run in output.chunk_by(|a, b| a == b) {
            let l = &mut out[run[0] as usize];
            *l -= params.frequency_penalty * run.len() as f32;
            *l -= params.presence_penalty;
        }
    }
    out
}

#[test]
fn logit_edits_are_the_cpu_passes_and_are_undone() {
    let Some(dev) = gpu_or_skip("logit_edits_are_the_cpu_passes_and_are_undone") else {
        return;
    };
    let (rows, vocab) = (5, 1000);
    let mut rng = Rng::new(53);
    let logits = rng.vec(rows * vocab, -4.0, 4.0);
    let tokens = |rng: &mut Rng, n: usize| (0..n).map(|_| rng.below(60) as u32).collect::<Vec<_>>();
    let mut edits: Vec<LogitEdit> = Vec::new();
    let mut starts = vec![0i32];
    let mut want = Vec::new();
    let mut builder = EditBuilder::default();
    for r in 0..rows {
        let params = SamplingParams {
            logit_bias: [vec![], vec![(7, 30.0), (999, -2.5)], vec![(3, -100.0)]][r % 3].clone(),
            repetition_penalty: [1.0, 1.3, 0.8][r % 3],
            frequency_penalty: [0.0, 0.4, 0.0, 1.5, 0.2][r % 5],
            presence_penalty: [0.0, 0.0, 0.7, 0.5][r % 4],
            ..SamplingParams::default()
        };
        let (prompt, output) = (tokens(&mut rng, 30), tokens(&mut rng, 25));
        let h = SeqContext::new(prompt.clone(), &output);
        assert!(builder.build(&params, Some(&h), vocab, &mut edits));
        starts.push(edits.len() as i32);
        let history = (&prompt[..], &output[..]);
        want.extend(processed(&logits[r * vocab..(r + 1) * vocab], &params, history));
    }
    assert!(edits.len() > 100, "{} edits", edits.len());
    let mut words = vec![0u32; edits.len() * LOGIT_EDIT_WORDS];
    for (e, w) in edits.iter().zip(words.chunks_exact_mut(LOGIT_EDIT_WORDS)) {
        e.write(w);
    }
    let mut p = Plan::new(dev);
    let (ls, ss, ws) = (p.input(&logits), p.input(&starts), p.input(&words));
    let (saved, out) = (p.output::<f32>(edits.len()), p.output::<u32>(rows));
    let m = p.alloc();
    let list = (m.get(ss), m.get(ws));
    let counts = (rows, edits.len());
    dev.logit_edits(m.get(ls), list, m.get(saved), counts, vocab, false).unwrap();
    assert_bits("edited rows", &m.read(ls), &want);
    dev.argmax(m.get(ls), m.get(out), rows, vocab).unwrap();
    for (r, &token) in m.read(out).iter().enumerate() {
        let row = &want[r * vocab..(r + 1) * vocab];
        assert_eq!(token as usize, routed_backend::cpu::argmax(row), "row {r}: the edited argmax");
    }
    assert_eq!(m.read(out)[1], 7, "a bias of 30 picks token 7");
    dev.logit_edits(m.get(ls), list, m.get(saved), counts, vocab, true).unwrap();
    assert_bits("restored rows", &m.read(ls), &logits);
}

#[test]
fn first_maxima_follow_the_cpu_order_through_nan_infinities_and_signed_zeros() {
    let test = "first_maxima_follow_the_cpu_order_through_nan_infinities_and_signed_zeros";
    let Some(dev) = gpu_or_skip(test) else { return };
    // Wider than a block's stripes, so that a thread holds several of a row's logits.
    let vocab = 4_096;
    let mut rng = Rng::new(91);
    let plain = rng.vec(vocab, -12.0, 12.0);
    let mut rows: Vec<Vec<f32>> = Vec::new();
    let mut edit = |f: &dyn Fn(&mut Vec<f32>)| {
        let mut row = plain.clone();
        f(&mut row);
        rows.push(row);
    };
    // A NaN first logit is cpu::argmax's answer whatever follows.
    edit(&|r| r[0] = f32::NAN);
    // NaN opening some threads' stripes (every 512th logit from 1), the maximum behind one.
    edit(&|r| {
        (1..vocab).step_by(512).for_each(|i| r[i] = f32::NAN);
        r[257] = 40.0;
    });
    // NaN everywhere but one number.
    edit(&|r| {
        r.fill(f32::NAN);
        r[0] = -1.0;
        r[4_000] = 3.0;
    });
    edit(&|r| r.fill(f32::NAN));
    // -0 and +0 tie: the first one wins.
    edit(&|r| {
        r.fill(-0.0);
        r[3_000] = 0.0;
    });
    edit(&|r| {
        r.fill(-1.0);
        r[700] = -0.0;
        r[9] = 0.0;
        r[3] = -0.0;
    });
    edit(&|r| r.fill(f32::NEG_INFINITY));
    edit(&|r| {
        r[100] = f32::INFINITY;
        r[50] = f32::INFINITY;
    });
    edit(&|r| {
        r.fill(f32::NEG_INFINITY);
        r[2_222] = f32::MIN;
    });
    edit(&|r| r[vocab - 1] = 1e30);
    let n = rows.len();
    let logits: Vec<f32> = rows.concat();
    let mut p = Plan::new(dev);
    let (ls, ids, fused_ids) = (p.input(&logits), p.output::<u32>(n), p.output::<u32>(n));
    let (log_z, fused_z) = (p.output::<f32>(n), p.output::<f32>(n));
    let (lps, fused_lps) = (p.output::<f32>(n), p.output::<f32>(n));
    let m = p.alloc();
    dev.argmax(m.get(ls), m.get(ids), n, vocab).unwrap();
    dev.log_softmax(m.get(ls), None, m.get(log_z), n, vocab).unwrap();
    dev.gather_logprob(m.get(ls), m.get(ids), m.get(log_z), m.get(lps), n, vocab).unwrap();
    let fused = (m.get(fused_ids), m.get(fused_lps));
    dev.log_softmax_argmax(m.get(ls), m.get(fused_z), fused, n, vocab).unwrap();
    let (got, fused) = (m.read(ids), m.read(fused_ids));
    for (r, row) in rows.iter().enumerate() {
        let want = routed_backend::cpu::argmax(row);
        assert_eq!(got[r] as usize, want, "argmax_f32, row {r}");
        assert_eq!(fused[r] as usize, want, "log_softmax_argmax, row {r}");
    }
    assert_bits("log_softmax_argmax's log_z", &m.read(fused_z), &m.read(log_z));
    assert_bits("log_softmax_argmax's logprobs", &m.read(fused_lps), &m.read(lps));
}
