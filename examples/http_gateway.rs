//! Embedding the routed gateway in an actix-web app of your own.
//!
//! Starts an engine on a checkpoint directory (first argument, default the tiny hybrid golden
//! checkpoint), mounts every gateway route with `routed_server::configure`, and adds one route
//! of its own, `GET /engine/stats`, that returns the engine's figures as JSON.
//!
//! ```text
//! cargo run --example http_gateway -- tests/golden/tiny_hybrid_default/model
//! curl -s localhost:8000/v1/completions -d '{"prompt": "Hello", "max_tokens": 8}'
//! curl -s localhost:8000/engine/stats
//! ```
//!
//! `ROUTED_ADDR` changes the address (default `127.0.0.1:8000`).

use std::io;

use actix_web::{App, HttpResponse, HttpServer, web};
use routed::{Engine, EngineConfig, ModelSource};
use routed_server::{ApiError, AppState, configure, install_metrics_recorder, not_found};

/// `GET /engine/stats`: the engine's counters and gauges.
async fn engine_stats(state: web::Data<AppState>) -> Result<HttpResponse, ApiError> {
    let stats = state.handle().stats().await?;
    Ok(HttpResponse::Ok().json(stats))
}

#[actix_web::main]
async fn main() -> io::Result<()> {
    let dir = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "tests/golden/tiny_hybrid_default/model".to_owned());
    let addr = std::env::var("ROUTED_ADDR").unwrap_or_else(|_| "127.0.0.1:8000".to_owned());
    // Before the engine starts, so none of its metrics are lost.
    install_metrics_recorder().map_err(io::Error::other)?;
    let handle =
        Engine::start(EngineConfig::new(ModelSource::Dir(dir.into()))).map_err(io::Error::other)?;
    let state = web::Data::new(AppState::new(handle.clone()));
    println!("serving {} on http://{addr}", handle.model_info().served_model_name);
    HttpServer::new(move || {
        App::new()
            .configure(|cfg| configure(cfg, state.clone()))
            .route("/engine/stats", web::get().to(engine_stats))
            .default_service(web::to(not_found))
    })
    .workers(1)
    // A client that disconnects mid-request then aborts it.
    .h1_allow_half_closed(false)
    .bind(&addr)?
    .run()
    .await?;
    handle.shutdown().await;
    Ok(())
}
