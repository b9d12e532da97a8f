//! `--matmul-precision bf16` on the CUDA worker: the products with bf16 weights round their inputs
//! to bf16 and run on tensor cores. Against transformers, its prompt logprobs stay within the
//! distance that transformers' own bfloat16 run keeps from the float32 goldens; against itself,
//! a request's tokens, logprobs and routing are bitwise the same alone or batched, in any prefill
//! chunking, and through decode graphs or eager steps. Without a GPU these run on the CUDA
//! simulator, like `engine_cuda.rs`.

mod common;

use common::{cuda_engine, greedy, mixed_requests, run, token_bits};
use futures_util::future::join_all;
use routed::runtime::MatmulPrecision;
use routed::types::SamplingParams;
use routed::{EngineConfig, GenerateRequest};
use routed_test_support::Golden;

const ARCHS: [&str; 4] = ["qwen3_moe", "mixtral", "nemotron_h", "granitemoehybrid"];

fn bf16(c: &mut EngineConfig) {
    c.matmul_precision = MatmulPrecision::Bf16;
}

/// The log-softmax of each row of `logits` `[rows, vocab]` at the next prompt token: entry `i` is
/// prompt token `i + 1`'s logprob, as the engine's prompt logprobs are.
fn prompt_logprobs(logits: &[f32], prompt: &[u32]) -> Vec<f64> {
    let vocab = logits.len() / prompt.len();
    logits
        .chunks_exact(vocab)
        .zip(&prompt[1..])
        .map(|(row, &next)| {
            let max = row.iter().fold(f64::NEG_INFINITY, |m, &v| m.max(f64::from(v)));
            let sum: f64 = row.iter().map(|&v| (f64::from(v) - max).exp()).sum();
            f64::from(row[next as usize]) - max - sum.ln()
        })
        .collect()
}

fn max_diff(a: &[f64], b: &[f64]) -> f64 {
    a.iter().zip(b).fold(0.0, |m, (x, y)| m.max((x - y).abs()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bf16_precision_is_as_close_to_float32_as_transformers_bf16() {
    let test = "bf16_precision_is_as_close_to_float32_as_transformers_bf16";
    for arch in ARCHS {
        let Some(gpu) = cuda_engine(arch, test, bf16) else { return };
        let exact = cuda_engine(arch, test, |_| {}).expect("starts as above");
        let (f32_ref, bf16_ref) =
            (Golden::open(arch), Golden::open_tensors(arch, "golden_bf16.safetensors"));
        let prompt = f32_ref.prompt("long");
        let params = SamplingParams { prompt_logprobs: Some(0), ..greedy(1) };
        let scored = |handle| {
            let request = GenerateRequest::new(prompt.clone(), params.clone());
            async move {
                let out = run(handle, request).await;
                assert!(out.error.is_none(), "{arch}: {:?}", out.error);
                let rows = out.finals[0].prompt_logprobs.clone().expect("asked for");
                rows.iter().map(|t| f64::from(t.logprob)).collect::<Vec<_>>()
            }
        };
        let (ours, exact_run) = (scored(&gpu).await, scored(&exact).await);
        assert_ne!(ours, exact_run, "{arch}: the precision changed nothing");
        let want = prompt_logprobs(&f32_ref.f32("long.logits").0, &prompt);
        let theirs = prompt_logprobs(&bf16_ref.f32("long.logits").0, &prompt);
        let (ours_err, their_err) = (max_diff(&ours, &want), max_diff(&theirs, &want));
        eprintln!("{arch}: |ours - f32| {ours_err:.5}, |transformers bf16 - f32| {their_err:.5}");
        assert!(
            ours_err <= their_err,
            "{arch}: bf16 precision's prompt logprobs are {ours_err} from float32's, \
             transformers' bf16 run's {their_err}"
        );
        gpu.shutdown().await;
        exact.shutdown().await;
    }
}

/// Nine concurrent requests of different lengths, greedy and seeded (decode batches of every size
/// from 9 down to 1, padded to the graphs' sizes), give each request's bits alone and eager; a
/// prompt prefilled in chunks of 3 gives the bits of one chunk.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bf16_precision_changes_no_bit_with_batching_chunking_or_graphs() {
    let test = "bf16_precision_changes_no_bit_with_batching_chunking_or_graphs";
    for arch in ["qwen3_moe", "nemotron_h"] {
        let Some(graphed) = cuda_engine(arch, test, |c| {
            bf16(c);
            c.cuda_graphs = true;
        }) else {
            return;
        };
        let eager = cuda_engine(arch, test, |c| {
            bf16(c);
            c.cuda_graphs = false;
            c.max_num_batched_tokens = 3;
        })
        .expect("starts as above");
        let requests = mixed_requests(&Golden::open(arch));
        let batched = join_all(requests.iter().map(|r| run(&graphed, r.clone()))).await;
        for (i, (request, got)) in requests.iter().zip(&batched).enumerate() {
            let alone = run(&eager, request.clone()).await;
            assert!(got.error.is_none() && alone.error.is_none(), "{arch} request {i}");
            let what = format!("{arch} request {i}, batched and graphed vs alone in chunks of 3");
            assert_eq!(token_bits(got), token_bits(&alone), "{what}: tokens, logprobs");
            assert_eq!(got.finals[0].routing, alone.finals[0].routing, "{what}: routing");
        }
        graphed.shutdown().await;
        eager.shutdown().await;
    }
}
