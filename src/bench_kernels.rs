//! `routed bench kernels`: the device's matrix product, the residual add and norm, a MoE layer's
//! expert work, decode attention and token selection at a model's shapes, timed on their own,
//! with the bytes they must move and the flops they do (`docs/gpu.md`).
//!
//! Each case is uploaded once, then [`LAUNCHES`] launches of its kernel are captured into a CUDA
//! graph, and every run replays the graph and waits for it: the per-launch time excludes the
//! host's launch cost, as a kernel's own time should. `benches/torch_kernels.py` times PyTorch at
//! the same shapes under the same scenario names, and measures the device's copy bandwidth.

use anyhow::{Context, Result, ensure};
use half::bf16;
use routed_backend::{
    Device, DeviceSpec,
    cuda::{
        ArenaLayout, CudaDevice, DeviceArena, DeviceElem, Span,
        host::SampleParams,
        launch::{self, ATTN_PARTITION_TILES, attention_items, attention_parts},
        ops::{
            AttentionBuffers, AttentionParams, AttentionSplit, ExpertActivation, ExpertShard,
            GemmTiling, MoeSortBuffers, Weights,
        },
    },
};
use routed_model::{FfnActivation, ModelConfig};
use serde_json::{Value, json};
use std::{path::Path, time::Instant};

/// Launches per graph: enough that a replay's own cost disappears in the kernels' time.
const LAUNCHES: usize = 20;
/// Contexts the decode attention reads, in tokens.
const CONTEXTS: [usize; 2] = [512, 2048];
/// Tokens per KV block in the attention cases (the engine's default).
const BLOCK_SIZE: usize = 16;

/// One timed case.
struct Case {
    scenario: String,
    kernel: String,
    bytes: f64,
    flops: f64,
}

/// Times every case of the model in `dir` on `spec` with `batch_sizes` rows (tokens for the
/// products and the experts, sequences for the attention and the sampling), `repeats` graph
/// replays each.
pub fn run(
    spec: DeviceSpec,
    dir: &Path,
    batch_sizes: &[usize],
    repeats: usize,
) -> Result<Vec<Value>> {
    let dev = match Device::open(spec)? {
        Device::Cuda(dev) => dev,
        Device::Cpu => anyhow::bail!("the kernels scenario needs a CUDA device (--device cuda:N)"),
    };
    let config = ModelConfig::from_dir(dir).context("reading the model's config")?;
    ensure!(repeats > 0, "--repeats must be at least 1");
    println!("| case | kernel | us | GB/s | TFLOP/s |");
    println!("|---|---|---:|---:|---:|");
    let mut records = Vec::new();
    for &m in batch_sizes {
        records.extend(product_cases(&dev, &config, m, repeats)?);
        records.push(norm_case(&dev, &config, m, repeats)?);
        records.extend(expert_case(&dev, &config, m, repeats)?);
        records.extend(attention_cases(&dev, &config, m, repeats)?);
        records.extend(sampling_cases(&dev, &config, m, repeats)?);
    }
    Ok(records)
}

/// The model's products with `m` rows.
fn product_cases(
    dev: &CudaDevice,
    c: &ModelConfig,
    m: usize,
    repeats: usize,
) -> Result<Vec<Value>> {
    let mut records = Vec::new();
    for (what, n, k) in products(c) {
        // The CPU's arithmetic, then bf16 precision on tensor cores, in each tiling (the engine
        // takes GemmTiling::for_shape's); the row kernel at one row only, where it is taken (it
        // reads the weights once per row).
        let row = (m == 1).then_some(("gemm_row", "gemm_bf16w_f32_row", false, GemmTiling::Row));
        for (prefix, kernel, mma, tiling) in row.into_iter().chain([
            ("gemm", "gemm_bf16w_f32", false, GemmTiling::Thin),
            ("gemm_staged", "gemm_bf16w_f32_staged", false, GemmTiling::Staged),
            ("gemm_mma", "gemm_bf16w_mma", true, GemmTiling::Thin),
            ("gemm_mma_staged", "gemm_bf16w_mma_staged", true, GemmTiling::Staged),
            ("gemm_mma_wide", "gemm_bf16w_mma_staged_wide", true, GemmTiling::StagedWide),
        ]) {
            let case = Case {
                scenario: format!("{prefix}_{what}_m{m}"),
                kernel: kernel.into(),
                bytes: (2 * n * k + 4 * m * k + 4 * m * n) as f64,
                flops: (2 * m * n * k) as f64,
            };
            records.push(report(&case, time_gemm(dev, (m, n, k), (mma, tiling), repeats)?));
        }
    }
    Ok(records)
}

/// The residual add and the next norm over `m` rows of the model's hidden width, as every layer
/// runs it twice: the rows and the residual read, both written, the weight read.
fn norm_case(dev: &CudaDevice, c: &ModelConfig, m: usize, repeats: usize) -> Result<Value> {
    let h = c.hidden_size;
    let mut layout = ArenaLayout::new("bench");
    let (x, branch, w, normed) = (
        layout.push::<f32>(m * h),
        layout.push::<f32>(m * h),
        layout.push::<f32>(h),
        layout.push::<f32>(m * h),
    );
    let mut arena = DeviceArena::new(dev, &layout)?;
    upload(&mut arena, x, &fill(m * h, 3, |v| v))?;
    upload(&mut arena, branch, &fill(m * h, 4, |v| v))?;
    upload(&mut arena, w, &fill(h, 5, |v| 1.0 + v))?;
    let (x, branch, w, normed) =
        (arena.get(x)?, arena.get(branch)?, arena.get(w)?, arena.get(normed)?);
    let case = Case {
        scenario: format!("add_rms_norm_m{m}"),
        kernel: "add_rms_norm_f32".into(),
        bytes: (16 * m * h + 4 * h) as f64,
        flops: 0.0,
    };
    // The residual grows by the branch each launch: a few hundred launches, ordinary numbers.
    let runs =
        time_graph(dev, repeats, || dev.add_rms_norm(x, branch, w, normed, m, h, 1.0, 1e-6))?;
    Ok(report(&case, runs))
}

/// A MoE layer's expert work for `m` tokens routed uniformly, whole and kernel by kernel; the
/// bytes of the whole are the experts touched and the tokens' rows in and out, those of a part
/// what that kernel must read and write.
fn expert_case(dev: &CudaDevice, c: &ModelConfig, m: usize, repeats: usize) -> Result<Vec<Value>> {
    let Some(moe) = &c.moe else { return Ok(Vec::new()) };
    let (h, inter) = (c.hidden_size, moe.expert_intermediate);
    let ids = route(m, moe.num_experts, moe.top_k);
    let mut seen = vec![false; moe.num_experts];
    ids.iter().for_each(|&e| seen[e as usize] = true);
    let touched = seen.iter().filter(|&&s| s).count();
    let up_matrices = if moe.activation == FfnActivation::SwiGlu { 2 } else { 1 };
    let pairs = ids.len();
    // Bytes and flops of each part: the expert matrices it reads (bf16), its f32 rows.
    let up = (touched * up_matrices * inter * h * 2 + 4 * (m * h + pairs * inter), up_matrices);
    let down = (touched * inter * h * 2 + 4 * (pairs * inter + pairs * h), 1);
    let mut records = Vec::new();
    // The CPU's arithmetic takes the row kernels in a step of at most a pair per expert.
    let rows = launch::moe_takes_row_kernels(pairs, moe.num_experts);
    let f32_kernels = if rows { "_row" } else { "" };
    for (suffix, kernels, mma) in [("", f32_kernels, false), ("_mma", " (mma)", true)] {
        let t = time_moe(dev, moe, h, (&ids, mma), repeats)?;
        let case = |name: &str, kernel: String, (bytes, matrices): (usize, usize)| Case {
            scenario: format!("{name}{suffix}_m{m}"),
            kernel,
            bytes: bytes as f64,
            flops: (2 * pairs * matrices * inter * h) as f64,
        };
        let whole = (touched * (up_matrices + 1) * inter * h * 2 + 8 * m * h, up_matrices + 1);
        let all = case("moe_experts", format!("moe sort, up, down{kernels}, combine"), whole);
        records.push(report(&all, t.all));
        records.push(report(&case("moe_up", format!("moe_expert_up{kernels}"), up), t.up));
        records.push(report(&case("moe_down", format!("moe_expert_down{kernels}"), down), t.down));
        if let Some((sort_us, combine_us)) = t.sort_combine {
            let sort = case("moe_sort", "moe_sort_pairs".into(), (4 * pairs * 3, 0));
            records.push(report(&sort, sort_us));
            let combine = (4 * (pairs * h + m * h), 0);
            records.push(report(&case("moe_combine", "moe_combine".into(), combine), combine_us));
        }
    }
    Ok(records)
}

/// Decode attention of `m` sequences over each context length the model allows.
fn attention_cases(
    dev: &CudaDevice,
    c: &ModelConfig,
    m: usize,
    repeats: usize,
) -> Result<Vec<Value>> {
    let Some(a) = &c.attention else { return Ok(Vec::new()) };
    let mut records = Vec::new();
    for ctx in CONTEXTS.into_iter().filter(|&n| n <= c.max_position_embeddings) {
        let kv = (m * ctx * a.num_kv_heads * a.head_dim * 2 * 2) as f64;
        let qo = (m * a.num_heads * a.head_dim * 4 * 2) as f64;
        // Every partition of a row in one CTA, and each in its own CTA with the fold after (the
        // same bits; the engine splits decode steps of up to SPLIT_MAX_SEQS sequences).
        for (split, name, kernel) in [
            (false, "attn_decode", "paged_attention_bf16kv"),
            (true, "attn_split_decode", "paged_attention_bf16kv, attention_combine_f32"),
        ] {
            let case = Case {
                scenario: format!("{name}_b{m}_ctx{ctx}"),
                kernel: kernel.into(),
                bytes: kv + qo,
                flops: (4 * m * ctx * a.num_heads * a.head_dim) as f64,
            };
            records.push(report(&case, time_attention(dev, a, (m, ctx), split, repeats)?));
        }
    }
    Ok(records)
}

/// Choosing tokens from `m` rows of logits: greedy, the normaliser, seeded samples (plain
/// temperature; and with top-k 50 and top-p 0.9, more cuts of the same search), and the rank and
/// 20 alternatives of logprobs. Bytes: the rows, read once (each kernel reads them more often).
fn sampling_cases(
    dev: &CudaDevice,
    c: &ModelConfig,
    m: usize,
    repeats: usize,
) -> Result<Vec<Value>> {
    let vocab = c.vocab_size;
    let mut layout = ArenaLayout::new("bench");
    let (logits, params) = (layout.push::<f32>(m * vocab), layout.push::<SampleParams>(2 * m));
    let (ids, log_z, lps) = (layout.push::<u32>(m), layout.push::<f32>(m), layout.push::<f32>(m));
    let n = TOP_LOGPROBS.min(vocab);
    let (top_ids, top_lps, ranks) =
        (layout.push::<u32>(m * n), layout.push::<f32>(m * n), layout.push::<u32>(m));
    let mut arena = DeviceArena::new(dev, &layout)?;
    // Logits spread over 16 nats, roughly as a trained model's rows are.
    upload(&mut arena, logits, &fill(m * vocab, 9, |v| 16.0 * v))?;
    let param = |r: usize, cut: bool| SampleParams {
        seed: r as u64,
        index: 0,
        temperature: if cut { 0.7 } else { 1.0 },
        top_p: if cut { 0.9 } else { 1.0 },
        top_k: if cut { 50 } else { 0 },
        min_p: 0.0,
    };
    let all: Vec<_> =
        (0..m).map(|r| param(r, false)).chain((0..m).map(|r| param(r, true))).collect();
    upload(&mut arena, params, &all)?;
    let (logits, ids, log_z) = (arena.get(logits)?, arena.get(ids)?, arena.get(log_z)?);
    let lps = arena.get(lps)?;
    let top = (arena.get(top_ids)?, arena.get(top_lps)?, n);
    let ranks = arena.get(ranks)?;
    let (plain, cut) = (arena.get(params)?.sub(0, m), arena.get(params)?.sub(m, m));
    let (plain, cut) = (plain.context("sized")?, cut.context("sized")?);
    let bytes = (4 * m * vocab) as f64;
    let case = |name: &str, kernel: &str| Case {
        scenario: format!("{name}_b{m}"),
        kernel: kernel.into(),
        bytes,
        flops: 0.0,
    };
    Ok(vec![
        report(
            &case("argmax", "argmax_f32"),
            time_graph(dev, repeats, || dev.argmax(logits, ids, m, vocab))?,
        ),
        report(
            &case("log_softmax", "log_softmax_f32"),
            time_graph(dev, repeats, || dev.log_softmax(logits, None, log_z, m, vocab))?,
        ),
        // A greedy row's token and logprob.
        report(
            &case("greedy", "log_softmax_f32"),
            time_graph(dev, repeats, || {
                dev.log_softmax_argmax(logits, log_z, (ids, lps), m, vocab)
            })?,
        ),
        // Seeded rows as a step without logit edits draws them: with their logprobs.
        report(
            &case("sample", "sample_f32"),
            time_graph(dev, repeats, || {
                dev.sample(logits, plain, ids, Some((log_z, lps)), m, vocab)
            })?,
        ),
        report(
            &case("sample_top_p", "sample_f32"),
            time_graph(dev, repeats, || {
                dev.sample(logits, cut, ids, Some((log_z, lps)), m, vocab)
            })?,
        ),
        // The sampled tokens' ranks, and the alternatives.
        report(
            &case("top_logprobs", "top_logprobs_f32"),
            time_graph(dev, repeats, || {
                dev.top_logprobs(logits, ids, log_z, top, ranks, m, vocab)
            })?,
        ),
    ])
}

/// Alternatives of logprobs in the `top_logprobs` case: the most a request may ask for.
const TOP_LOGPROBS: usize = routed_types::MAX_LOGPROBS as usize;

/// `top_k` distinct experts for each of `num_tokens` tokens, spread uniformly (a balanced
/// router), deterministic.
fn route(num_tokens: usize, num_experts: usize, top_k: usize) -> Vec<i32> {
    let mut draws = crate::bench::xorshift(7);
    let mut ids = Vec::with_capacity(num_tokens * top_k);
    for _ in 0..num_tokens {
        let first = ids.len();
        while ids.len() < first + top_k.min(num_experts) {
            let e = (draws.next().expect("endless") % num_experts as u64) as i32;
            if !ids[first..].contains(&e) {
                ids.push(e);
            }
        }
    }
    ids
}

/// The model's products as `(name, outputs, inputs)`: the attention's fused query, key and value
/// projection (the product the model runs), its query and key (or value: the same shape, the
/// thinnest product of a layer) projections alone, its output projection, a routed expert's up
/// projection, the dense or shared MLP's, and the LM head.
fn products(c: &ModelConfig) -> Vec<(&'static str, usize, usize)> {
    let h = c.hidden_size;
    let mut out = Vec::new();
    if let Some(a) = &c.attention {
        out.push(("qkv_proj", (a.num_heads + 2 * a.num_kv_heads) * a.head_dim, h));
        out.push(("q_proj", a.num_heads * a.head_dim, h));
        out.push(("kv_proj", a.num_kv_heads * a.head_dim, h));
        out.push(("o_proj", h, a.num_heads * a.head_dim));
    }
    if let Some(m) = &c.moe {
        out.push(("expert_up", m.expert_intermediate, h));
        if let Some(s) = m.shared_intermediate {
            out.push(("shared_up", s, h));
        }
    }
    out.push(("lm_head", c.vocab_size, h));
    out
}

/// Prints the case's row and makes its record: the median of `runs` (microseconds per launch).
fn report(case: &Case, mut runs: Vec<f64>) -> Value {
    let mut sorted = runs.clone();
    sorted.sort_by(f64::total_cmp);
    let us = sorted[sorted.len() / 2];
    runs.iter_mut().for_each(|r| *r = (*r * 1e3).round() / 1e3);
    let (gb_s, tflops) = (case.bytes / us / 1e3, case.flops / us / 1e6);
    println!("| {} | {} | {us:.2} | {gb_s:.1} | {tflops:.3} |", case.scenario, case.kernel);
    json!({
        "scenario": case.scenario,
        "kernel": case.kernel,
        "us": us,
        "gb_per_s": gb_s,
        "tflops": tflops,
        "bytes": case.bytes,
        "flops": case.flops,
        "runs_us": runs,
    })
}

/// A deterministic fill in [-0.5, 0.5): the values do not matter to the time, only that they are
/// ordinary numbers (no NaN, no denormals).
fn fill<T: DeviceElem>(len: usize, seed: u64, f: impl Fn(f32) -> T) -> Vec<T> {
    let unit = |x: u64| (x >> 40) as f32 / (1u64 << 24) as f32 - 0.5;
    crate::bench::xorshift(seed).take(len).map(|x| f(unit(x))).collect()
}

fn upload<T: DeviceElem>(arena: &mut DeviceArena, span: Span<T>, data: &[T]) -> Result<()> {
    arena.upload(span, data).context("uploading a benchmark input")
}

/// Microseconds per launch of `LAUNCHES` launches captured into a graph, one figure per replay.
fn time_graph(
    dev: &CudaDevice,
    repeats: usize,
    launch: impl Fn() -> Result<(), routed_backend::BackendError>,
) -> Result<Vec<f64>> {
    let graph = dev.capture(|| (0..LAUNCHES).try_for_each(|_| launch()))?;
    // One untimed replay: the kernels are loaded and the caches warm.
    dev.replay(&graph)?;
    dev.synchronize()?;
    (0..repeats)
        .map(|_| {
            let start = Instant::now();
            dev.replay(&graph)?;
            dev.synchronize()?;
            Ok(start.elapsed().as_secs_f64() * 1e6 / LAUNCHES as f64)
        })
        .collect()
}

/// The product of `m` rows by the weight `[n, k]`, on tensor cores with `mma`.
fn time_gemm(
    dev: &CudaDevice,
    (m, n, k): (usize, usize, usize),
    (mma, tiling): (bool, GemmTiling),
    repeats: usize,
) -> Result<Vec<f64>> {
    let mut layout = ArenaLayout::new("bench");
    let (x, w, out) = (layout.push::<f32>(m * k), layout.push::<bf16>(n * k), layout.push(m * n));
    let mut arena = DeviceArena::new(dev, &layout)?;
    upload(&mut arena, x, &fill(m * k, 1, |v| v))?;
    upload(&mut arena, w, &fill(n * k, 2, bf16::from_f32))?;
    let (x, w, out) = (arena.get(x)?, arena.get(w)?, arena.get(out)?);
    let w = if mma { Weights::Bf16Mma(w) } else { Weights::Bf16(w) };
    time_graph(dev, repeats, || dev.gemm_tiled(x, w, out, (m, n, k), tiling))
}

/// One MoE layer's expert work for the routing `ids` (the router left out): the sort, the grouped
/// up and down products of every expert (on tensor cores with `mma`), and the combine, together
/// and each alone.
fn time_moe(
    dev: &CudaDevice,
    moe: &routed_model::MoeConfig,
    h: usize,
    (ids, mma): (&[i32], bool),
    repeats: usize,
) -> Result<MoeTimes> {
    let (e, k, inter) = (moe.num_experts, moe.top_k, moe.expert_intermediate);
    let (pairs, tokens) = (ids.len(), ids.len() / k);
    // The sorted layout: a row per pair.
    let rows = pairs;
    let gated = moe.activation == FfnActivation::SwiGlu;
    let mut layout = ArenaLayout::new("bench");
    let (x, out) = (layout.push::<f32>(tokens * h), layout.push::<f32>(tokens * h));
    let (up, down) = (layout.push::<bf16>(e * inter * h), layout.push::<bf16>(e * inter * h));
    let gate = layout.push::<bf16>(if gated { e * inter * h } else { 0 });
    let (id_span, weights) = (layout.push::<i32>(pairs), layout.push::<f32>(pairs));
    let (sorted, pair_rows) = (layout.push::<i32>(rows), layout.push::<i32>(pairs));
    let starts = layout.push::<i32>(e + 1);
    let (act, expert_out) = (layout.push::<f32>(rows * inter), layout.push::<f32>(rows * h));
    let mut arena = DeviceArena::new(dev, &layout)?;
    upload(&mut arena, x, &fill(tokens * h, 6, |v| v))?;
    for (i, span) in [up, down, gate].into_iter().enumerate() {
        upload(&mut arena, span, &fill(span.len(), 7 + i as u64, bf16::from_f32))?;
    }
    upload(&mut arena, id_span, ids)?;
    upload(&mut arena, weights, &vec![1.0 / k as f32; pairs])?;
    let sort = MoeSortBuffers {
        sorted_pairs: arena.get(sorted)?,
        pair_rows: arena.get(pair_rows)?,
        expert_starts: arena.get(starts)?,
    };
    let (x, out, act, expert_out) =
        (arena.get(x)?, arena.get(out)?, arena.get(act)?, arena.get(expert_out)?);
    let (ids, weights) = (arena.get(id_span)?, arena.get(weights)?);
    let bf16 = if mma { Weights::Bf16Mma } else { Weights::Bf16 };
    let (up, down) = (bf16(arena.get(up)?), bf16(arena.get(down)?));
    let gate = gated.then(|| arena.get(gate).map(bf16)).transpose()?;
    let activation = if gated { ExpertActivation::SwiGlu } else { ExpertActivation::Relu2 };
    let shard = ExpertShard::all(e);
    let sort_ids = || dev.moe_sort(ids, &sort, pairs, e);
    let up =
        || dev.moe_expert_up(x, up, gate, &sort, act, activation, (tokens, k), shard, (h, inter));
    let down = || dev.moe_expert_down(act, down, &sort, expert_out, (pairs, shard), (h, inter));
    let combine =
        || dev.moe_combine(expert_out, sort.pair_rows, weights, None, out, (tokens, k), h);
    let all = time_graph(dev, repeats, || {
        sort_ids()?;
        up()?;
        down()?;
        combine()
    })?;
    // The whole graph ran, so each part alone finds the sorted rows and activations it reads.
    Ok(MoeTimes {
        all,
        up: time_graph(dev, repeats, up)?,
        down: time_graph(dev, repeats, down)?,
        // The sort and the combine are the same kernels in either precision: timed once.
        sort_combine: match mma {
            false => {
                Some((time_graph(dev, repeats, sort_ids)?, time_graph(dev, repeats, combine)?))
            }
            true => None,
        },
    })
}

/// A MoE layer's expert work timed whole and kernel by kernel (microseconds per launch, each
/// graph replay's figure); the sort and the combine with the `f32` products only.
struct MoeTimes {
    all: Vec<f64>,
    up: Vec<f64>,
    down: Vec<f64>,
    sort_combine: Option<(Vec<f64>, Vec<f64>)>,
}

/// Decode attention: `num_seqs` sequences of `ctx` tokens each, one query each, over a paged
/// cache of contiguous blocks; with `split`, a CTA per partition and the fold after.
fn time_attention(
    dev: &CudaDevice,
    a: &routed_model::AttentionConfig,
    (num_seqs, ctx): (usize, usize),
    split: bool,
    repeats: usize,
) -> Result<Vec<f64>> {
    let blocks_per_seq = ctx.div_ceil(BLOCK_SIZE);
    let width = a.num_kv_heads * a.head_dim;
    let slots = num_seqs * blocks_per_seq * BLOCK_SIZE;
    let q_len = num_seqs * a.num_heads * a.head_dim;
    let items = attention_items(&vec![1; num_seqs], a.num_heads / a.num_kv_heads);
    let mut layout = ArenaLayout::new("bench");
    let (q, out) = (layout.push::<f32>(q_len), layout.push::<f32>(q_len));
    let (k_cache, v_cache) = (layout.push::<bf16>(slots * width), layout.push(slots * width));
    let tables = layout.push::<i32>(num_seqs * blocks_per_seq);
    let (positions, starts) = (layout.push::<i32>(num_seqs), layout.push::<i32>(num_seqs + 1));
    let item_span = layout.push::<i32>(2 * items.len());
    let num_parts = attention_parts(ctx, ATTN_PARTITION_TILES);
    let partials_len = AttentionSplit::partials_len(num_seqs, a.num_heads, a.head_dim, num_parts);
    let partials = layout.push::<f32>(partials_len);
    let mut arena = DeviceArena::new(dev, &layout)?;
    upload(&mut arena, q, &fill(q_len, 3, |v| v))?;
    upload(&mut arena, k_cache, &fill(slots * width, 4, bf16::from_f32))?;
    upload(&mut arena, v_cache, &fill(slots * width, 5, bf16::from_f32))?;
    let table: Vec<i32> = (0..(num_seqs * blocks_per_seq) as i32).collect();
    upload(&mut arena, tables, &table)?;
    upload(&mut arena, positions, &vec![ctx as i32 - 1; num_seqs])?;
    upload(&mut arena, starts, &(0..=num_seqs as i32).collect::<Vec<_>>())?;
    upload(&mut arena, item_span, &items.concat())?;
    let params = AttentionParams {
        num_heads: a.num_heads,
        num_kv_heads: a.num_kv_heads,
        head_dim: a.head_dim,
        block_size: BLOCK_SIZE,
        max_blocks_per_seq: blocks_per_seq,
        sliding_window: None,
        scale: a.scale,
        partition_tiles: ATTN_PARTITION_TILES,
    };
    let buffers = AttentionBuffers {
        q: arena.get(q)?,
        k_cache: arena.get(k_cache)?,
        v_cache: arena.get(v_cache)?,
        block_tables: arena.get(tables)?,
        positions: arena.get(positions)?,
        seq_starts: arena.get(starts)?,
        items: arena.get(item_span)?,
        out: arena.get(out)?,
    };
    let num_items = items.len();
    let split = split.then_some(AttentionSplit { partials: arena.get(partials)?, num_parts });
    time_graph(dev, repeats, || {
        dev.paged_attention(&params, &buffers, (num_seqs, num_seqs, num_items), split)
    })
}
