//! Embedding the engine in a plain tokio program: start it on a checkpoint, submit one request,
//! print the completion and the shape of its routing.
//!
//! ```sh
//! cargo run --example embed -- [CHECKPOINT_DIR] [PROMPT]
//! ```

use futures_util::StreamExt;
use routed::types::SamplingParams;
use routed::{Engine, EngineConfig, GenerateRequest, ModelSource, RequestEvent};
use std::path::PathBuf;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let mut args = std::env::args().skip(1);
    let dir = args
        .next()
        .map_or_else(|| PathBuf::from("tests/golden/tiny_hybrid_default/model"), PathBuf::from);
    let prompt = args.next().unwrap_or_else(|| "The router picks".to_owned());

    let mut config = EngineConfig::new(ModelSource::Dir(dir));
    config.num_kv_blocks = Some(256);
    let engine = Engine::start(config)?;
    let prompt_ids = engine.tokenizer().encode(&prompt)?;
    let request = GenerateRequest::new(
        prompt_ids,
        SamplingParams { ignore_eos: true, ..SamplingParams::greedy(16) },
    );

    let mut events = engine.submit(request).await?;
    while let Some(event) = events.next().await {
        match event {
            RequestEvent::Token(_) => {}
            RequestEvent::Finished(out) => {
                println!("completion: {:?}", out.text);
                println!("finish reason: {:?}", out.finish_reason);
                match &out.routing {
                    Some(rows) => println!("routed_experts shape: {:?}", rows.shape()),
                    None => println!("no routing returned"),
                }
            }
            RequestEvent::Error(e) => anyhow::bail!("request failed: {e}"),
        }
    }
    engine.shutdown().await;
    Ok(())
}
