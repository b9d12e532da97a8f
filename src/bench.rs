//! `routed bench`: the engine's benchmark scenarios. Each prints a table and, with `--json`,
//! writes its records (schema in `benches/README.md`, shared with the baseline scripts).

use crate::cli::EngineArgs;
use anyhow::{Context, Result};
use futures_util::{StreamExt, future::join_all};
use routed::{
    EngineHandle, GenerateRequest, RequestEvent, runtime::EngineStats, runtime::MatmulPrecision,
    types::SamplingParams, types::TokenId,
};
use serde_json::{Value, json};
use std::time::{Duration, Instant};

/// Which measurement to run.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scenario {
    /// (a) Offline throughput at several batch sizes.
    Throughput,
    /// (b) Routing capture on vs off, interleaved pairs.
    RoutingOverhead,
    /// (c) Time to first token with 0, 50, 90 and 99 % of the prompt cached, relative to cold.
    PrefixHit,
    /// (d) Where a step's time goes at batch 1 and 64: the engine around the worker, the host
    /// inside it, and (on a GPU) the device.
    EngineOverhead,
    /// (e) HTTP serving: concurrent clients on loopback, requests/s and latency percentiles.
    Http,
    /// Batch-1 decode against the memory-bandwidth roofline.
    Roofline,
    /// Decode through CUDA graphs vs eager steps at batch 1 and 8, interleaved pairs (CUDA only).
    CudaGraphs,
    /// The device's matrix product and attention alone at the model's shapes, with bytes moved
    /// and flops (CUDA only; not part of `all`).
    Kernels,
    /// Every scenario in turn.
    All,
}

/// `routed bench` flags.
#[derive(clap::Args)]
pub struct BenchArgs {
    #[command(flatten)]
    engine: EngineArgs,
    /// The scenario.
    #[arg(value_enum)]
    scenario: Scenario,
    /// Batch sizes for the throughput scenario.
    #[arg(long, value_delimiter = ',', default_values_t = [1, 8, 32, 64])]
    batch_sizes: Vec<usize>,
    /// Prompt tokens per request.
    #[arg(long, default_value_t = 128)]
    prompt_len: usize,
    /// Generated tokens per request.
    #[arg(long, default_value_t = 32)]
    output_len: u32,
    /// Sampling temperature of the requests: 0 (the default) is greedy; above 0 each request
    /// draws with a seed of its own, as RL rollouts sample.
    #[arg(long, default_value_t = 0.0)]
    temperature: f32,
    /// On/off pairs for the routing-overhead scenario; repetitions elsewhere.
    #[arg(long, default_value_t = 10)]
    repeats: usize,
    /// Write the records as a JSON list to this file.
    #[arg(long)]
    json: Option<std::path::PathBuf>,
}

/// Runs the chosen scenarios.
pub async fn run(args: BenchArgs) -> Result<()> {
    let mut engine_args = args.engine.clone();
    engine_args.heartbeat_ms = 0;
    let on_cpu = engine_args.config()?.device == routed_backend::DeviceSpec::Cpu;
    let cuda_only = matches!(args.scenario, Scenario::CudaGraphs | Scenario::Kernels);
    anyhow::ensure!(
        !(on_cpu && cuda_only),
        "the {} scenario needs a CUDA device (--device cuda:N or cuda-sim)",
        clap::ValueEnum::to_possible_value(&args.scenario)
            .map_or_else(String::new, |v| v.get_name().to_owned())
    );
    if args.scenario == Scenario::Kernels {
        let config = engine_args.config()?;
        let (dir, device) = (config.model.dir(), config.device);
        let mut records = crate::bench_kernels::run(device, dir, &args.batch_sizes, args.repeats)?;
        for r in &mut records {
            r["engine"] = json!("routed");
            r["dtype"] = json!("bf16");
            r["device"] = json!(device.to_string());
            r["model"] = json!(config.served_model_name);
        }
        return write_records(&args, &records);
    }
    let engine = engine_args.start()?;
    let model = engine.model_info().served_model_name.clone();
    let num_ranks = engine.model_info().expert_parallel_size;
    let device = engine.model_info().device.clone();
    let all = args.scenario == Scenario::All;
    let mut records = Vec::new();
    if all || args.scenario == Scenario::Throughput {
        records.extend(throughput(&engine, &args).await?);
    }
    if all || args.scenario == Scenario::RoutingOverhead {
        let mut off_args = engine_args.clone();
        off_args.disable_return_routed_experts = true;
        let off = off_args.start()?;
        records.extend(routing_overhead(&engine, &off, &args).await?);
        off.shutdown().await;
    }
    if all || args.scenario == Scenario::PrefixHit {
        records.extend(prefix_hit(&engine, &args).await?);
    }
    if all || args.scenario == Scenario::EngineOverhead {
        records.extend(engine_overhead(&engine, &args).await?);
    }
    if all || args.scenario == Scenario::Roofline {
        records.extend(roofline(&engine, &args).await?);
    }
    if all || args.scenario == Scenario::Http {
        records.extend(http(&engine, &args).await?);
    }
    // Graphs exist on a CUDA device only: `all` leaves them out on the CPU.
    if (all && !on_cpu) || args.scenario == Scenario::CudaGraphs {
        let mut config = engine_args.config()?;
        config.cuda_graphs = false;
        let eager = crate::cli::start(config)?;
        records.extend(cuda_graphs(&engine, &eager, &args).await?);
        eager.shutdown().await;
    }
    engine.shutdown().await;
    // The arithmetic of the products, as the baselines' records name theirs: on the CPU the
    // precision; on a CUDA device bf16 weights accumulated in f32 (as transformers' bf16 products
    // are), the inputs exact ("bf16") or rounded to bf16 for tensor cores ("bf16-tc").
    let dtype = match (on_cpu, engine_args.config()?.matmul_precision) {
        (true, precision) => precision.as_str(),
        (false, MatmulPrecision::F32) => "bf16",
        (false, MatmulPrecision::Bf16) => "bf16-tc",
    };
    for r in &mut records {
        r["engine"] = json!("routed");
        r["dtype"] = json!(dtype);
        r["device"] = json!(device);
        r["model"] = json!(model);
        r["expert_parallel_size"] = json!(num_ranks);
        r["temperature"] = json!(args.temperature);
    }
    write_records(&args, &records)
}

/// Writes the records to `--json`, when given.
fn write_records(args: &BenchArgs, records: &[Value]) -> Result<()> {
    if let Some(path) = &args.json {
        std::fs::write(path, serde_json::to_string_pretty(records)?)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(())
}

/// Ids below this are ordinary (non-special) tokens of the benchmark checkpoints' Qwen3 tokenizer.
const ORDINARY_TOKENS: usize = 151_643;

/// A deterministic pseudo-random prompt: xorshift64 (13, 7, 17) from `seed * 0x9E37_79B9_7F4A_7C15 | 1`,
/// each id the state modulo the ordinary vocabulary; the same ids `benches/benchlib.py` gives the
/// baseline engines (seeds 1..=B for the decode prompts).
fn prompt(seed: u64, len: usize, vocab: usize) -> Vec<TokenId> {
    let vocab = vocab.min(ORDINARY_TOKENS) as u64;
    xorshift(seed).take(len).map(|x| (x % vocab) as TokenId).collect()
}

/// The states of xorshift64 (13, 7, 17) from `seed * 0x9E37_79B9_7F4A_7C15 | 1`, first step
/// included.
pub(crate) fn xorshift(seed: u64) -> impl Iterator<Item = u64> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    std::iter::repeat_with(move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    })
}

fn request(
    engine: &EngineHandle,
    tokens: Vec<TokenId>,
    output_len: u32,
    temperature: f32,
) -> GenerateRequest {
    // A seed of the request's own: its prompt's first token and length.
    let seed = tokens.first().map_or(0, |&t| u64::from(t) << 32 | tokens.len() as u64);
    let params = SamplingParams {
        ignore_eos: true,
        temperature,
        seed,
        ..SamplingParams::greedy(output_len)
    };
    let return_routing = engine.model_info().routing_capture;
    GenerateRequest { return_routing, ..GenerateRequest::new(tokens, params) }
}

/// Runs a request to the end; returns the time to its first token and to its end.
async fn timed(engine: &EngineHandle, req: GenerateRequest) -> Result<(Duration, Duration)> {
    let started = Instant::now();
    let mut events = engine.submit(req).await?;
    let mut first = None;
    while let Some(event) = events.next().await {
        match event {
            RequestEvent::Token(_) => {
                first.get_or_insert_with(|| started.elapsed());
            }
            RequestEvent::Finished(_) => {}
            RequestEvent::Error(e) => anyhow::bail!("benchmark request failed: {e}"),
        }
    }
    Ok((first.unwrap_or_default(), started.elapsed()))
}

/// Times of one batch run: until every request had its first token, and until the last ended.
struct BatchTimes {
    first_tokens: Duration,
    wall: Duration,
}

async fn batch(engine: &EngineHandle, seed: u64, n: usize, args: &BenchArgs) -> Result<BatchTimes> {
    let vocab = engine.model_info().vocab_size;
    let reqs = (0..n).map(|i| {
        let tokens = prompt(seed * 1000 + i as u64 + 1, args.prompt_len, vocab);
        request(engine, tokens, args.output_len, args.temperature)
    });
    let started = Instant::now();
    let mut first_tokens = Duration::ZERO;
    for r in join_all(reqs.map(|r| timed(engine, r))).await {
        first_tokens = first_tokens.max(r?.0);
    }
    Ok(BatchTimes { first_tokens, wall: started.elapsed() })
}

fn median(xs: &mut [f64]) -> f64 {
    xs.sort_by(f64::total_cmp);
    xs[xs.len() / 2]
}

async fn throughput(engine: &EngineHandle, args: &BenchArgs) -> Result<Vec<Value>> {
    println!(
        "(a) offline throughput, prompt {} + output {} tokens, median of {} runs",
        args.prompt_len,
        args.output_len,
        args.repeats.max(1)
    );
    println!(
        "{:>6} {:>10} {:>14} {:>14} {:>14}",
        "batch", "wall s", "output tok/s", "total tok/s", "decode tok/s"
    );
    let mut records = Vec::new();
    for &b in &args.batch_sizes {
        let (mut walls, mut decodes) = (Vec::new(), Vec::new());
        let before = engine.stats().await?;
        for _ in 0..args.repeats.max(1) {
            // Seeds 1..=b, as the baselines use; the cache reset keeps earlier runs from hitting.
            engine.reset_prefix_cache().await?;
            let t = batch(engine, 0, b, args).await?;
            walls.push(t.wall.as_secs_f64());
            // Decode alone, as the baselines time it: the steps after every request's first token.
            let steps = args.output_len.saturating_sub(1) as f64;
            decodes.push(b as f64 * steps / (t.wall - t.first_tokens).as_secs_f64().max(1e-9));
        }
        let after = engine.stats().await?;
        // Where expert parallelism's time goes, as shares of the steps' wall time (summed over
        // ranks, so with N ranks the shares of one rank are these over N).
        let steps = (after.step_seconds - before.step_seconds).max(1e-9);
        let wait = (after.collective_wait_seconds - before.collective_wait_seconds) / steps;
        let exchange =
            (after.collective_exchange_seconds - before.collective_exchange_seconds) / steps;
        let wall = median(&mut walls);
        let decode = median(&mut decodes);
        let out = (b * args.output_len as usize) as f64 / wall;
        let total = (b * (args.prompt_len + args.output_len as usize)) as f64 / wall;
        println!("{b:>6} {wall:>10.3} {out:>14.1} {total:>14.1} {decode:>14.1}");
        records.push(json!({"scenario": format!("throughput_b{b}"), "tokens_per_s": out, "total_tokens_per_s": total, "wall_s": wall, "batch": b, "prompt_len": args.prompt_len, "output_len": args.output_len}));
        records.push(json!({"scenario": format!("tg_b{b}"), "tokens_per_s": decode, "runs": decodes, "batch": b, "prompt_tokens": args.prompt_len, "new_tokens": args.output_len.saturating_sub(1), "collective_wait_share": wait, "collective_exchange_share": exchange}));
    }
    Ok(records)
}

async fn routing_overhead(
    on: &EngineHandle,
    off: &EngineHandle,
    args: &BenchArgs,
) -> Result<Vec<Value>> {
    println!("(b) routing capture on vs off: {} interleaved pairs of batch 8", args.repeats);
    let before = on.stats().await?;
    let mut ratios = paired_ratios(on, off, 100, 8, args, |t| t.wall.as_secs_f64()).await?;
    let after = on.stats().await?;
    let delta = |f: fn(&EngineStats) -> f64| f(&after) - f(&before);
    let steps = delta(|s| s.step_seconds).max(1e-12);
    // On the step's path: the runner's hand-off after the forward and any wait for a free slot.
    // Off it, on their own threads while the next step runs: the copy worker (waiting for the
    // copy to land, then reading it) and the store.
    let path = delta(|s| s.routing_capture_seconds) + delta(|s| s.routing_slot_wait_seconds);
    let off_path = delta(|s| s.routing_copy_seconds) + delta(|s| s.routing_store_seconds);
    let (path_share, share) = (path / steps, (path + off_path) / steps);
    let (lo, med, hi) = spread(&mut ratios);
    println!("median time ratio on/off {med:.4} (min {lo:.4}, max {hi:.4})");
    println!(
        "measured directly: {:.3} % of step time on the step's path (capture, slot waits), {:.3} % \
         with the copy worker's and the store's time on their own threads",
        path_share * 100.0,
        share * 100.0
    );
    Ok(vec![json!({
        "scenario": "routing_overhead", "median_ratio": med, "min_ratio": lo, "max_ratio": hi,
        "path_share_of_step": path_share, "pipeline_share_of_step": share, "pairs": args.repeats,
    })])
}

/// Decode time with eager steps over decode time with graphs, in interleaved pairs at batch 1
/// and 8 (the first token, which no graph serves, is left out of both).
async fn cuda_graphs(
    graphs: &EngineHandle,
    eager: &EngineHandle,
    args: &BenchArgs,
) -> Result<Vec<Value>> {
    println!("CUDA graphs vs eager decode steps: {} interleaved pairs", args.repeats);
    let mut records = Vec::new();
    for b in [1, 8] {
        let decode = |t: &BatchTimes| (t.wall - t.first_tokens).as_secs_f64();
        let mut speedups = paired_ratios(eager, graphs, 300, b, args, decode).await?;
        let (lo, med, hi) = spread(&mut speedups);
        println!("batch {b}: decode {med:.3}x faster with graphs (min {lo:.3}, max {hi:.3})");
        records.push(json!({"scenario": format!("cuda_graphs_b{b}"), "batch": b,
            "median_speedup": med, "min_speedup": lo, "max_speedup": hi, "pairs": args.repeats}));
    }
    Ok(records)
}

/// `metric(a) / metric(b)` over `repeats` pairs of the same batch of `n` requests run on engines
/// `a` and `b`, alternating which goes first so that drift in the machine's load cancels out.
async fn paired_ratios(
    a: &EngineHandle,
    b: &EngineHandle,
    first_seed: u64,
    n: usize,
    args: &BenchArgs,
    metric: impl Fn(&BatchTimes) -> f64,
) -> Result<Vec<f64>> {
    let mut ratios = Vec::new();
    for pair in 0..args.repeats.max(1) {
        let seed = first_seed + pair as u64;
        let (ta, tb) = if pair % 2 == 0 {
            let ta = batch(a, seed, n, args).await?;
            (ta, batch(b, seed, n, args).await?)
        } else {
            let tb = batch(b, seed, n, args).await?;
            (batch(a, seed, n, args).await?, tb)
        };
        ratios.push(metric(&ta) / metric(&tb).max(1e-12));
    }
    Ok(ratios)
}

/// (min, median, max).
fn spread(xs: &mut [f64]) -> (f64, f64, f64) {
    let lo = xs.iter().copied().fold(f64::INFINITY, f64::min);
    let hi = xs.iter().copied().fold(0.0, f64::max);
    (lo, median(xs), hi)
}

async fn prefix_hit(engine: &EngineHandle, args: &BenchArgs) -> Result<Vec<Value>> {
    println!("(c) time to first token with part of a {}-token prompt cached", args.prompt_len);
    println!("{:>8} {:>8} {:>12} {:>10}", "target", "cached", "TTFT ms", "vs cold");
    let info = engine.model_info();
    let (vocab, block) = (info.vocab_size, info.block_size);
    let mut records = Vec::new();
    let mut cold = 0.0;
    for (i, fraction) in [0.0, 0.5, 0.9, 0.99].into_iter().enumerate() {
        // The cache holds whole blocks: the cached prefix is the block boundary nearest the
        // target share (never the whole prompt, which must compute at least one token).
        let blocks = (args.prompt_len as f64 * fraction / block as f64).round() as usize;
        let cached = (blocks * block).min((args.prompt_len - 1) / block * block);
        let mut ttfts = Vec::new();
        for rep in 0..args.repeats.max(1) {
            let full = prompt(7000 + (i * 100 + rep) as u64, args.prompt_len, vocab);
            engine.reset_prefix_cache().await?;
            if cached > 0 {
                timed(engine, request(engine, full[..cached].to_vec(), 1, args.temperature))
                    .await?;
            }
            ttfts.push(
                timed(engine, request(engine, full, 1, args.temperature)).await?.0.as_secs_f64(),
            );
        }
        let ttft = median(&mut ttfts);
        if i == 0 {
            cold = ttft;
        }
        let share = cached as f64 / args.prompt_len as f64;
        println!(
            "{:>7.0}% {:>7.1}% {:>12.2} {:>10.3}",
            fraction * 100.0,
            share * 100.0,
            ttft * 1e3,
            ttft / cold
        );
        records.push(json!({"scenario": format!("prefix_hit_{}", (fraction * 100.0) as u32), "cached_tokens": cached, "cached_share": share, "ttft_s": ttft, "ratio_to_cold": ttft / cold}));
        if i == 0 {
            // The cold run is a plain prefill: the baselines' pp scenario.
            let rates: Vec<f64> = ttfts.iter().map(|t| args.prompt_len as f64 / t).collect();
            records.push(json!({"scenario": format!("pp{}", args.prompt_len), "tokens_per_s": args.prompt_len as f64 / ttft, "runs": rates, "batch": 1, "prompt_tokens": args.prompt_len}));
        }
    }
    Ok(records)
}

async fn engine_overhead(engine: &EngineHandle, args: &BenchArgs) -> Result<Vec<Value>> {
    let mut records = Vec::new();
    for (seed, size) in [(900, 1), (901, 64)] {
        let before = engine.stats().await?;
        batch(engine, seed, size, args).await?;
        let after = engine.stats().await?;
        records.push(step_split(size, &before, &after));
    }
    Ok(records)
}

/// One batch's step time split into the engine around the worker (scheduling, the cache
/// manager, actor hops, routing hand-off), the worker's host time, and the time between the
/// device's events around the step's work (kernels and launch gaps; 0 without a device clock,
/// and then the worker's whole time counts as the host's).
fn step_split(size: usize, before: &EngineStats, after: &EngineStats) -> Value {
    let steps = (after.num_steps - before.num_steps).max(1) as f64;
    let step = after.step_seconds - before.step_seconds;
    let forward = after.forward_seconds - before.forward_seconds;
    let device = after.device_seconds - before.device_seconds;
    let ms = |s: f64| s / steps * 1e3;
    let share = (step - forward) / step.max(1e-12);
    println!(
        "(d) batch {size}: {steps} steps, {:.3} ms per step: {:.3} ms in the engine around the \
         worker ({:.2} %), {:.3} ms on the worker's host side, {:.3} ms between the device's events",
        ms(step),
        ms(step - forward),
        share * 100.0,
        ms(forward - device),
        ms(device)
    );
    json!({"scenario": format!("engine_overhead_b{size}"), "steps": steps, "step_ms": ms(step),
        "overhead_ms": ms(step - forward), "overhead_share": share,
        "worker_host_ms": ms(forward - device), "device_ms": ms(device)})
}

/// Memory read bandwidth with every rayon thread summing its share of `data` (median of 3
/// passes), in GB/s.
fn measure_bandwidth(data: &[u64]) -> f64 {
    use rayon::prelude::*;
    let mut times: Vec<f64> = (0..3)
        .map(|_| {
            let t = Instant::now();
            let sum: u64 = data
                .par_chunks(1 << 16)
                .map(|c| c.iter().fold(0u64, |a, &b| a.wrapping_add(b)))
                .sum();
            std::hint::black_box(sum);
            t.elapsed().as_secs_f64()
        })
        .collect();
    std::mem::size_of_val(data) as f64 / median(&mut times) / 1e9
}

/// Batch-1 decode against the bandwidth bound. The machine's bandwidth moves from one minute to
/// the next, so each round measures both, back to back, and the share is taken per round.
async fn roofline(engine: &EngineHandle, args: &BenchArgs) -> Result<Vec<Value>> {
    let vocab = engine.model_info().vocab_size;
    let bytes = engine.model_info().weight_bytes_per_token as f64;
    // 1 GiB, backed by pages of the size the weights ask for, so both streams pay the same
    // address translation.
    let len = (1 << 30) / 8;
    let mut data = routed_model::streamed_vec::<u64>(len);
    data.resize(len, 1);
    let (mut rates, mut bandwidths, mut shares) = (Vec::new(), Vec::new(), Vec::new());
    for rep in 0..args.repeats.max(1) {
        let (ttft, total) = timed(
            engine,
            request(engine, prompt(500 + rep as u64, 8, vocab), 64, args.temperature),
        )
        .await?;
        let decode = 63.0 / (total - ttft).as_secs_f64();
        let bandwidth = measure_bandwidth(&data);
        shares.push(decode / (bandwidth * 1e9 / bytes));
        rates.push(decode);
        bandwidths.push(bandwidth);
    }
    let (decode, bandwidth) = (median(&mut rates), median(&mut bandwidths));
    let (low, high) = (
        shares.iter().copied().fold(f64::INFINITY, f64::min),
        shares.iter().copied().fold(0.0, f64::max),
    );
    let share = median(&mut shares);
    let bound = bandwidth * 1e9 / bytes;
    println!(
        "roofline: decode at batch 1 {decode:.1} tok/s; bandwidth {bandwidth:.1} GB/s; {:.1} MB of weights per token",
        bytes / 1e6
    );
    println!(
        "          bound {bound:.1} tok/s; per round {:.0} % of the roofline (min {:.0} %, max {:.0} %)",
        share * 100.0,
        low * 100.0,
        high * 100.0
    );
    Ok(vec![
        json!({"scenario": "roofline_b1", "tokens_per_s": decode, "bandwidth_gb_s": bandwidth, "weight_bytes_per_token": bytes, "roofline_tokens_per_s": bound, "share_of_roofline": share, "share_min": low, "share_max": high}),
    ])
}

/// One HTTP/1.1 request over a fresh connection; returns the status line's code.
async fn http_request(addr: std::net::SocketAddr, body: &str) -> Result<u16> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(addr).await?;
    let head = format!(
        "POST /v1/completions HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes()).await?;
    stream.write_all(body.as_bytes()).await?;
    let mut response = Vec::new();
    stream.read_to_end(&mut response).await?;
    let status = std::str::from_utf8(&response[..response.len().min(12)])?
        .get(9..12)
        .unwrap_or("0")
        .parse()?;
    Ok(status)
}

async fn http(engine: &EngineHandle, args: &BenchArgs) -> Result<Vec<Value>> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
    // The gateway runs in its own actix system, as `routed serve` runs it.
    let (tx, rx) = std::sync::mpsc::channel();
    let gateway_engine = engine.clone();
    let running = std::thread::spawn(move || {
        actix_rt::System::new().block_on(async move {
            let server = routed::server::bind_server(gateway_engine, listener)?;
            let _ = tx.send((server.addr, server.server.handle()));
            server.server.await
        })
    });
    let (addr, handle) = rx.recv().context("the gateway did not start")?;
    let clients = 8;
    let per_client = args.repeats.max(2);
    let vocab = engine.model_info().vocab_size;
    let model = engine.model_info().served_model_name.clone();
    let started = Instant::now();
    let work = (0..clients).map(|c| {
        let model = model.clone();
        async move {
            let mut latencies = Vec::new();
            for i in 0..per_client {
                let ids = prompt((c * 1000 + i) as u64, args.prompt_len, vocab);
                let body = json!({"model": model, "prompt": ids, "max_tokens": args.output_len, "ignore_eos": true}).to_string();
                let t = Instant::now();
                let status = http_request(addr, &body).await?;
                anyhow::ensure!(status == 200, "HTTP {status}");
                latencies.push(t.elapsed().as_secs_f64());
            }
            anyhow::Ok(latencies)
        }
    });
    let mut latencies: Vec<f64> = Vec::new();
    for r in join_all(work).await {
        latencies.extend(r?);
    }
    let wall = started.elapsed().as_secs_f64();
    handle.stop(true).await;
    let _ = running.join();
    latencies.sort_by(f64::total_cmp);
    let pct = |p: f64| latencies[((latencies.len() as f64 - 1.0) * p).round() as usize];
    let rps = latencies.len() as f64 / wall;
    println!(
        "(e) HTTP: {clients} clients x {per_client} requests, routing on: {rps:.2} req/s, p50 {:.1} ms, p99 {:.1} ms",
        pct(0.5) * 1e3,
        pct(0.99) * 1e3
    );
    Ok(vec![
        json!({"scenario": "http", "clients": clients, "requests": latencies.len(), "requests_per_s": rps, "p50_s": pct(0.5), "p99_s": pct(0.99)}),
    ])
}

#[cfg(test)]
mod tests {
    /// The prompt ids match `benches/benchlib.py`'s, so every engine gets the same prompts.
    #[test]
    fn prompts_match_the_baseline_scripts() {
        assert_eq!(super::prompt(1, 6, 151_936), [69549, 110062, 86223, 72061, 144684, 59715]);
        assert!(super::prompt(3, 100, 512).iter().all(|&t| t < 512));
    }
}
