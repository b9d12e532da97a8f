//! Times the host sampler on one row of logits of Qwen3's vocabulary (151,936), per setting:
//! greedy, temperature 1 (what RL rollouts sample with), top-p, top-k, min-p, and the
//! repetition penalty over a 4,096-token history.
//!
//! Run: `cargo bench -p routed-model --bench sampler`

use routed_model::Sampler;
use routed_types::{SamplingParams, SeqContext, TokenId};
use std::time::{Duration, Instant};

const VOCAB: usize = 151_936;
const ROWS: usize = 8;
const ROUNDS: usize = 15;

/// Logits shaped like a language model's: most of the vocabulary far below a few dozen likely
/// tokens (SplitMix64, so every run times the same rows).
fn rows() -> Vec<Vec<f32>> {
    let mut state = 7u64;
    let mut next = move || {
        state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        ((z ^ (z >> 31)) >> 40) as f32 / (1u64 << 24) as f32
    };
    (0..ROWS)
        .map(|_| {
            let mut row: Vec<f32> = (0..VOCAB).map(|_| next() * 12.0 - 6.0).collect();
            for _ in 0..40 {
                let t = (next() * VOCAB as f32) as usize % VOCAB;
                row[t] = 8.0 + next() * 8.0;
            }
            row
        })
        .collect()
}

fn main() {
    let rows = rows();
    let history = SeqContext::new(
        (0..4096u32).map(|i| i.wrapping_mul(2_654_435_761) % VOCAB as u32).collect(),
        &(0..64u32).map(|i| i * 37 % VOCAB as u32).collect::<Vec<TokenId>>(),
    );
    let seeded = SamplingParams { temperature: 1.0, seed: 3, ..SamplingParams::greedy(1) };
    let settings: [(&str, SamplingParams); 6] = [
        ("greedy", SamplingParams::greedy(1)),
        ("temperature 1", seeded.clone()),
        ("top_p 0.9", SamplingParams { top_p: 0.9, ..seeded.clone() }),
        ("top_k 50", SamplingParams { top_k: Some(50), ..seeded.clone() }),
        ("min_p 0.05", SamplingParams { min_p: 0.05, ..seeded.clone() }),
        ("repetition 1.1", SamplingParams { repetition_penalty: 1.1, ..seeded.clone() }),
    ];
    let mut sampler = Sampler::default();
    for (name, params) in settings {
        let mut samples = Vec::with_capacity(ROUNDS);
        let mut checksum = 0u64;
        for round in 0..ROUNDS {
            let start = Instant::now();
            for (i, row) in rows.iter().enumerate() {
                let t = sampler.sample(row, &params, (round * ROWS + i) as u64, Some(&history));
                checksum = checksum.wrapping_add(t.token as u64);
            }
            samples.push(start.elapsed() / ROWS as u32);
        }
        samples.sort();
        let median: Duration = samples[ROUNDS / 2];
        println!(
            "sampler/{name}: median {:.3} ms per row (min {:.3}), checksum {checksum}",
            median.as_secs_f64() * 1e3,
            samples[0].as_secs_f64() * 1e3
        );
    }
}
