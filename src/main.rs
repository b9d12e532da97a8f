//! The `routed` command line.

use anyhow::{Context, Result, bail};
use clap::{Parser, Subcommand};
use routed::{
    backend::{Device, DeviceSpec},
    model::{LiveStateId, LogitsWanted, Model, Sampler, SeqInput, StateIo, Tokenizer},
    types::{BlockId, SamplingParams, TokenId},
};
use std::path::{Path, PathBuf};

/// An inference engine for Mixture-of-Experts and hybrid Mamba2/attention/MoE models, with
/// routing replay.
#[derive(Parser)]
#[command(name = "routed", version)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Generate a continuation of one prompt and print it.
    Generate(GenerateArgs),
}

#[derive(clap::Args)]
struct GenerateArgs {
    /// Hugging Face checkpoint directory (config.json, model.safetensors, tokenizer.json).
    #[arg(long)]
    model: PathBuf,
    /// Prompt text (encoded with the checkpoint's tokenizer, no special tokens added).
    #[arg(long, conflicts_with = "prompt_ids", required_unless_present = "prompt_ids")]
    prompt: Option<String>,
    /// Prompt as comma-separated token ids.
    #[arg(long, value_delimiter = ',')]
    prompt_ids: Option<Vec<TokenId>>,
    /// Most tokens to generate.
    #[arg(long, default_value_t = 16)]
    max_tokens: u32,
    /// Sampling temperature; 0 is greedy.
    #[arg(long, default_value_t = 0.0)]
    temperature: f32,
    /// Seed of the sampler.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Keep generating past EOS.
    #[arg(long)]
    ignore_eos: bool,
    /// Device: `cpu` or `cuda:N`.
    #[arg(long, default_value = "cpu")]
    device: String,
    /// Print one JSON object (token ids, text, finish reason, routing shape) instead of text.
    #[arg(long)]
    json: bool,
}

fn main() -> Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .init();
    match Cli::parse().command {
        Command::Generate(args) => generate(args),
    }
}

fn load_with_progress(dir: &Path) -> Result<Model> {
    let bar = indicatif::ProgressBar::new(0).with_message(format!("loading {}", dir.display()));
    bar.set_style(
        indicatif::ProgressStyle::with_template("{msg} [{bar:30}] {pos}/{len} tensors")
            .expect("template"),
    );
    let model = Model::load(dir, &mut |done, total| {
        bar.set_length(total as u64);
        bar.set_position(done as u64);
    })?;
    bar.finish_and_clear();
    Ok(model)
}

fn generate(args: GenerateArgs) -> Result<()> {
    let spec: DeviceSpec = args.device.parse()?;
    let device = Device::open(spec).with_context(|| format!("opening device {spec}"))?;
    if !device.is_cpu() {
        bail!("device {device} is available, but this build runs models on the CPU backend only");
    }
    let model = load_with_progress(&args.model)?;
    let tokenizer = Tokenizer::from_dir(&args.model)?;
    let prompt = match (&args.prompt, &args.prompt_ids) {
        (Some(text), _) => tokenizer.encode(text)?,
        (None, Some(ids)) => ids.clone(),
        (None, None) => bail!("give --prompt or --prompt-ids"),
    };
    if prompt.is_empty() {
        bail!("the prompt is empty");
    }
    let params = SamplingParams {
        temperature: args.temperature,
        seed: args.seed,
        max_tokens: args.max_tokens,
        ignore_eos: args.ignore_eos,
        ..SamplingParams::default()
    };
    let (tokens, finish, rows) = run(&model, &prompt, &params, tokenizer.eos_token_ids())?;
    let text = tokenizer.decode(&tokens)?;
    if args.json {
        let meta = model.routing_meta();
        let shape = meta.map(|m| [rows, m.num_moe_layers(), m.top_k as usize]);
        let out = serde_json::json!({
            "token_ids": tokens,
            "text": text,
            "finish_reason": finish,
            "cached_tokens": 0,
            "routed_experts_shape": shape,
        });
        println!("{out}");
    } else {
        println!("{text}");
    }
    Ok(())
}

/// Runs one request to completion on private blocks: a prefill, then one decode step per token.
/// Returns the generated tokens, the finish reason and the number of routing rows computed.
fn run(
    model: &Model,
    prompt: &[TokenId],
    params: &SamplingParams,
    eos: &[TokenId],
) -> Result<(Vec<TokenId>, &'static str, usize)> {
    const BLOCK: usize = 16;
    let total = prompt.len() + params.max_tokens as usize;
    let table: Vec<BlockId> = (0..total.div_ceil(BLOCK) as u32).map(BlockId).collect();
    let mut kv = model.new_kv_cache(table.len(), BLOCK);
    let mut states = model.new_state_cache(1, 0);
    let mut routing = model.new_routing_buffer(prompt.len().max(1));
    let mut sampler = Sampler::default();
    let mut tokens: Vec<TokenId> = Vec::new();
    let mut input: Vec<TokenId> = prompt.to_vec();
    let mut computed = 0;
    while tokens.len() < params.max_tokens as usize {
        let seq = SeqInput {
            token_ids: &input,
            num_computed_tokens: computed,
            num_prompt_tokens: prompt.len(),
            block_table: &table,
            logits: LogitsWanted::Last,
            state: model.config().is_hybrid().then_some(StateIo {
                live: LiveStateId(0),
                restore_from: None,
                snapshots: &[],
            }),
        };
        let out = model.forward(&[seq], &mut kv, &mut states, &mut routing)?;
        computed += input.len();
        let next = sampler.sample(&out.logits, params, tokens.len() as u64).token;
        tokens.push(next);
        if !params.ignore_eos && eos.contains(&next) {
            return Ok((tokens, "stop", computed));
        }
        input.clear();
        input.push(next);
    }
    Ok((tokens, "length", computed))
}
