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
//! | `POST /update_weights_from_disk`, `GET /get_weight_version`, `GET /get_model_info`, `POST /update_weight_version` | weight updates, as SGLang serves them |
//! | `POST /abort_request`, `POST /pause_generation`, `POST /continue_generation`, `GET\|POST /flush_cache`, `GET /health_generate` | SGLang's controls between rollout steps |
//! | `POST /pause`, `POST /resume`, `GET /is_paused` | vLLM's RLHF pause routes |
//! | `GET\|POST /release_memory_occupation`, `GET\|POST /resume_memory_occupation`; `POST /sleep`, `POST /wake_up`, `GET /is_sleeping` | memory given back to a colocated trainer, as SGLang and vLLM serve it |
//! | `GET /v1/routing/stats`, `POST /v1/routing/stats/reset` | tokens per expert per MoE layer |
//! | `GET /server_info` (or `/get_server_info`), `GET /get_load` | settings and load, as SGLang reports them |
//! | `GET /version` | routed's version, as vLLM answers it |
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

mod body;
mod control;
mod detok;
mod drain;
mod error;
mod generate;
mod info;
mod memory;
mod metrics;
mod reasoning;
mod response;
mod routes;
mod routing_stats;
mod routing_wire;
mod run;
mod serve;
mod stream;
mod tokenize;
mod tools;
mod validate;
mod weights;
mod wire;

use std::hash::{BuildHasher, RandomState};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use routed_model::Tokenizer;
use routed_runtime::{EngineHandle, ModelInfo};

pub use error::{ApiError, ErrorBody, ErrorDetail, json_config, not_found};
pub use metrics::install_metrics_recorder;
pub use reasoning::ReasoningParser;
pub use routing_wire::{NON_MOE_FILL, RoutingFormat, RoutingLayers, RoutingRequest};
pub use run::{InFlight, Registry};
pub use serve::{
    BoundServer, ServerConfig, bind_server, bind_server_with, configure, serve, serve_until,
    serve_with,
};
pub use tools::ToolCallParser;

/// What the gateway shares between its handlers: the engine handle, the in-flight registry and
/// whether it is draining for a shutdown.
pub struct AppState {
    handle: EngineHandle,
    registry: Arc<Registry>,
    started_at: u64,
    id_salt: u64,
    next_id: AtomicU64,
    body_read_timeout: Duration,
    draining: AtomicBool,
    tool_call_parser: Option<ToolCallParser>,
    reasoning_parser: Option<ReasoningParser>,
}

impl AppState {
    /// State for a gateway in front of `handle`, with the default settings of [`ServerConfig`].
    pub fn new(handle: EngineHandle) -> Self {
        Self::with_config(handle, &ServerConfig::default())
    }

    /// State for a gateway in front of `handle` with `config`'s request settings.
    pub fn with_config(handle: EngineHandle, config: &ServerConfig) -> Self {
        Self {
            handle,
            registry: Arc::new(Registry::default()),
            started_at: unix_now(),
            id_salt: RandomState::new().hash_one(SystemTime::now()),
            next_id: AtomicU64::new(0),
            body_read_timeout: config.body_read_timeout,
            draining: AtomicBool::new(false),
            tool_call_parser: config.tool_call_parser,
            reasoning_parser: config.reasoning_parser,
        }
    }

    /// Whether a shutdown is draining the gateway: new requests are refused with 503.
    pub fn is_draining(&self) -> bool {
        self.draining.load(Ordering::Relaxed)
    }

    /// Stops admitting new requests (see [`serve_until`]).
    pub(crate) fn start_draining(&self) {
        self.draining.store(true, Ordering::Relaxed);
    }

    /// How long a request body may take to arrive.
    pub(crate) fn body_read_timeout(&self) -> Duration {
        self.body_read_timeout
    }

    /// How tool calls are read when a chat lets the model call its tools (`None`: such chats
    /// are refused).
    pub(crate) fn tool_call_parser(&self) -> Option<ToolCallParser> {
        self.tool_call_parser
    }

    /// How a chat answer's reasoning is split off its content, if at all.
    pub(crate) fn reasoning_parser(&self) -> Option<ReasoningParser> {
        self.reasoning_parser
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
