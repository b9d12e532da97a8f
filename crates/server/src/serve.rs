//! Running the gateway: its settings, mounting its routes, binding, and serving until a shutdown
//! signal, then draining (see `drain.rs`).

use std::io;
use std::net::{SocketAddr, TcpListener};
use std::time::Duration;

use actix_web::dev::Server;
use actix_web::middleware::from_fn;
use actix_web::{App, HttpServer, Resource, Route, web};
use futures_util::stream::{Stream, StreamExt};
use routed_runtime::EngineHandle;

use crate::body::DEFAULT_BODY_READ_TIMEOUT;
use crate::drain::{DEFAULT_SHUTDOWN_GRACE, drain, refuse_when_draining};
use crate::error::{self, not_found};
use crate::reasoning::ReasoningParser;
use crate::tools::ToolCallParser;
use crate::{
    AppState, control, generate, info, install_metrics_recorder, memory, routes, routing_stats,
    tokenize, weights,
};

/// How long a client gets to send a request's headers (actix-web's own timeout).
const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(60);

/// How long the HTTP server waits for its connections to close once the drain is over.
const STOP_TIMEOUT_S: u64 = 5;

/// Where and how the gateway serves.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServerConfig {
    /// Interface to bind (`127.0.0.1`).
    pub host: String,
    /// Port; 0 picks a free one.
    pub port: u16,
    /// HTTP worker threads, each with its own event loop (default: the CPU count, 2 to 8).
    /// Parsing and tokenizing run on a blocking pool, not on these.
    pub workers: usize,
    /// How long a request's body may take to arrive once its headers have (default 60 s, as
    /// for the headers); a body that stalls is answered 408 and its connection closed.
    pub body_read_timeout: Duration,
    /// On SIGTERM or SIGINT, how long the requests in flight get to finish before they are
    /// ended with a 503 `shutting_down` (default 30 s).
    pub shutdown_grace: Duration,
    /// How the model's tool calls are read when a chat lets it call its tools on its own
    /// (`tool_choice: "auto"`); `None` refuses such chats, as vLLM does without
    /// `--enable-auto-tool-choice` and `--tool-call-parser`.
    pub tool_call_parser: Option<ToolCallParser>,
    /// How a chat answer's reasoning (`<think>...</think>`) is split off its content into
    /// `reasoning_content` (vLLM's `--reasoning-parser`); `None` leaves the text whole.
    pub reasoning_parser: Option<ReasoningParser>,
}

impl Default for ServerConfig {
    fn default() -> Self {
        let cores = std::thread::available_parallelism().map_or(2, usize::from);
        Self {
            host: "127.0.0.1".into(),
            port: 8000,
            workers: cores.clamp(2, 8),
            body_read_timeout: DEFAULT_BODY_READ_TIMEOUT,
            shutdown_grace: DEFAULT_SHUTDOWN_GRACE,
            tool_call_parser: None,
            reasoning_parser: None,
        }
    }
}

impl ServerConfig {
    /// Binds the listening socket.
    pub fn bind(&self) -> io::Result<TcpListener> {
        TcpListener::bind((self.host.as_str(), self.port))
    }
}

/// The resource at `path` with `routes` (one per method it answers), and a 405 in the OpenAI
/// error shape for any other method.
fn resource(path: &str, routes: impl IntoIterator<Item = Route>) -> Resource {
    let resource = routes.into_iter().fold(web::resource(path), Resource::route);
    resource.default_service(web::to(error::method_not_allowed))
}

/// Mounts every gateway route on `cfg`, sharing `state`. An embedding app adds its own routes
/// beside them, and should use [`not_found`] as its default service so unknown routes answer in
/// the OpenAI error shape.
///
/// For a client disconnect to abort a non-streamed request, the app's `HttpServer` must run with
/// `h1_allow_half_closed(false)`, as [`serve`] does; streamed requests are aborted either way.
pub fn configure(cfg: &mut web::ServiceConfig, state: web::Data<AppState>) {
    cfg.app_data(state)
        .service(resource("/v1/completions", [web::post().to(routes::completions)]))
        .service(resource("/v1/chat/completions", [web::post().to(routes::chat_completions)]))
        .service(resource("/generate", [web::post().to(generate::generate)]))
        .service(resource("/tokenize", [web::post().to(tokenize::tokenize)]))
        .service(resource("/detokenize", [web::post().to(tokenize::detokenize)]))
        .service(resource("/reset_prefix_cache", [web::post().to(routes::reset_prefix_cache)]))
        .service(resource(
            "/update_weights_from_disk",
            [web::post().to(weights::update_weights_from_disk)],
        ))
        .service(resource(
            "/update_weight_version",
            [web::post().to(control::update_weight_version)],
        ))
        .service(resource("/abort_request", [web::post().to(control::abort_request)]))
        .service(resource("/pause_generation", [web::post().to(control::pause_generation)]))
        .service(resource("/continue_generation", [web::post().to(control::continue_generation)]))
        .service(resource(
            "/flush_cache",
            [web::get().to(control::flush_cache), web::post().to(control::flush_cache)],
        ))
        .service(resource("/health_generate", [web::get().to(control::health_generate)]))
        .service(resource(
            "/release_memory_occupation",
            [
                web::get().to(memory::release_memory_occupation),
                web::post().to(memory::release_memory_occupation),
            ],
        ))
        .service(resource(
            "/resume_memory_occupation",
            [
                web::get().to(memory::resume_memory_occupation),
                web::post().to(memory::resume_memory_occupation),
            ],
        ))
        .service(resource("/sleep", [web::post().to(memory::sleep)]))
        .service(resource("/wake_up", [web::post().to(memory::wake_up)]))
        .service(resource("/is_sleeping", [web::get().to(memory::is_sleeping)]))
        .service(resource("/pause", [web::post().to(control::pause)]))
        .service(resource("/resume", [web::post().to(control::resume)]))
        .service(resource("/is_paused", [web::get().to(control::is_paused)]))
        .service(resource("/get_weight_version", [web::get().to(weights::get_weight_version)]))
        .service(resource("/get_model_info", [web::get().to(weights::get_model_info)]))
        .service(resource("/server_info", [web::get().to(info::server_info)]))
        .service(resource("/get_server_info", [web::get().to(info::server_info)]))
        .service(resource("/get_load", [web::get().to(info::get_load)]))
        .service(resource("/version", [web::get().to(info::version)]))
        .service(resource("/v1/routing/stats", [web::get().to(routing_stats::stats)]))
        .service(resource("/v1/routing/stats/reset", [web::post().to(routing_stats::reset)]))
        .service(resource("/v1/models", [web::get().to(routes::models)]))
        .service(resource("/health", [web::get().to(routes::health)]))
        .service(resource("/metrics", [web::get().to(routes::metrics)]));
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

/// Builds the gateway on `listener` with the default [`ServerConfig`] settings. Must be called
/// inside an actix system (as in `#[actix_web::main]`); the server starts when `server` is
/// awaited or spawned. It ignores signals: [`serve`] is what drains on them.
pub fn bind_server(handle: EngineHandle, listener: TcpListener) -> io::Result<BoundServer> {
    bind_server_with(handle, listener, &ServerConfig::default())
}

/// [`bind_server`] with `config`'s workers and timeouts (its host and port are the listener's).
pub fn bind_server_with(
    handle: EngineHandle,
    listener: TcpListener,
    config: &ServerConfig,
) -> io::Result<BoundServer> {
    if let Err(reason) = install_metrics_recorder() {
        tracing::warn!(%reason, "/metrics will be empty");
    }
    let addr = listener.local_addr()?;
    let state = web::Data::new(AppState::with_config(handle, config));
    let app_state = state.clone();
    let server = HttpServer::new(move || {
        App::new()
            .wrap(from_fn(refuse_when_draining))
            .configure(|cfg| configure(cfg, app_state.clone()))
            .default_service(web::to(not_found))
    })
    .workers(config.workers.max(1))
    .disable_signals()
    .h1_allow_half_closed(false)
    .shutdown_timeout(STOP_TIMEOUT_S)
    .client_request_timeout(HEADER_READ_TIMEOUT)
    .listen(listener)?
    .run();
    Ok(BoundServer { addr, server, state })
}

/// Serves the gateway on `listener` with the default [`ServerConfig`] settings until SIGTERM or
/// SIGINT, then drains (see [`serve_until`]).
pub async fn serve(handle: EngineHandle, listener: TcpListener) -> io::Result<()> {
    serve_with(handle, listener, &ServerConfig::default()).await
}

/// [`serve`] with `config`'s workers, timeouts and shutdown grace period.
pub async fn serve_with(
    handle: EngineHandle,
    listener: TcpListener,
    config: &ServerConfig,
) -> io::Result<()> {
    let signals = shutdown_signals()?;
    serve_until(handle, listener, config, signals).await
}

/// Serves the gateway on `listener` until `shutdown` yields (or ends), then drains: new requests
/// are answered 503 `shutting_down` while the listener keeps accepting, the requests in flight
/// get `config.shutdown_grace` to finish (a second item of `shutdown` cuts it short), whatever is
/// left is ended with a 503 (an error event then `[DONE]` on a stream), and then the server stops
/// and the engine shuts down. Returns once all of that is done. [`serve_with`] passes SIGTERM and
/// SIGINT as `shutdown`; a program of its own can pass any stream, a channel's receiver say.
pub async fn serve_until(
    handle: EngineHandle,
    listener: TcpListener,
    config: &ServerConfig,
    mut shutdown: impl Stream<Item = ()> + Unpin,
) -> io::Result<()> {
    let bound = bind_server_with(handle, listener, config)?;
    tracing::info!(addr = %bound.addr, workers = config.workers, "routed gateway listening");
    let stopper = bound.server.handle();
    let mut running = actix_web::rt::spawn(bound.server);
    tokio::select! {
        result = &mut running => return joined(result),
        _ = shutdown.next() => {}
    }
    drain(&bound.state, config.shutdown_grace, &mut shutdown).await;
    stopper.stop(true).await;
    let result = joined(running.await);
    bound.state.handle().shutdown().await;
    tracing::info!("routed gateway stopped");
    result
}

fn joined(result: Result<io::Result<()>, tokio::task::JoinError>) -> io::Result<()> {
    result.map_err(io::Error::other)?
}

/// SIGTERM and SIGINT, as a stream of shutdown requests.
#[cfg(unix)]
fn shutdown_signals() -> io::Result<impl Stream<Item = ()> + Unpin> {
    use futures_util::stream;
    use tokio::signal::unix::{Signal, SignalKind, signal};
    let each =
        |s: Signal| stream::unfold(s, |mut s| async move { s.recv().await.map(|()| ((), s)) });
    let term = each(signal(SignalKind::terminate())?);
    let int = each(signal(SignalKind::interrupt())?);
    Ok(stream::select(Box::pin(term), Box::pin(int)))
}

/// Ctrl-C, as a stream of shutdown requests.
#[cfg(not(unix))]
fn shutdown_signals() -> io::Result<impl Stream<Item = ()> + Unpin> {
    Ok(Box::pin(futures_util::stream::unfold((), |()| async {
        tokio::signal::ctrl_c().await.ok().map(|()| ((), ()))
    })))
}
