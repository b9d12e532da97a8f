//! The device's seeded draw (`sample_f32`) against the host sampler's ([`Sampler`]): both sum the
//! candidates' weights exactly and round those sums alike, so they pick the same token for every
//! row, however close its random number falls to a boundary, and whether a row takes one block
//! or a cluster of them.

use crate::Sampler;
use routed_backend::cuda::{ArenaLayout, CudaDevice, DeviceArena, host::SampleParams};
use routed_types::SamplingParams;

/// SplitMix64.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn unit(&mut self) -> f32 {
        (self.next() >> 40) as f32 / (1u64 << 24) as f32
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

/// A language-model-like row: a wide floor, a few dozen likely tokens, ties (logits on a grid of
/// 1/8) and a fiftieth of the tokens masked to -inf.
fn row(rng: &mut Rng, vocab: usize) -> Vec<f32> {
    let mut logits: Vec<f32> =
        (0..vocab).map(|_| (rng.unit() * 14.0 - 7.0).mul_add(8.0, 0.0).round() / 8.0).collect();
    for _ in 0..30 {
        logits[rng.below(vocab)] = 6.0 + rng.unit() * 6.0;
    }
    for _ in 0..vocab / 50 {
        logits[rng.below(vocab)] = f32::NEG_INFINITY;
    }
    logits
}

/// A row whose likely tokens are every token of the first of eight blocks (the tokens of
/// 512-token stripes 0, 8, 16, ...), tied: a cut among them leaves that block more tokens of the
/// interval than it lists, so it reads the row at every level while the other blocks read their
/// (empty) lists.
fn tied_row(rng: &mut Rng, vocab: usize) -> Vec<f32> {
    (0..vocab).map(|i| if (i / 512) % 8 == 0 { 2.0 } else { rng.unit() * 2.0 - 3.0 }).collect()
}

/// The host's sampling parameters of row `r`, spread over temperature, top-k, top-p and min-p.
fn params(r: usize, seed: u64) -> SamplingParams {
    SamplingParams {
        temperature: [1.0, 0.6, 1.4, 0.25][r % 4],
        top_k: [None, Some(40), None, Some(2500), None][r % 5],
        top_p: [1.0, 0.9, 1.0, 0.5, 0.97, 1.0][r % 6],
        min_p: [0.0, 0.0, 0.05, 0.0, 0.0, 0.0, 0.2][r % 7],
        seed,
        ..SamplingParams::default()
    }
}

/// The kernel's parameters of the same row, as the step inputs pack them.
fn device_params(p: &SamplingParams, index: u64) -> SampleParams {
    SampleParams {
        seed: p.seed,
        index,
        temperature: p.temperature,
        top_p: p.top_p,
        top_k: p.top_k.map_or(0, |k| k.max(1)),
        min_p: p.min_p,
    }
}

/// The device's token for each row of `logits`.
fn draw(dev: &CudaDevice, logits: &[f32], params: &[SampleParams], vocab: usize) -> Vec<u32> {
    let rows = params.len();
    let mut layout = ArenaLayout::new("draw test");
    let (l, p, out) = (layout.push(logits.len()), layout.push(rows), layout.push::<u32>(rows));
    let mut arena = DeviceArena::new(dev, &layout).expect("allocated");
    arena.upload(l, logits).expect("uploaded");
    arena.upload(p, params).expect("uploaded");
    let (ls, ps, os) = (arena.get(l).unwrap(), arena.get(p).unwrap(), arena.get(out).unwrap());
    dev.sample(ls, ps, os, None, rows, vocab).expect("sampled");
    arena.download(out).expect("read back")
}

fn draws_equal_the_host_samplers(dev: &CudaDevice, rows: usize, vocab: usize, seed: u64) {
    let mut rng = Rng(seed);
    let logits: Vec<f32> = (0..rows)
        .flat_map(|r| if r % 3 == 2 { tied_row(&mut rng, vocab) } else { row(&mut rng, vocab) })
        .collect();
    let host: Vec<SamplingParams> = (0..rows).map(|r| params(r, rng.next())).collect();
    let device: Vec<SampleParams> =
        host.iter().enumerate().map(|(r, p)| device_params(p, r as u64 + 3)).collect();
    let got = draw(dev, &logits, &device, vocab);
    let mut sampler = Sampler::default();
    for (r, (params, &token)) in host.iter().zip(&got).enumerate() {
        let row = &logits[r * vocab..(r + 1) * vocab];
        let want = sampler.sample(row, params, r as u64 + 3, None).token;
        assert_eq!(token, want, "row {r} of {vocab} ({params:?})");
    }
}

#[test]
fn device_draws_are_the_host_samplers_tokens() {
    let dev = CudaDevice::simulated().expect("the simulator opens");
    // One block a row, then a cluster of eight.
    assert_eq!(dev.sample_blocks_per_row(3000), 1);
    draws_equal_the_host_samplers(&dev, 60, 3000, 7);
    assert_eq!(dev.sample_blocks_per_row(20_000), 8);
    draws_equal_the_host_samplers(&dev, 30, 20_000, 8);
}

/// Rows at the edges of the definition: one token, a row of ties, every token masked but one,
/// infinities and NaN, temperatures far from 1, min-p 1 and top-k at the vocabulary. The device
/// draws the host's token (or, where NaN makes the host's choice arbitrary, some token) and every
/// launch ends.
#[test]
fn edge_rows_draw_the_host_samplers_tokens() {
    let dev = CudaDevice::simulated().expect("the simulator opens");
    let vocab = 600;
    let mut rng = Rng(11);
    let spread =
        |rng: &mut Rng| -> Vec<f32> { (0..vocab).map(|_| rng.unit() * 20.0 - 10.0).collect() };
    let mut one_left = vec![f32::NEG_INFINITY; vocab];
    one_left[417] = -3.0;
    let mut infinite = spread(&mut rng);
    infinite[5] = f32::INFINITY;
    infinite[9] = f32::INFINITY;
    let mut huge = spread(&mut rng);
    huge.iter_mut().for_each(|l| *l *= 3e37);
    let mut subnormal = vec![0.0f32; vocab];
    subnormal.iter_mut().enumerate().for_each(|(i, l)| *l = f32::from_bits(i as u32 % 7));
    let rows: Vec<(Vec<f32>, SamplingParams)> = vec![
        (vec![1.5; vocab], params(0, 1)),
        (one_left.clone(), params(1, 2)),
        (one_left, params(3, 3)),
        (infinite, params(0, 4)),
        (huge, params(0, 5)),
        (subnormal, params(2, 6)),
        (
            spread(&mut rng),
            SamplingParams { temperature: 1e-4, seed: 7, ..SamplingParams::default() },
        ),
        (
            spread(&mut rng),
            SamplingParams { temperature: 1e4, seed: 8, ..SamplingParams::default() },
        ),
        (spread(&mut rng), SamplingParams { min_p: 1.0, seed: 9, ..SamplingParams::default() }),
        (
            spread(&mut rng),
            SamplingParams {
                top_k: Some(vocab as u32),
                top_p: 0.5,
                seed: 10,
                ..SamplingParams::default()
            },
        ),
        (
            spread(&mut rng),
            SamplingParams { top_k: Some(vocab as u32 - 1), seed: 11, ..SamplingParams::default() },
        ),
        (spread(&mut rng), SamplingParams { top_p: 1e-7, seed: 12, ..SamplingParams::default() }),
    ];
    let logits: Vec<f32> = rows.iter().flat_map(|(l, _)| l.iter().copied()).collect();
    let device: Vec<SampleParams> = rows.iter().map(|(_, p)| device_params(p, 0)).collect();
    let got = draw(&dev, &logits, &device, vocab);
    let mut sampler = Sampler::default();
    for (r, ((row, params), &token)) in rows.iter().zip(&got).enumerate() {
        let want = sampler.sample(row, params, 0, None).token;
        assert_eq!(token, want, "row {r} ({params:?})");
    }
    // NaN: any token, but an answer.
    let mut nan = vec![0.5f32; vocab];
    nan[3] = f32::NAN;
    nan[100] = -f32::NAN;
    let got = draw(&dev, &nan, &[device_params(&params(0, 13), 0)], vocab);
    assert!((got[0] as usize) < vocab, "{got:?}");
}
