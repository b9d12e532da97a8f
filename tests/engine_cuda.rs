//! The engine on a CUDA device, end to end, against the same engine on the CPU. Without a GPU the
//! CUDA worker runs on the CUDA simulator (`--device cuda-sim`: the same worker, kernels, pools
//! and copies, on the host), which is how CI runs these (`.ci/run` builds them with `--features
//! cuda`); a build without the feature skips them, saying why.
//!
//! The GPU keeps KV in bf16 where the CPU keeps f32, so logits differ slightly: tokens must be
//! equal, and routing ids equal wherever transformers' selection margin is clear.

mod common;

use common::{Outcome, cuda_engine, engine, greedy, mixed_requests, request, run, token_bits};
use futures_util::future::join_all;
use routed::GenerateRequest;
use routed::types::SamplingParams;
use routed_backend::DeviceSpec;
use routed_test_support::Golden;

const ARCHS: [&str; 4] = ["qwen3_moe", "mixtral", "nemotron_h", "granitemoehybrid"];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn greedy_tokens_and_routing_rows_match_the_cpu_engine() {
    for arch in ARCHS {
        let test = "greedy_tokens_and_routing_rows_match_the_cpu_engine";
        let Some(gpu) = cuda_engine(arch, test, |_| {}) else { return };
        assert!(gpu.model_info().device.starts_with("cuda"));
        let g = Golden::open(arch);
        let prompt = g.prompt("main");
        let cpu = engine(arch, |c| c.device = DeviceSpec::Cpu);
        let (want, got) =
            (run(&cpu, request(&prompt, 16)).await, run(&gpu, request(&prompt, 16)).await);
        assert!(got.error.is_none(), "{arch}: {:?}", got.error);
        let (want, got) = (&want.finals[0], &got.finals[0]);
        assert_eq!(got.token_ids, want.token_ids, "{arch}: tokens");
        let (rows, want_rows) = (got.routing.as_ref().unwrap(), want.routing.as_ref().unwrap());
        assert_eq!(rows.shape(), want_rows.shape(), "{arch}");
        let layers = g.moe_layers();
        for r in 0..rows.num_rows.min(prompt.len() + 15) {
            for (li, layer) in layers.iter().enumerate() {
                let (margin, _) = g.f32(&format!("main.generate.layer{layer}.selection_margin"));
                // The margin separates the chosen experts from the rest, not the chosen ones from
                // each other: two of them may swap ranks where their scores are close (mixtral,
                // row 2, layer 3: 5e-4 apart), so the rows are compared as sets, as the golden
                // tests do. Ranks are compared bit for bit between runs on the same device.
                if margin.get(r).is_some_and(|&m| m > 1e-3) {
                    let k = rows.row(r).len() / layers.len();
                    let at = li * k..(li + 1) * k;
                    let (mut a, mut b) =
                        (rows.row(r)[at.clone()].to_vec(), want_rows.row(r)[at].to_vec());
                    a.sort_unstable();
                    b.sort_unstable();
                    assert_eq!(a, b, "{arch}: experts of row {r} at MoE layer {li}");
                }
            }
        }
        cpu.shutdown().await;
        gpu.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_prefix_hit_on_the_gpu_reproduces_the_cold_run() {
    for arch in ["qwen3_moe", "nemotron_h"] {
        let test = "a_prefix_hit_on_the_gpu_reproduces_the_cold_run";
        let Some(gpu) = cuda_engine(arch, test, |_| {}) else { return };
        let prompt = Golden::open(arch).prompt("main");
        let cold = run(&gpu, request(&prompt, 8)).await;
        let warm = run(&gpu, request(&prompt, 8)).await;
        let (cold, warm) = (&cold.finals[0], &warm.finals[0]);
        assert!(warm.num_cached_tokens > 0, "{arch}: the second request hit the prefix cache");
        assert_eq!(warm.token_ids, cold.token_ids, "{arch}: tokens");
        assert_eq!(warm.routing, cold.routing, "{arch}: routing rows");
        gpu.shutdown().await;
    }
}

/// Whether two lists of alternatives (best first) name the same tokens in the same order with
/// `close` logprobs.
fn alternatives_equal(
    a: &[(u32, f32)],
    b: &[(u32, f32)],
    close: impl Fn(f32, f32) -> bool,
) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.0 == y.0 && close(x.1, y.1))
}

/// `dir` with every bf16 tensor of its checkpoint widened to f32 (exactly), in a new folder.
fn widened_to_f32(dir: &std::path::Path) -> tempfile::TempDir {
    use safetensors::{Dtype, SafeTensors, tensor::TensorView};
    let out = tempfile::tempdir().unwrap();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.file_name().unwrap() != "model.safetensors" {
            std::fs::copy(&path, out.path().join(path.file_name().unwrap())).unwrap();
        }
    }
    let bytes = std::fs::read(dir.join("model.safetensors")).unwrap();
    let st = SafeTensors::deserialize(&bytes).unwrap();
    let tensors: Vec<(String, Vec<usize>, Vec<u8>)> = st
        .tensors()
        .into_iter()
        .map(|(name, t)| {
            assert_eq!(t.dtype(), Dtype::BF16, "{name}");
            let widened = t
                .data()
                .chunks_exact(2)
                .flat_map(|c| half::bf16::from_le_bytes([c[0], c[1]]).to_f32().to_le_bytes());
            (name, t.shape().to_vec(), widened.collect())
        })
        .collect();
    let views = tensors
        .iter()
        .map(|(n, s, d)| (n.clone(), TensorView::new(Dtype::F32, s.clone(), d).unwrap()));
    safetensors::serialize_to_file(views, None, &out.path().join("model.safetensors")).unwrap();
    out
}

/// An f32 checkpoint (as f32 and f16 checkpoints load) runs on the device: its embedding table,
/// LM head and experts go through the f32-weight kernels, and with the bf16 checkpoint's values
/// widened it gives that checkpoint's tokens, logprob bits and routing rows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_f32_checkpoint_gives_the_bf16_checkpoints_bits() {
    let test = "an_f32_checkpoint_gives_the_bf16_checkpoints_bits";
    for arch in ["qwen3_moe", "granitemoehybrid"] {
        let g = Golden::open(arch);
        let f32_dir = widened_to_f32(&g.model_dir());
        let f32_model = routed::ModelSource::Dir(f32_dir.path().to_owned());
        let Some(bf16) = cuda_engine(arch, test, |_| {}) else { return };
        let f32 = cuda_engine(arch, test, |c| c.model = f32_model.clone()).expect("as above");
        let params = SamplingParams { logprobs: Some(3), ..greedy(6) };
        let request = GenerateRequest::new(g.prompt("main"), params);
        let (want, got) = (run(&bf16, request.clone()).await, run(&f32, request).await);
        assert!(got.error.is_none(), "{arch}: {:?}", got.error);
        assert_eq!(token_bits(&got), token_bits(&want), "{arch}: tokens and logprobs");
        assert_eq!(got.finals[0].routing, want.finals[0].routing, "{arch}: routing rows");
        bf16.shutdown().await;
        f32.shutdown().await;
    }
}

/// Decode steps replayed through CUDA graphs give the eager steps' bits: nine concurrent requests
/// of different lengths, greedy and seeded, so that decode batches of every size from 9 down to 1
/// are padded to the graphs' sizes (1, 2, 4, 8, 16), on every family.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn decode_graphs_give_the_eager_steps_bits() {
    let test = "decode_graphs_give_the_eager_steps_bits";
    for arch in ARCHS {
        let Some(graphed) = cuda_engine(arch, test, |c| c.cuda_graphs = true) else { return };
        let eager = cuda_engine(arch, test, |c| c.cuda_graphs = false).expect("starts as above");
        let requests = mixed_requests(&Golden::open(arch));
        let got = join_all(requests.iter().map(|r| run(&graphed, r.clone()))).await;
        let want = join_all(requests.iter().map(|r| run(&eager, r.clone()))).await;
        for (i, (got, want)) in got.iter().zip(&want).enumerate() {
            assert!(got.error.is_none() && want.error.is_none(), "{arch} request {i}");
            assert_eq!(token_bits(got), token_bits(want), "{arch} request {i}: tokens, logprobs");
            assert_eq!(got.finals[0].routing, want.finals[0].routing, "{arch} request {i}");
        }
        graphed.shutdown().await;
        eager.shutdown().await;
    }
}

/// Prefill chunk sizes change no bit on the CUDA worker: the same prompt prefilled in chunks of
/// 3, 7 and all at once gives the same tokens, logprobs and routing rows (attention and hybrid).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prefill_chunk_sizes_change_no_bit() {
    let test = "prefill_chunk_sizes_change_no_bit";
    for arch in ["qwen3_moe", "nemotron_h"] {
        let prompt = Golden::open(arch).prompt("long");
        let mut outcomes = Vec::new();
        for chunk in [3, 7, 256] {
            let Some(gpu) = cuda_engine(arch, test, |c| c.max_num_batched_tokens = chunk) else {
                return;
            };
            outcomes.push((chunk, run(&gpu, request(&prompt, 6)).await));
            gpu.shutdown().await;
        }
        let (_, want) = &outcomes[2];
        for (chunk, got) in &outcomes[..2] {
            assert_eq!(token_bits(got), token_bits(want), "{arch}: chunks of {chunk}");
            assert_eq!(got.finals[0].routing, want.finals[0].routing, "{arch}: chunks of {chunk}");
        }
    }
}

/// Decode past the first attention partition (512 positions) with one sequence splits each
/// attention layer over the keys' partitions, a CTA each, folded after; the same positions scored
/// in a prefill take every partition in one CTA. The logprobs must be the same bits: those of
/// tokens 1..6 decoded after a 600-token prompt, and those of the same tokens as a prompt's.
/// (Not Nemotron-H: its checkpoint clamps `dt` at prompt positions only, as transformers does, so
/// a token computes differently as a prompt token.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn decode_over_split_partitions_gives_the_prefills_bits() {
    let test = "decode_over_split_partitions_gives_the_prefills_bits";
    let cases = [("qwen3_moe", true), ("qwen3_moe", false), ("granitemoehybrid", true)];
    for (arch, graphs) in cases {
        let Some(gpu) = cuda_engine(arch, test, |c| c.cuda_graphs = graphs) else { return };
        let prompt: Vec<u32> = (0..600u32).map(|i| i * 37 % 509).collect();
        let decoded = run(&gpu, request(&prompt, 6)).await;
        let tokens: Vec<u32> = decoded.tokens.iter().map(|t| t.token).collect();
        let scored = [&prompt[..], &tokens[..]].concat();
        let params = SamplingParams { prompt_logprobs: Some(0), ..greedy(1) };
        let prefilled = run(&gpu, GenerateRequest::new(scored, params)).await;
        let entries = prefilled.finals[0].prompt_logprobs.as_ref().expect("asked for");
        // Token i was sampled from the row at position 599 + i, which in the second request
        // scores its prompt token 600 + i: entry 599 + i.
        for (i, t) in decoded.tokens.iter().enumerate().skip(1) {
            let entry = &entries[599 + i];
            assert_eq!(entry.token, t.token, "{arch} (graphs {graphs}): token {i}");
            assert_eq!(
                entry.logprob.to_bits(),
                t.logprob.to_bits(),
                "{arch} (graphs {graphs}): token {i}, decoded {} vs prefilled {}",
                t.logprob,
                entry.logprob
            );
        }
        gpu.shutdown().await;
    }
}

/// What the device computes of a token (the choice after bias, penalties and min-p; the logprob,
/// up to 20 alternatives; prompt logprobs) equals the host sampler's on the same logits: an
/// engine with `device_sampling` off copies every row's logits to the host and runs the CPU
/// worker's sampler. The same tokens, alternatives and ranks, and logprobs within the device's
/// normaliser tolerance (1e-4). (The edited logits are checked exactly by the backend's op tests.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sampling_on_the_device_equals_the_host_sampler() {
    let test = "sampling_on_the_device_equals_the_host_sampler";
    let cases = [
        ("greedy", greedy(6)),
        ("5 alternatives", SamplingParams { logprobs: Some(5), ..greedy(6) }),
        (
            "20 alternatives, seeded",
            SamplingParams { logprobs: Some(20), temperature: 0.8, seed: 11, ..greedy(6) },
        ),
        ("repetition", SamplingParams { repetition_penalty: 3.0, logprobs: Some(2), ..greedy(10) }),
        (
            "frequency and presence",
            SamplingParams {
                frequency_penalty: 1.5,
                presence_penalty: 1.0,
                logprobs: Some(2),
                ..greedy(10)
            },
        ),
        (
            "bias and min-p, seeded",
            SamplingParams {
                logit_bias: vec![(5, 2.0), (9, -3.0)],
                min_p: 0.2,
                temperature: 0.9,
                seed: 5,
                logprobs: Some(1),
                ..greedy(10)
            },
        ),
        ("a bias that decides", SamplingParams { logit_bias: vec![(7, 100.0)], ..greedy(4) }),
        ("prompt logprobs", SamplingParams { prompt_logprobs: Some(3), ..greedy(4) }),
    ];
    let close = |a: f32, b: f32| (a - b).abs() < 1e-4;
    for arch in ["qwen3_moe", "granitemoehybrid"] {
        // Small steps: the prompt's logprobs come in several chunks.
        let Some(gpu) = cuda_engine(arch, test, |c| c.max_num_batched_tokens = 9) else { return };
        let host = cuda_engine(arch, test, |c| {
            c.max_num_batched_tokens = 9;
            c.device_sampling = false;
        })
        .expect("starts as above");
        let prompt = Golden::open(arch).prompt("main");
        for (case, params) in &cases {
            let request = GenerateRequest::new(prompt.clone(), params.clone());
            let (got, want) = (run(&gpu, request.clone()).await, run(&host, request).await);
            let what = format!("{arch}, {case}");
            assert!(got.error.is_none() && want.error.is_none(), "{what}");
            if params.logit_bias.iter().any(|&(_, b)| b >= 100.0) {
                assert!(got.tokens.iter().all(|t| t.token == 7), "{what}: the bias rules");
            }
            if params.needs_history() {
                let plain = run(&gpu, GenerateRequest::new(prompt.clone(), greedy(10))).await;
                let tokens = |o: &Outcome| o.tokens.iter().map(|t| t.token).collect::<Vec<_>>();
                assert_ne!(tokens(&got), tokens(&plain), "{what}: the penalty changes tokens");
            }
            assert_eq!(got.tokens.len(), want.tokens.len(), "{what}");
            for (d, h) in got.tokens.iter().zip(&want.tokens) {
                assert_eq!(d.token, h.token, "{what}");
                assert!(close(d.logprob, h.logprob), "{what}: {d:?} vs {h:?}");
                assert!(alternatives_equal(&d.top_logprobs, &h.top_logprobs, close), "{what}");
            }
            let (got, want) = (&got.finals[0].prompt_logprobs, &want.finals[0].prompt_logprobs);
            assert_eq!(got.is_some(), params.prompt_logprobs.is_some(), "{what}");
            let count = |p: &Option<Vec<_>>| p.as_ref().map(Vec::len);
            assert_eq!(count(got), count(want), "{what}: prompt logprobs");
            for (i, (d, h)) in got.iter().flatten().zip(want.iter().flatten()).enumerate() {
                assert_eq!((d.token, d.rank), (h.token, h.rank), "{what}: prompt position {i}");
                assert!(close(d.logprob, h.logprob), "{what}: prompt position {i}");
                let agree = alternatives_equal(&d.top_logprobs, &h.top_logprobs, close);
                assert!(agree, "{what}: prompt position {i}: {d:?} vs {h:?}");
            }
        }
        gpu.shutdown().await;
        host.shutdown().await;
    }
}
