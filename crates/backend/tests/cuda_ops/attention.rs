//! Attention over the paged cache: against the CPU's math, and bitwise the same whether a
//! sequence's tokens run as one prefill, in chunks of different lengths, one at a time, batched
//! with other sequences, or with their keys' partitions split over CTAs and folded after.

use super::support::*;
use half::bf16;
use routed_backend::{
    cpu,
    cuda::{
        ArenaLayout, CudaDevice, DeviceArena,
        launch::{attention_items, attention_parts},
        ops::{AttentionBuffers, AttentionParams, AttentionSplit, QkvHeadsBuffers, QkvHeadsParams},
        pools::KvPool,
    },
};

/// One sequence's tokens: queries `[len, heads, hd]`, keys and values `[len, kv_heads * hd]`
/// (bf16-representable, so the cache holds them exactly), and its block table.
struct Seq {
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    table: Vec<u32>,
}

struct Case {
    p: AttentionParams,
    seqs: Vec<Seq>,
    /// Elements the caches start past their pools' (aligned) starts: 0, or an offset that breaks
    /// the 16-byte alignment the vector loads want.
    kv_offset: usize,
}

impl Case {
    fn new(p: AttentionParams, lens: &[usize], rng: &mut Rng) -> Self {
        let blocks_per_seq = p.max_blocks_per_seq;
        let mut blocks: Vec<u32> = (0..(lens.len() * blocks_per_seq) as u32).collect();
        rng.shuffle(&mut blocks);
        let width = p.num_kv_heads * p.head_dim;
        let seqs = lens
            .iter()
            .enumerate()
            .map(|(s, &len)| {
                assert!(len <= blocks_per_seq * p.block_size);
                let round = |v: Vec<bf16>| widen(&v);
                Seq {
                    q: rng.vec(len * p.num_heads * p.head_dim, -1.0, 1.0),
                    k: round(rng.bf16_vec(len * width, -1.0, 1.0)),
                    v: round(rng.bf16_vec(len * width, -2.0, 2.0)),
                    table: blocks[s * blocks_per_seq..(s + 1) * blocks_per_seq].to_vec(),
                }
            })
            .collect();
        Self { p, seqs, kv_offset: 0 }
    }

    /// Blocks the cache needs: one past the largest block any table names.
    fn num_blocks(&self) -> usize {
        self.seqs.iter().flat_map(|s| &s.table).max().map_or(0, |&b| b as usize + 1)
    }

    /// The CPU attention layer's arithmetic for one query: scores by `cpu::dot`, the scaled
    /// softmax over the query's keys, values summed with each key in the lane of its position.
    fn reference(&self, s: usize, pos: usize, head: usize) -> Vec<f32> {
        let (p, seq) = (&self.p, &self.seqs[s]);
        let (hd, group) = (p.head_dim, p.num_heads / p.num_kv_heads);
        let (kvh, width) = (head / group, p.num_kv_heads * hd);
        let first = p.sliding_window.map_or(0, |w| (pos + 1).saturating_sub(w));
        let q = &seq.q[(pos * p.num_heads + head) * hd..][..hd];
        let key = |j: usize| &seq.k[j * width + kvh * hd..][..hd];
        let mut probs: Vec<f32> = (first..=pos).map(|j| cpu::dot(q, key(j))).collect();
        cpu::softmax_scaled_inplace(&mut probs, p.scale);
        let value = |j: usize| &seq.v[(first + j) * width + kvh * hd..][..hd];
        let mut out = vec![0.0; hd];
        cpu::lane_weighted_sum(&probs, value, first % 16, &mut Vec::new(), &mut out);
        out
    }
}

/// The paged cache of one layer on the device.
struct Cache {
    arena: DeviceArena,
    kv: KvPool,
}

impl Cache {
    fn new(dev: &CudaDevice, case: &Case) -> Self {
        let mut layout = ArenaLayout::new("kv");
        let width = case.p.num_kv_heads * case.p.head_dim;
        // A block more than the tables name: room for the caches' offset (`step`).
        let kv = KvPool::reserve(&mut layout, 1, case.num_blocks() + 1, case.p.block_size, width);
        Self { arena: DeviceArena::new(dev, &layout).unwrap(), kv }
    }
}

/// One step: `chunks` of `(sequence, first position, tokens)`. Writes the chunks' keys and values,
/// runs attention (split over the partitions when `split`), and returns each chunk's outputs
/// `[tokens, heads, hd]`.
fn step(
    dev: &'static CudaDevice,
    case: &Case,
    cache: &Cache,
    chunks: &[(usize, usize, usize)],
    split: bool,
) -> Vec<Vec<f32>> {
    let p = &case.p;
    let (width, qw) = (p.num_kv_heads * p.head_dim, p.num_heads * p.head_dim);
    let (mut qkv, mut pos, mut slots, mut starts, mut tables) =
        (vec![], vec![], vec![], vec![0i32], vec![]);
    for &(s, first, len) in chunks {
        let seq = &case.seqs[s];
        for t in first..first + len {
            // The fused projection's layout: a token's queries, keys, then values.
            qkv.extend_from_slice(&seq.q[t * qw..(t + 1) * qw]);
            qkv.extend_from_slice(&seq.k[t * width..(t + 1) * width]);
            qkv.extend_from_slice(&seq.v[t * width..(t + 1) * width]);
            pos.push(t as i32);
            slots.push(cache.kv.slot(&seq.table, t).unwrap() as i32);
        }
        starts.push(pos.len() as i32);
        tables.extend(seq.table.iter().map(|&b| b as i32));
    }
    let lens: Vec<usize> = chunks.iter().map(|c| c.2).collect();
    let items: Vec<i32> = attention_items(&lens, p.num_heads / p.num_kv_heads).concat();
    let n = pos.len();
    let mut plan = Plan::new(dev);
    let (qkvs, qs, ps, ss) =
        (plan.input(&qkv), plan.output::<f32>(n * qw), plan.input(&pos), plan.input(&slots));
    let (sts, tbs, its, out) =
        (plan.input(&starts), plan.input(&tables), plan.input(&items), plan.output::<f32>(n * qw));
    let max_pos = pos.iter().max().map_or(0, |&p| p as usize);
    let num_parts = attention_parts(max_pos + 1, p.partition_tiles);
    let parts =
        plan.output::<f32>(AttentionSplit::partials_len(n, p.num_heads, p.head_dim, num_parts));
    let m = plan.alloc();
    // Whole blocks from `kv_offset` on (the pool holds a block more than the tables reach).
    let at = |span| {
        let s = cache.arena.get(span).unwrap();
        s.sub(case.kv_offset, s.len() - p.block_size * width).unwrap()
    };
    let (kc, vc) = (at(cache.kv.k[0]), at(cache.kv.v[0]));
    // The step's keys and values into the cache (no norm, no rotary: the queries pass through).
    let heads = QkvHeadsParams {
        num_heads: p.num_heads,
        num_kv_heads: p.num_kv_heads,
        head_dim: p.head_dim,
        rot_dim: p.head_dim,
        eps: 1e-6,
    };
    let (positions, slots, q) = (m.get(ps), m.get(ss), m.get(qs));
    let written = QkvHeadsBuffers {
        qkv: m.get(qkvs),
        q_norm: None,
        k_norm: None,
        cos_sin: None,
        positions,
        slots,
        q,
        k_cache: kc,
        v_cache: vc,
    };
    dev.qkv_heads(&heads, &written, n).unwrap();
    let bufs = AttentionBuffers {
        q: m.get(qs),
        k_cache: kc,
        v_cache: vc,
        block_tables: m.get(tbs),
        positions: m.get(ps),
        seq_starts: m.get(sts),
        items: m.get(its),
        out: m.get(out),
    };
    let split = split.then(|| AttentionSplit { partials: m.get(parts), num_parts });
    dev.paged_attention(p, &bufs, (n, chunks.len(), items.len() / 2), split).unwrap();
    let all = m.read(out);
    let mut at = 0;
    lens.iter()
        .map(|&len| {
            let rows = all[at * qw..(at + len) * qw].to_vec();
            at += len;
            rows
        })
        .collect()
}

/// Runs each sequence's tokens in the given chunk lengths (sequences interleaved in each step)
/// and returns every sequence's outputs `[len, heads, hd]`.
fn run_chunked(
    dev: &'static CudaDevice,
    case: &Case,
    chunk_lens: &[usize],
    split: bool,
) -> Vec<Vec<f32>> {
    let cache = Cache::new(dev, case);
    let lens: Vec<usize> =
        case.seqs.iter().map(|s| s.k.len() / (case.p.num_kv_heads * case.p.head_dim)).collect();
    let mut done = vec![0usize; lens.len()];
    let mut outs = vec![Vec::new(); lens.len()];
    let mut round = 0;
    while done.iter().zip(&lens).any(|(d, l)| d < l) {
        let chunks: Vec<_> = (0..lens.len())
            .filter(|&s| done[s] < lens[s])
            .map(|s| {
                (s, done[s], chunk_lens[(round + s) % chunk_lens.len()].min(lens[s] - done[s]))
            })
            .collect();
        for (&(s, _, len), out) in chunks.iter().zip(step(dev, case, &cache, &chunks, split)) {
            outs[s].extend(out);
            done[s] += len;
        }
        round += 1;
    }
    outs
}

fn check(name: &str, p: AttentionParams, lens: &[usize], seed: u64) {
    check_at(name, p, lens, seed, 0);
}

fn check_at(name: &str, p: AttentionParams, lens: &[usize], seed: u64, kv_offset: usize) {
    let Some(dev) = gpu_or_skip(name) else { return };
    let case = Case { kv_offset, ..Case::new(p, lens, &mut Rng::new(seed)) };
    let whole = run_chunked(dev, &case, &[usize::MAX], false);
    let (hd, heads) = (p.head_dim, p.num_heads);
    for (s, out) in whole.iter().enumerate() {
        let scale = max_abs(&case.seqs[s].v);
        for pos in 0..lens[s] {
            for head in 0..heads {
                let got = &out[(pos * heads + head) * hd..][..hd];
                let what = format!("{name}: seq {s} pos {pos} head {head}");
                assert_close(&what, got, &case.reference(s, pos, head), tol::ATTENTION, scale);
            }
        }
    }
    for chunking in [vec![1], vec![7, 16, 1, 33], vec![5, 64], vec![32]] {
        let got = run_chunked(dev, &case, &chunking, false);
        for (s, (g, w)) in got.iter().zip(&whole).enumerate() {
            assert_bits(&format!("{name}: seq {s} in chunks {chunking:?}"), g, w);
        }
    }
    // Each partition in a CTA of its own, folded by the combine: the same bits, for decode rows
    // and prefill chunks alike.
    for chunking in [vec![1], vec![usize::MAX], vec![7, 16, 1, 33]] {
        let got = run_chunked(dev, &case, &chunking, true);
        for (s, (g, w)) in got.iter().zip(&whole).enumerate() {
            assert_bits(&format!("{name}: seq {s} split, in chunks {chunking:?}"), g, w);
        }
    }
    // A sequence alone gives the bits it has in the batch.
    for (s, (seq, want)) in case.seqs.iter().zip(&whole).enumerate() {
        let alone = Case { p, seqs: vec![clone_seq(seq)], kv_offset: case.kv_offset };
        let got = run_chunked(dev, &alone, &[usize::MAX], false);
        assert_bits(&format!("{name}: seq {s} alone"), &got[0], want);
    }
}

fn clone_seq(s: &Seq) -> Seq {
    Seq { q: s.q.clone(), k: s.k.clone(), v: s.v.clone(), table: s.table.clone() }
}

#[test]
fn grouped_query_attention_matches_the_cpu_however_tokens_are_batched() {
    let p = AttentionParams {
        num_heads: 8,
        num_kv_heads: 2,
        head_dim: 64,
        block_size: 16,
        max_blocks_per_seq: 8,
        sliding_window: None,
        scale: 0.125,
        // Partitions of 32 positions: the longest sequence folds 4.
        partition_tiles: 1,
    };
    check(
        "grouped_query_attention_matches_the_cpu_however_tokens_are_batched",
        p,
        &[37, 100, 5],
        11,
    );
}

#[test]
fn sliding_window_attention_with_wide_heads_matches_the_cpu() {
    let p = AttentionParams {
        num_heads: 4,
        num_kv_heads: 1,
        head_dim: 128,
        block_size: 16,
        max_blocks_per_seq: 6,
        sliding_window: Some(40),
        scale: 1.0 / 128f32.sqrt(),
        // Partitions of 64 positions: windows that straddle two, and windows inside one.
        partition_tiles: 2,
    };
    check("sliding_window_attention_with_wide_heads_matches_the_cpu", p, &[90, 41, 1], 12);
}

/// A head width that is not a multiple of 8 stages its tiles one element at a time (the wider
/// heads above take 16-byte loads): the same bits.
#[test]
fn head_widths_off_the_vector_width_match_the_cpu() {
    let p = AttentionParams {
        num_heads: 6,
        num_kv_heads: 3,
        head_dim: 36,
        block_size: 8,
        max_blocks_per_seq: 10,
        sliding_window: None,
        scale: 1.0 / 6.0,
        partition_tiles: 1,
    };
    check("head_widths_off_the_vector_width_match_the_cpu", p, &[70, 9], 13);
}

/// Caches whose bases are not 16-byte aligned (one element past the pool's start) stage their
/// tiles one element at a time, with the same results: a 16-byte load there would fault.
#[test]
fn caches_off_the_vector_alignment_match_the_cpu() {
    let p = AttentionParams {
        num_heads: 4,
        num_kv_heads: 2,
        head_dim: 32,
        block_size: 8,
        max_blocks_per_seq: 8,
        sliding_window: None,
        scale: 1.0 / 32f32.sqrt(),
        partition_tiles: 1,
    };
    check_at("caches_off_the_vector_alignment_match_the_cpu", p, &[45, 3], 14, 1);
}
