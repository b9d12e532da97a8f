//! The `routed` command line: `serve`, `generate`, `bench`.

mod bench;
#[cfg(feature = "cuda")]
mod bench_kernels;
#[cfg(not(feature = "cuda"))]
#[path = "bench_kernels_stub.rs"]
mod bench_kernels;
mod cli;

use anyhow::{Result, bail};
use clap::{Parser, Subcommand};
use cli::EngineArgs;
use futures_util::StreamExt;
use routed::{GenerateRequest, RequestEvent, types::SamplingParams, types::TokenId};

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
    /// Serve the OpenAI-compatible HTTP API (the embedded tiny hybrid model without --model).
    Serve(ServeArgs),
    /// Generate a continuation of one prompt and print it.
    Generate(GenerateArgs),
    /// Measure the engine: throughput, routing-capture overhead, prefix-hit scaling, engine
    /// overhead.
    Bench(bench::BenchArgs),
}

#[derive(clap::Args)]
struct ServeArgs {
    #[command(flatten)]
    engine: EngineArgs,
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1")]
    host: String,
    /// Port to listen on (0 picks a free one).
    #[arg(long, default_value_t = 8000)]
    port: u16,
    /// On SIGTERM or SIGINT, seconds the requests in flight get to finish; new requests are
    /// answered 503 meanwhile, and what is left then ends with a 503 error.
    #[arg(long, default_value_t = 30)]
    shutdown_grace_s: u64,
    /// Seconds a request body may take to arrive once its headers have; a stalled body is
    /// answered 408.
    #[arg(long, default_value_t = 60)]
    body_read_timeout_s: u64,
    /// Let the model call the request's tools on its own (`tool_choice: "auto"`, the default
    /// when a chat lists tools): calls in its output become the message's `tool_calls`. Needs
    /// `--tool-call-parser`.
    #[arg(long, requires = "tool_call_parser")]
    enable_auto_tool_choice: bool,
    /// The format of the model's tool calls: `hermes` (`<tool_call>{"name", "arguments"}
    /// </tool_call>`: Qwen2.5, Qwen3, Granite 4.0, Hermes) or `mistral` (`[TOOL_CALLS]
    /// [{"name", "arguments"}]`: Mixtral 8x22B).
    #[arg(long, value_name = "NAME")]
    tool_call_parser: Option<routed::server::ToolCallParser>,
    /// Split a chat answer's thinking off its content into `reasoning_content`: `qwen3`
    /// (between `<think>` and `</think>`) or `deepseek_r1` (the answer starts thinking).
    #[arg(long, value_name = "NAME")]
    reasoning_parser: Option<routed::server::ReasoningParser>,
}

#[derive(clap::Args)]
struct GenerateArgs {
    #[command(flatten)]
    engine: EngineArgs,
    /// Prompt text (encoded with the checkpoint's tokenizer and its own special tokens, a BOS
    /// where it adds one, as `/v1/completions` encodes a text prompt).
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
    /// Keep generating past EOS.
    #[arg(long)]
    ignore_eos: bool,
    /// Print one JSON object (token ids, text, finish reason, cached tokens, routing shape).
    #[arg(long)]
    json: bool,
}

fn main() -> Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let command = Cli::parse().command;
    let runtime =
        tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build()?;
    match command {
        Command::Serve(args) => serve(args),
        Command::Generate(args) => runtime.block_on(generate(args)),
        Command::Bench(args) => runtime.block_on(bench::run(args)),
    }
}

/// Runs the gateway until SIGTERM or SIGINT, then drains: new requests get 503, the ones in flight
/// get `--shutdown-grace-s` to finish, the rest end with a 503, and the process exits 0.
fn serve(args: ServeArgs) -> Result<()> {
    routed::server::install_metrics_recorder()
        .map_err(|e| anyhow::anyhow!("metrics recorder: {e}"))?;
    let engine = args.engine.start()?;
    let config = routed::server::ServerConfig {
        host: args.host.clone(),
        port: args.port,
        shutdown_grace: std::time::Duration::from_secs(args.shutdown_grace_s),
        body_read_timeout: std::time::Duration::from_secs(args.body_read_timeout_s),
        tool_call_parser: args.tool_call_parser.filter(|_| args.enable_auto_tool_choice),
        reasoning_parser: args.reasoning_parser,
        ..routed::server::ServerConfig::default()
    };
    let listener = config.bind()?;
    let info = engine.model_info();
    tracing::info!(
        model = %info.served_model_name,
        device = %info.device,
        kv_blocks = info.num_kv_blocks,
        snapshot_slots = info.num_snapshot_slots,
        routing_capture = info.routing_capture,
        "serving on http://{}",
        listener.local_addr()?
    );
    actix_rt::System::new().block_on(routed::server::serve_with(engine, listener, &config))?;
    Ok(())
}

async fn generate(args: GenerateArgs) -> Result<()> {
    let mut engine_args = args.engine.clone();
    // One request: the heartbeat has nothing to keep in step.
    engine_args.heartbeat_ms = 0;
    let engine = engine_args.start()?;
    let prompt = match (&args.prompt, &args.prompt_ids) {
        // As `/v1/completions` encodes a text prompt: with the tokenizer's own special tokens.
        (Some(text), _) => engine.tokenizer().encode_with(text, true)?,
        (None, Some(ids)) => ids.clone(),
        (None, None) => bail!("give --prompt or --prompt-ids"),
    };
    let params = SamplingParams {
        temperature: args.temperature,
        seed: args.engine.seed,
        max_tokens: args.max_tokens,
        ignore_eos: args.ignore_eos,
        ..SamplingParams::default()
    };
    // The decoder-layer layout (`num_hidden_layers` on the layer axis), as `routed serve`
    // returns routing by default and RL trainers reshape it.
    let num_layers = engine.model_info().routing.as_ref().map(|m| m.num_layers as usize);
    let mut events = engine.submit(GenerateRequest::new(prompt, params)).await?;
    let mut result = None;
    while let Some(event) = events.next().await {
        match event {
            RequestEvent::Token(_) => {}
            RequestEvent::Finished(out) => result = Some(out),
            RequestEvent::Error(e) => bail!("generation failed: {e}"),
        }
    }
    engine.shutdown().await;
    let Some(out) = result else { bail!("the engine ended the request without an output") };
    if args.json {
        let finish = match out.finish_reason {
            routed::types::FinishReason::Stop { .. } => "stop",
            routed::types::FinishReason::Length => "length",
            routed::types::FinishReason::Abort => "abort",
        };
        let json = serde_json::json!({
            "token_ids": out.token_ids,
            "text": out.text,
            "finish_reason": finish,
            "cached_tokens": out.num_cached_tokens,
            "routed_experts_shape": out.routing.as_ref().zip(num_layers).map(|(r, layers)| {
                [r.num_rows, layers, r.top_k]
            }),
        });
        println!("{json}");
    } else {
        println!("{}", out.text);
    }
    Ok(())
}
