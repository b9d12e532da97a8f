//! Helpers shared by the engine-level tests.
#![allow(dead_code)]

use futures_util::StreamExt;
use routed::runtime::{EngineError, FinalOutput, MissingDevice, TokenEvent};
use routed::types::{SamplingParams, TokenId};
use routed::{Engine, EngineConfig, EngineHandle, GenerateRequest, ModelSource, RequestEvent};
use routed_backend::DeviceSpec;
pub mod http;

use routed_test_support::golden_root;
use std::time::Duration;

/// A watchdog for engine tests: a hung engine fails the test instead of hanging CI.
pub const WATCHDOG: Duration = Duration::from_secs(60);

/// The variable naming the device the engine tests run on (`cpu` when unset): `cuda:0` on a GPU
/// machine, `cuda-sim` for the CUDA worker on the CUDA simulator (in a build with `--features
/// cuda`). Tests that compare against the CPU engine or against transformers with the CPU's
/// tolerance pin their device themselves.
pub const DEVICE_ENV: &str = "ROUTED_TEST_DEVICE";

/// The device [`DEVICE_ENV`] names.
pub fn test_device() -> routed_backend::DeviceSpec {
    match std::env::var(DEVICE_ENV) {
        Ok(spec) => spec.parse().unwrap_or_else(|e| panic!("{DEVICE_ENV}: {e}")),
        Err(_) => routed_backend::DeviceSpec::Cpu,
    }
}

/// Small, test-friendly settings for the golden checkpoint of `arch`, on [`test_device`].
pub fn test_config(arch: &str) -> EngineConfig {
    let mut config = EngineConfig::new(ModelSource::Dir(golden_root().join(arch).join("model")));
    config.block_size = 4;
    config.num_kv_blocks = Some(256);
    config.mamba_snapshot_slots = 64;
    config.max_num_batched_tokens = 256;
    config.max_num_seqs = 32;
    config.heartbeat_ms = 0;
    config.threads = Some(2);
    config.device = test_device();
    config
}

/// An engine on the golden checkpoint of `arch` with [`test_config`]'s settings, tweaked.
pub fn engine(arch: &str, tweak: impl FnOnce(&mut EngineConfig)) -> EngineHandle {
    let mut config = test_config(arch);
    tweak(&mut config);
    Engine::start(config).expect("engine starts")
}

/// An engine like [`engine`]'s, or `None` (the reason printed) where its settings ask for more
/// GPUs than the machine has: expert parallelism over `cuda:N` puts rank r on `cuda:N+r`, so a
/// test of several ranks runs on the simulator (CI) and on machines with that many GPUs.
pub fn engine_if_devices(
    arch: &str,
    test: &str,
    tweak: impl FnOnce(&mut EngineConfig),
) -> Option<EngineHandle> {
    let mut config = test_config(arch);
    tweak(&mut config);
    match Engine::start(config) {
        Ok(handle) => Some(handle),
        Err(EngineError::DeviceUnavailable {
            kind: MissingDevice::TooFewDevices,
            message: why,
        }) => {
            eprintln!("skipping {test} ({arch}): {why}");
            None
        }
        Err(e) => panic!("engine starts: {e}"),
    }
}

/// Greedy sampling of `n` tokens, EOS ignored.
pub fn greedy(n: u32) -> SamplingParams {
    SamplingParams { ignore_eos: true, ..SamplingParams::greedy(n) }
}

/// What one request produced.
#[derive(Debug)]
pub struct Outcome {
    /// Token events in arrival order.
    pub tokens: Vec<TokenEvent>,
    /// Final outputs by continuation index.
    pub finals: Vec<FinalOutput>,
    /// The error, if the request failed.
    pub error: Option<EngineError>,
}

/// Submits a request and collects its events (under the watchdog).
pub async fn run(handle: &EngineHandle, request: GenerateRequest) -> Outcome {
    let stream = handle.submit(request).await.expect("submitted");
    collect(stream).await
}

/// Collects a stream's events.
pub async fn collect(mut stream: routed::runtime::RequestStream) -> Outcome {
    let mut out = Outcome { tokens: Vec::new(), finals: Vec::new(), error: None };
    let work = async {
        while let Some(event) = stream.next().await {
            match event {
                RequestEvent::Token(t) => out.tokens.push(t),
                RequestEvent::Finished(f) => out.finals.push(*f),
                RequestEvent::Error(e) => out.error = Some(e),
            }
        }
    };
    tokio::time::timeout(WATCHDOG, work).await.expect("the request finished within the watchdog");
    out.finals.sort_by_key(|f| f.index);
    out
}

/// A greedy request for `prompt`.
pub fn request(prompt: &[TokenId], max_tokens: u32) -> GenerateRequest {
    GenerateRequest::new(prompt.to_vec(), greedy(max_tokens))
}

/// An engine on `cuda:0`, else on the CUDA simulator, with [`test_config`]'s settings tweaked, or
/// `None` (with the reason printed) in a build without CUDA. `ROUTED_CUDA_SIM=1` takes the
/// simulator even where a GPU is present.
pub fn cuda_engine(
    arch: &str,
    test: &str,
    tweak: impl Fn(&mut EngineConfig),
) -> Option<EngineHandle> {
    let start = |device: DeviceSpec| {
        let mut config = test_config(arch);
        config.device = device;
        tweak(&mut config);
        Engine::start(config)
    };
    let gpu = match std::env::var("ROUTED_CUDA_SIM").is_ok_and(|v| v == "1") {
        true => Err(EngineError::DeviceUnavailable {
            kind: MissingDevice::NoDriver,
            message: "ROUTED_CUDA_SIM=1".into(),
        }),
        false => start(DeviceSpec::Cuda(0)),
    };
    let no_gpu = match gpu {
        Ok(handle) => return Some(handle),
        Err(EngineError::DeviceUnavailable { message, .. }) => message,
        Err(e) => panic!("{arch}: the CUDA engine failed to start: {e}"),
    };
    match start(DeviceSpec::CudaSim) {
        Ok(handle) => {
            eprintln!("{test}: no GPU ({no_gpu}); {arch} runs on the CUDA simulator");
            Some(handle)
        }
        Err(EngineError::DeviceUnavailable { kind: MissingDevice::NotCompiled, message: why }) => {
            eprintln!("skipping {test}: {why}");
            None
        }
        Err(e) => panic!("{arch}: the CUDA engine failed to start on the simulator: {e}"),
    }
}

/// Each streamed token with the bits of its logprob.
pub fn token_bits(o: &Outcome) -> Vec<(u32, u32)> {
    o.tokens.iter().map(|t| (t.token, t.logprob.to_bits())).collect()
}

/// Nine requests for the golden prompts of `g`, of different lengths, greedy and seeded, as
/// concurrent requests they make decode batches of every size from 9 down to 1.
pub fn mixed_requests(g: &routed_test_support::Golden) -> Vec<GenerateRequest> {
    let (main, long) = (g.prompt("main"), g.prompt("long"));
    (0..9)
        .map(|i| {
            let prompt = if i % 2 == 0 { &main[i..] } else { &long[..4 + i] };
            let params = match i % 3 {
                0 => SamplingParams {
                    temperature: 0.9,
                    seed: 7 + i as u64,
                    max_tokens: 3 + i as u32,
                    ignore_eos: true,
                    ..Default::default()
                },
                _ => greedy(3 + i as u32),
            };
            GenerateRequest::new(prompt.to_vec(), params)
        })
        .collect()
}
