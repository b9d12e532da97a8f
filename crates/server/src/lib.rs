//! The OpenAI-compatible HTTP gateway of `routed`.
//!
//! Routes (see `docs/api.md` for every field):
//!
//! | route | what |
//! | --- | --- |
//! | `POST /v1/completions` | text or token prompts, batches, `n`, streaming, logprobs |
//! | `POST /v1/chat/completions` | messages through the checkpoint's chat template |
//! | `POST /generate` | token-in, SGLang-shaped |
//! | `POST /tokenize`, `POST /detokenize` | the tokenizer and chat template, as vLLM serves them |
//! | `GET /v1/models` | the served model, its `max_model_len` and routing layout |
//! | `GET /health` | 200, or 503 with the reason |
//! | `GET /metrics` | Prometheus text |
//! | `POST /reset_prefix_cache` | drop every cached block no request holds |
//!
//! Both OpenAI routes return routing replay: `choices[i].routed_experts` (base64 `.npy` by
//! default, `[rows, num_hidden_layers, top_k]` indexed by decoder layer as vLLM and SGLang return
//! it) and a response-level `routed_experts_meta`; SGLang's clients find the same rows in
//! `sglext.routed_experts`.
//!
//! Only this crate knows HTTP and JSON wire shapes. It holds no engine state of its own beyond
//! the [`Registry`] of in-flight requests, which is how a client that disconnects gets its
//! request aborted.
//!
//! ```no_run
//! # async fn run() -> std::io::Result<()> {
//! use routed_runtime::{Engine, EngineConfig, ModelSource};
//! routed_server::install_metrics_recorder().ok();
//! let config = EngineConfig::new(ModelSource::Dir("model".into()));
//! let handle = Engine::start(config).expect("engine");
//! let listener = routed_server::ServerConfig::default().bind()?;
//! routed_server::serve(handle, listener).await
//! # }
//! ```

#![warn(missing_docs)]

mod detok;
mod error;
mod generate;
mod metrics;
mod response;
mod routes;
mod routing_wire;
mod run;
mod stream;
mod tokenize;
mod validate;
mod wire;

use std::hash::{BuildHasher, RandomState};
use std::net::{SocketAddr, TcpListener};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use actix_web::dev::Server;
use actix_web::{App, HttpServer, web};
use routed_model::Tokenizer;
use routed_runtime::{EngineHandle, ModelInfo};

pub use error::{ApiError, ErrorBody, ErrorDetail, json_config, not_found};
pub use metrics::install_metrics_recorder;
pub use routing_wire::{NON_MOE_FILL, RoutingFormat, RoutingLayers, RoutingRequest};
pub use run::{InFlight, Registry};

/// What the gateway shares between its handlers: the engine handle and the in-flight registry.
pub struct AppState {
    handle: EngineHandle,
    registry: Arc<Registry>,
    started_at: u64,
    id_salt: u64,
    next_id: AtomicU64,
}

impl AppState {
    /// State for a gateway in front of `handle`.
    pub fn new(handle: EngineHandle) -> Self {
        Self {
            handle,
            registry: Arc::new(Registry::default()),
            started_at: unix_now(),
            id_salt: RandomState::new().hash_one(SystemTime::now()),
            next_id: AtomicU64::new(0),
        }
    }

    /// The engine.
    pub fn handle(&self) -> &EngineHandle {
        &self.handle
    }

    /// Requests submitted through this gateway and not yet ended.
    pub fn registry(&self) -> &Arc<Registry> {
        &self.registry
    }

    /// The served model.
    pub fn info(&self) -> &ModelInfo {
        self.handle.model_info()
    }

    /// The model's tokenizer and chat template.
    pub fn tokenizer(&self) -> &Arc<Tokenizer> {
        self.handle.tokenizer()
    }

    /// Unix time the gateway was created (the model's `created`).
    pub fn started_at(&self) -> u64 {
        self.started_at
    }

    /// The seed of requests that give none.
    pub(crate) fn default_seed(&self) -> u64 {
        self.info().default_seed
    }

    /// A fresh response id such as `cmpl-5f0c...`.
    pub(crate) fn new_id(&self, prefix: &str) -> String {
        let n = self.next_id.fetch_add(1, Ordering::Relaxed);
        format!("{prefix}-{:016x}{n:08x}", self.id_salt)
    }
}

/// Seconds since the Unix epoch.
pub(crate) fn unix_now() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

/// Where the gateway listens.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServerConfig {
    /// Interface to bind (`127.0.0.1`).
    pub host: String,
    /// Port; 0 picks a free one.
    pub port: u16,
}

impl Default for ServerConfig {
    fn default() -> Self {
        Self { host: "127.0.0.1".into(), port: 8000 }
    }
}

impl ServerConfig {
    /// Binds the listening socket.
    pub fn bind(&self) -> std::io::Result<TcpListener> {
        TcpListener::bind((self.host.as_str(), self.port))
    }
}

/// Mounts every gateway route on `cfg`, sharing `state`. An embedding app adds its own routes
/// beside them, and should use [`not_found`] as its default service so unknown routes answer in
/// the OpenAI error shape.
///
/// For a client disconnect to abort a non-streamed request, the app's `HttpServer` must run with
/// `h1_allow_half_closed(false)`, as [`serve`] does; streamed requests are aborted either way.
pub fn configure(cfg: &mut web::ServiceConfig, state: web::Data<AppState>) {
    let post = |path: &str, handler| {
        web::resource(path)
            .app_data(json_config())
            .route(handler)
            .default_service(web::to(error::method_not_allowed))
    };
    let get = |path: &str, route| {
        web::resource(path).route(route).default_service(web::to(error::method_not_allowed))
    };
    cfg.app_data(state)
        .service(post("/v1/completions", web::post().to(routes::completions)))
        .service(post("/v1/chat/completions", web::post().to(routes::chat_completions)))
        .service(post("/generate", web::post().to(generate::generate)))
        .service(post("/tokenize", web::post().to(tokenize::tokenize)))
        .service(post("/detokenize", web::post().to(tokenize::detokenize)))
        .service(post("/reset_prefix_cache", web::post().to(routes::reset_prefix_cache)))
        .service(get("/v1/models", web::get().to(routes::models)))
        .service(get("/health", web::get().to(routes::health)))
        .service(get("/metrics", web::get().to(routes::metrics)));
}

/// A gateway bound to its socket, not yet running: await `server` to run it.
pub struct BoundServer {
    /// The address it listens on (the real port when bound to port 0).
    pub addr: SocketAddr,
    /// The server future; `server.handle()` stops it.
    pub server: Server,
    /// The shared state, to inspect the in-flight registry.
    pub state: web::Data<AppState>,
}

/// Builds the gateway on `listener` (one worker). Must be called inside an actix system (as in
/// `#[actix_web::main]`); the server starts when `server` is awaited or spawned.
pub fn bind_server(handle: EngineHandle, listener: TcpListener) -> std::io::Result<BoundServer> {
    if let Err(reason) = install_metrics_recorder() {
        tracing::warn!(%reason, "/metrics will be empty");
    }
    let addr = listener.local_addr()?;
    let state = web::Data::new(AppState::new(handle));
    let app_state = state.clone();
    let server = HttpServer::new(move || {
        App::new()
            .configure(|cfg| configure(cfg, app_state.clone()))
            .default_service(web::to(not_found))
    })
    .workers(1)
    .h1_allow_half_closed(false)
    .shutdown_timeout(5)
    .client_request_timeout(Duration::from_secs(60))
    .listen(listener)?
    .run();
    Ok(BoundServer { addr, server, state })
}

/// Serves the gateway on `listener` until the process is signalled (SIGINT/SIGTERM), then
/// aborts what is still in flight and shuts the engine down.
pub async fn serve(handle: EngineHandle, listener: TcpListener) -> std::io::Result<()> {
    let bound = bind_server(handle, listener)?;
    tracing::info!(addr = %bound.addr, "routed gateway listening");
    let result = bound.server.await;
    bound.state.registry().abort_all(bound.state.handle());
    bound.state.handle().shutdown().await;
    result
}
