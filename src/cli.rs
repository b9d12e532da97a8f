//! Command-line flags shared by `routed serve`, `routed generate` and `routed bench`, and their
//! translation into an [`EngineConfig`].

use anyhow::{Context, Result};
use clap::Args;
use routed::{Engine, EngineConfig, EngineHandle, ModelSource, embedded};
use std::path::PathBuf;

/// The model and engine flags.
#[derive(Args, Clone, Debug)]
pub struct EngineArgs {
    /// Hugging Face checkpoint directory (config.json, model.safetensors or a sharded index,
    /// tokenizer.json). Without it, the tiny hybrid model compiled into the binary.
    #[arg(long)]
    pub model: Option<PathBuf>,
    /// Name the model is served under (default: the directory's name, or routed-tiny-hybrid).
    #[arg(long)]
    pub served_model_name: Option<String>,
    /// Accepted for vLLM compatibility: routing capture is on by default.
    #[arg(long, conflicts_with = "disable_return_routed_experts")]
    pub enable_return_routed_experts: bool,
    /// Do not record routing; requests asking for it get a 400.
    #[arg(long)]
    pub disable_return_routed_experts: bool,
    /// Tokens per KV block (prefix caching and Mamba snapshots work at block granularity).
    #[arg(long, default_value_t = 16)]
    pub block_size: usize,
    /// Most tokens computed in one engine step (prefill chunks and decodes together).
    #[arg(long, default_value_t = 2048)]
    pub max_num_batched_tokens: usize,
    /// Most requests running at once.
    #[arg(long, default_value_t = 128)]
    pub max_num_seqs: usize,
    /// Most requests waiting; beyond it requests are refused with 503.
    #[arg(long, default_value_t = 1024)]
    pub max_waiting_requests: usize,
    /// KV blocks in the pool (overrides --kv-cache-memory-gb).
    #[arg(long)]
    pub num_kv_blocks: Option<usize>,
    /// Memory for the KV cache, in GB, when --num-kv-blocks is not given.
    #[arg(long, default_value_t = 2.0)]
    pub kv_cache_memory_gb: f64,
    /// Mamba state snapshot slots (hybrid models): how many block-boundary states the prefix
    /// cache keeps.
    #[arg(long, default_value_t = 64)]
    pub mamba_snapshot_slots: usize,
    /// Cap on host bytes of routing rows (default: enough for every KV block's rows).
    #[arg(long)]
    pub routing_cache_max_bytes: Option<usize>,
    /// Turn prefix caching off.
    #[arg(long)]
    pub no_prefix_caching: bool,
    /// Idle heartbeat period in ms (dummy forwards while idle); 0 turns it off.
    #[arg(long, default_value_t = 100)]
    pub heartbeat_ms: u64,
    /// Longest prompt + output (default: the model's max_position_embeddings).
    #[arg(long)]
    pub max_model_len: Option<usize>,
    /// Device: cpu or cuda:N.
    #[arg(long, default_value = "cpu")]
    pub device: String,
    /// Threads for the CPU kernels, split among the ranks (default: every core).
    #[arg(long)]
    pub threads: Option<usize>,
    /// Ranks (model runners) in the expert-parallel group: each holds 1/N of every MoE layer's
    /// experts. Results are bitwise the same for every N; N must divide the number of experts.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..))]
    pub expert_parallel_size: u16,
    /// Arithmetic of the products with bf16 weights: f32 (exact, the default) or bf16 (inputs
    /// rounded to bf16: AVX-512 BF16 dot products on the CPU, tensor cores on a CUDA device;
    /// faster, still deterministic and batch invariant).
    #[arg(long, default_value = "f32", value_parser = ["f32", "bf16"])]
    pub matmul_precision: String,
    /// Default sampling seed.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
}

impl EngineArgs {
    /// The engine configuration these flags describe.
    pub fn config(&self) -> Result<EngineConfig> {
        let (source, default_name) = match &self.model {
            Some(dir) => (ModelSource::Dir(dir.clone()), None),
            None => (
                ModelSource::Embedded(embedded::unpack().context("unpacking the embedded model")?),
                Some(embedded::SERVED_MODEL_NAME.to_owned()),
            ),
        };
        let mut config = EngineConfig::new(source);
        if let Some(name) = self.served_model_name.clone().or(default_name) {
            config.served_model_name = name;
        }
        config.device = self.device.parse().with_context(|| format!("--device {}", self.device))?;
        config.block_size = self.block_size;
        config.num_kv_blocks = self.num_kv_blocks;
        config.kv_cache_memory_gb = self.kv_cache_memory_gb;
        config.mamba_snapshot_slots = self.mamba_snapshot_slots;
        config.routing_cache_max_bytes = self.routing_cache_max_bytes;
        config.enable_prefix_caching = !self.no_prefix_caching;
        config.enable_routing_capture = !self.disable_return_routed_experts;
        config.max_num_batched_tokens = self.max_num_batched_tokens;
        config.max_num_seqs = self.max_num_seqs;
        config.max_waiting_requests = self.max_waiting_requests;
        config.max_model_len = self.max_model_len;
        config.heartbeat_ms = self.heartbeat_ms;
        config.threads = self.threads;
        config.expert_parallel_size = usize::from(self.expert_parallel_size);
        config.matmul_precision = self.matmul_precision.parse().map_err(anyhow::Error::msg)?;
        config.seed = self.seed;
        Ok(config)
    }

    /// Starts an engine, with a progress bar while the weights load.
    pub fn start(&self) -> Result<EngineHandle> {
        start(self.config()?)
    }
}

/// Starts an engine on `config`, with a progress bar while the checkpoint loads.
pub fn start(config: EngineConfig) -> Result<EngineHandle> {
    let bar = indicatif::ProgressBar::new(0)
        .with_message(format!("loading {}", config.model.dir().display()));
    bar.set_style(
        indicatif::ProgressStyle::with_template("{msg} [{bar:30}] {pos}/{len} tensors")
            .expect("valid template"),
    );
    let engine = Engine::start_with_progress(config, &mut |done, total| {
        bar.set_length(total as u64);
        bar.set_position(done as u64);
    });
    bar.finish_and_clear();
    Ok(engine?)
}
