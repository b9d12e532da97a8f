//! The embedding API's data: how an engine is configured, what a request asks for, and the
//! events a request's stream yields.

use crate::WeightVersionSpan;
use routed_backend::DeviceSpec;
use routed_backend::cpu::MatmulPrecision;
use routed_types::{FinishReason, RoutingMeta, RoutingRows, SamplingParams, TokenId};
use std::path::PathBuf;
use std::sync::Arc;

/// Where the model comes from.
#[derive(Clone, Debug)]
pub enum ModelSource {
    /// A Hugging Face checkpoint directory.
    Dir(PathBuf),
    /// The tiny hybrid compiled into the binary (see `routed::embedded`), unpacked to this
    /// directory by the caller.
    Embedded(PathBuf),
}

impl ModelSource {
    /// The checkpoint directory.
    pub fn dir(&self) -> &std::path::Path {
        match self {
            Self::Dir(d) | Self::Embedded(d) => d,
        }
    }
}

/// Everything an engine is built from. Defaults follow `routed serve`.
#[derive(Clone, Debug)]
pub struct EngineConfig {
    /// The checkpoint.
    pub model: ModelSource,
    /// Name reported in responses and `/v1/models`.
    pub served_model_name: String,
    /// Compute device.
    pub device: DeviceSpec,
    /// Tokens per KV block.
    pub block_size: usize,
    /// KV blocks; `None` sizes the pool from `kv_cache_memory_gb`.
    pub num_kv_blocks: Option<usize>,
    /// Memory for the KV cache when `num_kv_blocks` is not given.
    pub kv_cache_memory_gb: f64,
    /// Mamba snapshot slots (hybrid models).
    pub mamba_snapshot_slots: usize,
    /// Cap on host bytes of routing rows; `None` holds rows for every KV block.
    pub routing_cache_max_bytes: Option<usize>,
    /// Keep finished blocks matchable for prefix hits.
    pub enable_prefix_caching: bool,
    /// Record and return routing rows.
    pub enable_routing_capture: bool,
    /// Most tokens computed in one step.
    pub max_num_batched_tokens: usize,
    /// Most requests running at once.
    pub max_num_seqs: usize,
    /// Most requests waiting; beyond it `submit` fails with [`EngineError::Overloaded`].
    pub max_waiting_requests: usize,
    /// Longest prompt + output; `None` is the model's `max_position_embeddings`.
    pub max_model_len: Option<usize>,
    /// Idle heartbeat period; 0 turns it off.
    pub heartbeat_ms: u64,
    /// Threads for the CPU kernels, split evenly among the ranks; `None` uses every core.
    pub threads: Option<usize>,
    /// Ranks (model runners) in the expert-parallel group: each holds `1 / n` of every MoE
    /// layer's experts. Results are bitwise identical for every size; it must divide the number
    /// of experts.
    pub expert_parallel_size: usize,
    /// Arithmetic of the CPU products with bf16 weights: exact `f32` (the default), or inputs
    /// rounded to bf16 for AVX-512 BF16 dot products (faster, still deterministic and batch
    /// invariant, within bf16 rounding of the `f32` results).
    pub matmul_precision: MatmulPrecision,
    /// Default sampling seed for requests that give none.
    pub seed: u64,
    /// On a CUDA device, decode steps replay a CUDA graph per padded batch size and block-table
    /// stride (captured on the first step of that kind); `false` launches every step eagerly.
    /// Both give the same bits.
    /// No effect on the CPU.
    pub cuda_graphs: bool,
    /// On a CUDA device, tokens are chosen (bias, penalties, min-p, top-k, top-p, seeded draws)
    /// and logprobs and prompt logprobs computed on the device; `false` copies every row's logits
    /// to the host and runs the CPU worker's sampler instead (slower: for checking the device's
    /// sampling against the host's on the same logits). No effect on the CPU.
    pub device_sampling: bool,
    /// Under expert parallelism on GPUs that can read each other's memory (peer access between
    /// every pair), the ranks' kernels copy each other's expert rows directly; `false` sends
    /// them through host memory, as on GPUs without peer access. Both give the same bits.
    pub peer_exchange: bool,
    /// The version the loaded weights are known by (reported with every output) until a weight
    /// update names another.
    pub weight_version: String,
}

impl EngineConfig {
    /// The defaults of `routed serve` for the checkpoint in `dir`.
    pub fn new(model: ModelSource) -> Self {
        let served_model_name =
            model.dir().file_name().map_or("model".into(), |n| n.to_string_lossy().into_owned());
        Self {
            model,
            served_model_name,
            device: DeviceSpec::Cpu,
            block_size: 16,
            num_kv_blocks: None,
            kv_cache_memory_gb: 2.0,
            mamba_snapshot_slots: 64,
            routing_cache_max_bytes: None,
            enable_prefix_caching: true,
            enable_routing_capture: true,
            max_num_batched_tokens: 2048,
            max_num_seqs: 128,
            max_waiting_requests: 1024,
            max_model_len: None,
            heartbeat_ms: 100,
            threads: None,
            expert_parallel_size: 1,
            matmul_precision: MatmulPrecision::F32,
            seed: 0,
            cuda_graphs: true,
            device_sampling: true,
            peer_exchange: true,
            weight_version: "default".into(),
        }
    }
}

/// One generation request: a prompt in token ids and how to sample `n` continuations of it.
#[derive(Clone, Debug)]
pub struct GenerateRequest {
    /// The prompt.
    pub prompt_token_ids: Vec<TokenId>,
    /// Sampling and stop parameters. With `n > 1`, continuation `i` uses seed `seed + i`.
    pub sampling: SamplingParams,
    /// Continuations to sample; the prompt's blocks are computed once and shared.
    pub n: usize,
    /// Return routing rows with the final output.
    pub return_routing: bool,
    /// Drop this many leading routing rows (`0 <= start <= prompt length`).
    pub routing_start: usize,
    /// Only requests with the same salt share cached prefix blocks.
    pub cache_salt: Option<String>,
}

impl GenerateRequest {
    /// A request for one continuation of `prompt_token_ids`.
    pub fn new(prompt_token_ids: Vec<TokenId>, sampling: SamplingParams) -> Self {
        Self {
            prompt_token_ids,
            sampling,
            n: 1,
            return_routing: true,
            routing_start: 0,
            cache_salt: None,
        }
    }
}

/// One sampled token of continuation `index`.
#[derive(Clone, Debug, PartialEq)]
pub struct TokenEvent {
    /// Which of the request's `n` continuations.
    pub index: usize,
    /// The token.
    pub token: TokenId,
    /// Its logprob under the raw model distribution.
    pub logprob: f32,
    /// Top alternatives, when the request asked for logprobs.
    pub top_logprobs: Vec<(TokenId, f32)>,
    /// The logprobs of the tokens the request names (`logprob_token_ids`), in its order, when
    /// it asked for logprobs.
    pub token_id_logprobs: Vec<f32>,
    /// The version of the weights served when it was sampled.
    pub weight_version: Arc<str>,
}

/// The end of continuation `index`.
#[derive(Clone, Debug, PartialEq)]
pub struct FinalOutput {
    /// Which of the request's `n` continuations.
    pub index: usize,
    /// Every generated token (a stop token included, a stop string's tokens included).
    pub token_ids: Vec<TokenId>,
    /// Decoded text of the generated tokens (special tokens kept or not, as the request asks),
    /// cut before a matched stop string and without the stop token or EOS that ended it (unless
    /// the request keeps its stop: `include_stop_str_in_output`).
    pub text: String,
    /// Why it ended.
    pub finish_reason: FinishReason,
    /// Prompt length.
    pub num_prompt_tokens: usize,
    /// Prompt tokens skipped thanks to the prefix cache (OpenAI `cached_tokens`).
    pub num_cached_tokens: usize,
    /// Routing rows `[start, prompt + generated - 1)`, when requested and captured. An aborted
    /// continuation returns the rows of the tokens it computed, `[start, computed)`; `None` when
    /// it holds none (aborted before any forward, or while preempted).
    pub routing: Option<RoutingRows>,
    /// When the request asked for prompt logprobs: entry `i` is prompt token `i + 1`'s logprob
    /// given the tokens before it, with the top alternatives asked for.
    pub prompt_logprobs: Option<Vec<routed_types::SampledToken>>,
    /// The version of the weights that sampled its last token, or of the weights served when it
    /// ended if it sampled none: `weight_versions`' last.
    pub weight_version: String,
    /// Which weights sampled each generated token: contiguous spans over `token_ids`, never
    /// empty. One span unless the continuation outlived a version: paused across a weight update
    /// (its tokens after the update come from the new weights) or renamed while in flight.
    pub weight_versions: Vec<WeightVersionSpan>,
}

/// New weights for the served model from a checkpoint directory (an RL trainer's latest policy).
/// The engine stops admitting requests, lets the ones in flight finish (or aborts them), loads the
/// checkpoint on every rank beside the weights in use, swaps them in on every rank or, if any
/// rank refuses, on none, drops its prefix cache (blocks, snapshots and routing rows computed by
/// the old weights), then admits the requests that arrived meanwhile.
#[derive(Clone, Debug)]
pub struct WeightUpdate {
    /// The checkpoint: the served model's configuration (the tokenizer stays).
    pub dir: PathBuf,
    /// End the requests in flight at once (`finish_reason: abort`, with the tokens and routing
    /// rows they computed) instead of waiting for them.
    pub abort_all_requests: bool,
    /// The version the new weights are known by; `None` keeps the current one.
    pub weight_version: Option<String>,
}

/// The weights an engine serves.
#[derive(Clone, Debug, PartialEq)]
pub struct WeightsInfo {
    /// The checkpoint they were loaded from.
    pub dir: PathBuf,
    /// Their version.
    pub version: String,
    /// Weight updates since the engine started.
    pub num_updates: u64,
}

/// What a weight update did.
#[derive(Clone, Debug)]
pub struct WeightsUpdated {
    /// The weights now served.
    pub weights: WeightsInfo,
    /// Requests submitted while the update waited and loaded: held, then run on the new weights.
    pub num_held_requests: usize,
    /// Requests ended by `abort_all_requests`.
    pub num_aborted_requests: usize,
    /// From the update's arrival to the new weights serving.
    pub seconds: f64,
}

/// What pausing generation does with the requests in flight (SGLang's `/pause_generation` modes,
/// and vLLM's `wait`). Whatever the mode, requests submitted while paused are held, then admitted
/// by [`EngineHandle::continue_generation`](crate::EngineHandle::continue_generation).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PauseMode {
    /// End them at once (`finish_reason: abort`, with the tokens and routing rows they computed).
    Abort,
    /// Stop computing them and release their KV blocks and state slots; they keep their tokens
    /// and resume on continue, recomputing what the prefix cache no longer holds.
    Retract,
    /// Stop computing them where they are; they keep their blocks and resume on continue.
    InPlace,
    /// Let them run to their end; the pause holds once they all ended.
    Wait,
}

impl PauseMode {
    /// The mode's name on the wire: `abort`, `retract`, `in_place` or `wait`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Abort => "abort",
            Self::Retract => "retract",
            Self::InPlace => "in_place",
            Self::Wait => "wait",
        }
    }
}

/// What a pause did, once it took hold (no step in flight; with [`PauseMode::Abort`] or
/// [`PauseMode::Wait`], every request in flight ended).
#[derive(Clone, Debug, PartialEq)]
pub struct Paused {
    /// The mode now in force.
    pub mode: PauseMode,
    /// Requests in flight when it was asked for, that it aborted, retracted, left in place or
    /// waited for.
    pub num_requests: usize,
}

/// Whether the engine admits the requests submitted to it.
#[derive(Clone, Debug, PartialEq)]
pub struct Admission {
    /// Generation is paused, in this mode.
    pub paused: Option<PauseMode>,
    /// Weight updates queued or loading.
    pub num_updates_pending: usize,
    /// Requests held until generation continues and the updates are done.
    pub num_held_requests: usize,
    /// Memory given back: while the weights or the KV cache are, requests wait for them.
    pub memory_released: MemoryTags,
}

impl Admission {
    /// Whether new requests run as they come.
    pub fn is_open(&self) -> bool {
        self.paused.is_none()
            && self.num_updates_pending == 0
            && !self.memory_released.stops_steps()
    }
}

/// Memory an engine gives back between rollout steps, so that a trainer on the same device can
/// use it, and takes again before generating (SGLang's `release_memory_occupation` tags, vLLM's
/// sleep levels and wake-up tags).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct MemoryTags {
    /// The weights. Taken again, they are loaded from the checkpoint served.
    pub weights: bool,
    /// The KV blocks and Mamba states (on a GPU, every pool beside the weights: activations,
    /// step inputs, decode graphs). The prefix cache is dropped.
    pub kv_cache: bool,
    /// The captured decode graphs; the next decode steps capture them again (so they never stay
    /// released).
    pub cuda_graph: bool,
}

impl MemoryTags {
    /// Every tag: what SGLang releases when no tag is named.
    pub const ALL: Self = Self { weights: true, kv_cache: true, cuda_graph: true };

    /// The tag named `name` on the wire (`weights`, `kv_cache`, `cuda_graph`).
    pub fn from_name(name: &str) -> Option<Self> {
        let none = Self::default();
        match name {
            "weights" => Some(Self { weights: true, ..none }),
            "kv_cache" => Some(Self { kv_cache: true, ..none }),
            "cuda_graph" => Some(Self { cuda_graph: true, ..none }),
            _ => None,
        }
    }

    /// The tags' names, in a fixed order.
    pub fn names(self) -> Vec<&'static str> {
        let all = [(self.weights, "weights"), (self.kv_cache, "kv_cache")];
        let all = all.into_iter().chain([(self.cuda_graph, "cuda_graph")]);
        all.filter(|&(on, _)| on).map(|(_, name)| name).collect()
    }

    /// The tags in either.
    pub fn union(self, other: Self) -> Self {
        Self {
            weights: self.weights || other.weights,
            kv_cache: self.kv_cache || other.kv_cache,
            cuda_graph: self.cuda_graph || other.cuda_graph,
        }
    }

    /// The tags of `self` not in `other`.
    pub fn minus(self, other: Self) -> Self {
        Self {
            weights: self.weights && !other.weights,
            kv_cache: self.kv_cache && !other.kv_cache,
            cuda_graph: self.cuda_graph && !other.cuda_graph,
        }
    }

    /// The tags in both.
    pub fn intersection(self, other: Self) -> Self {
        self.minus(self.minus(other))
    }

    /// Whether no tag is set.
    pub fn is_empty(self) -> bool {
        self == Self::default()
    }

    /// Whether steps cannot run while these are released: the weights or the KV cache are
    /// (without graphs, decode steps run eagerly).
    pub fn stops_steps(self) -> bool {
        self.weights || self.kv_cache
    }
}

/// What releasing or resuming memory did.
#[derive(Clone, Debug, PartialEq)]
pub struct MemoryChange {
    /// What is released now.
    pub released: MemoryTags,
    /// Bytes given back (a release) or taken again (a resume), every rank's together.
    pub num_bytes: usize,
}

/// What a request's stream yields: tokens as they are sampled, then one final output per
/// continuation (or an error that ends the whole request).
#[derive(Clone, Debug, PartialEq)]
pub enum RequestEvent {
    /// A sampled token.
    Token(TokenEvent),
    /// A continuation ended.
    Finished(Box<FinalOutput>),
    /// The request failed; no further events follow.
    Error(EngineError),
}

/// Errors the engine reports to a caller.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum EngineError {
    /// The waiting queue is full.
    #[error("the engine is overloaded: {0} requests are already waiting")]
    Overloaded(usize),
    /// The request is malformed; `param` names the field.
    #[error("invalid request: {message}")]
    InvalidRequest {
        /// The offending field, as the API names it.
        param: &'static str,
        /// What is wrong with it.
        message: String,
    },
    /// The engine is shutting down or its actors are gone.
    #[error("the engine is shut down")]
    ShutDown,
    /// The engine cannot serve (a runner failed and could not be restarted).
    #[error("the engine is unhealthy: {0}")]
    Unhealthy(String),
    /// The model could not be loaded or the engine could not be built.
    #[error("cannot start the engine: {0}")]
    Load(String),
    /// A device the configuration names cannot be opened; `kind` says why, for callers that
    /// fall back to another device or skip.
    #[error("cannot start the engine: {message}")]
    DeviceUnavailable {
        /// Why the device cannot be opened.
        kind: MissingDevice,
        /// The backend's message, naming the rank in an expert-parallel group.
        message: String,
    },
    /// The request failed inside the engine (a runner error, missing routing rows...).
    #[error("internal error: {0}")]
    Internal(String),
    /// The engine cannot do that in its present state (release memory while requests run,
    /// update weights that are released); the message says what to do first.
    #[error("{0}")]
    Conflict(String),
}

/// Why a configured device cannot be opened ([`EngineError::DeviceUnavailable`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MissingDevice {
    /// This build has no CUDA support (the `cuda` feature).
    NotCompiled,
    /// No CUDA driver on this machine.
    NoDriver,
    /// Fewer GPUs than the device ordinal (or the expert-parallel group) asks for.
    TooFewDevices,
}

impl EngineError {
    /// The engine's error for a device that would not open: [`EngineError::DeviceUnavailable`]
    /// where the backend says it is missing, else a load error; `message` as the caller words it.
    pub(crate) fn device(e: &routed_backend::BackendError, message: String) -> Self {
        use routed_backend::BackendError as B;
        let kind = match e {
            B::CudaNotCompiled => MissingDevice::NotCompiled,
            B::NoCudaDriver => MissingDevice::NoDriver,
            B::NoSuchDevice { .. } => MissingDevice::TooFewDevices,
            _ => return Self::Load(message),
        };
        Self::DeviceUnavailable { kind, message }
    }
}

/// An admission the scheduling policy refused: a full waiting queue is the caller's to retry,
/// anything else is the engine's fault.
impl From<routed_scheduler::SchedulerError> for EngineError {
    fn from(e: routed_scheduler::SchedulerError) -> Self {
        match e {
            routed_scheduler::SchedulerError::Overloaded(n) => Self::Overloaded(n),
            other => Self::Internal(other.to_string()),
        }
    }
}

/// A snapshot of the engine's figures (the same as its metrics).
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize)]
pub struct EngineStats {
    /// Requests running.
    pub num_running: usize,
    /// Requests waiting.
    pub num_waiting: usize,
    /// Usable KV blocks.
    pub num_kv_blocks_total: usize,
    /// Blocks neither held nor cached.
    pub num_kv_blocks_free: usize,
    /// Live Mamba state slots held by sequences (hybrid models).
    pub num_live_states_held: usize,
    /// Blocks carrying a hash.
    pub num_kv_blocks_cached: usize,
    /// Cached blocks no request holds.
    pub num_kv_blocks_evictable: usize,
    /// Snapshot slots in the pool.
    pub num_snapshot_slots_total: usize,
    /// Snapshot slots holding a published snapshot.
    pub num_snapshot_slots_used: usize,
    /// Prompt tokens computed.
    pub num_prefill_tokens_computed: u64,
    /// Prompt tokens skipped thanks to the prefix cache.
    pub num_prefill_tokens_skipped: u64,
    /// Admissions that skipped at least one token.
    pub num_prefix_cache_hits: u64,
    /// Deferred admissions.
    pub num_deferrals: u64,
    /// Preemptions.
    pub num_preemptions: u64,
    /// Heartbeat dummy forwards executed.
    pub num_dummy_forwards: u64,
    /// Host bytes of routing rows.
    pub routing_bytes_held: usize,
    /// Engine steps executed.
    pub num_steps: u64,
    /// Wall time of all steps, from planning to applied output.
    pub step_seconds: f64,
    /// Time in the model forward and sampling (the worker's wall time, rank 0).
    pub forward_seconds: f64,
    /// Of that, the time on the device's clock between two events recorded around each step's
    /// work: its kernels and copies, and the gaps where it waited for the host to launch them
    /// (few when a decode step replays a graph); 0 on the CPU and the CUDA simulator.
    /// `forward_seconds - device_seconds` is the worker's host time before and after (packing,
    /// waiting for the results, what the host samples), `step_seconds - forward_seconds` the
    /// engine's around the worker.
    pub device_seconds: f64,
    /// Time the runner spent handing routing off (queueing the copy, slot mapping, message).
    pub routing_capture_seconds: f64,
    /// Time the copy worker spent copying routing to host memory.
    pub routing_copy_seconds: f64,
    /// Time rank 0's runner waited for a free routing slot (every slot in flight): the copy
    /// worker falling behind the steps.
    pub routing_slot_wait_seconds: f64,
    /// Time the routing host-cache spent storing rows.
    pub routing_store_seconds: f64,
    /// Expert parallelism: time the ranks spent waiting for each other at barriers, summed over
    /// ranks.
    pub collective_wait_seconds: f64,
    /// Expert parallelism: time the ranks spent copying expert outputs to and from each other
    /// through host memory, summed over ranks (none where GPUs copy them between each other).
    pub collective_exchange_seconds: f64,
    /// Weight updates applied.
    pub num_weight_updates: u64,
}

impl EngineStats {
    /// Copies the cache manager's figures in.
    pub fn apply_cache(&mut self, c: &routed_cache::CacheStats) {
        self.num_kv_blocks_total = c.num_blocks_total;
        self.num_kv_blocks_free = c.num_blocks_free;
        self.num_kv_blocks_cached = c.num_blocks_cached;
        self.num_kv_blocks_evictable = c.num_blocks_evictable;
        self.num_snapshot_slots_total = c.num_snapshot_slots_total;
        self.num_snapshot_slots_used = c.num_snapshot_slots_used;
        self.num_prefill_tokens_computed = c.num_prefill_tokens_computed;
        self.num_prefill_tokens_skipped = c.num_prefill_tokens_skipped;
        self.num_prefix_cache_hits = c.num_prefix_cache_hits;
        self.num_deferrals = c.num_deferrals;
        self.num_preemptions = c.num_preemptions;
    }
}

/// What a client needs to know about the served model.
#[derive(Clone, Debug)]
pub struct ModelInfo {
    /// Name in responses.
    pub served_model_name: String,
    /// The checkpoint the engine started from; its tokenizer serves whatever weights replace
    /// its own.
    pub checkpoint_dir: PathBuf,
    /// Longest prompt + output.
    pub max_model_len: usize,
    /// Vocabulary size; token ids must be below it.
    pub vocab_size: usize,
    /// Routing layout, for MoE models.
    pub routing: Option<RoutingMeta>,
    /// Whether routing capture is on.
    pub routing_capture: bool,
    /// KV blocks in the pool.
    pub num_kv_blocks: usize,
    /// The pool was cut down to the blocks whose routing rows `--routing-cache-max-bytes` holds.
    pub kv_pool_sized_by_routing_cap: bool,
    /// Tokens per KV block.
    pub block_size: usize,
    /// Snapshot slots (hybrid models).
    pub num_snapshot_slots: usize,
    /// Most sequences (a request counts its `n`) the waiting queue holds; more can never be
    /// admitted at once.
    pub max_waiting_requests: usize,
    /// Most sequences running at once.
    pub max_num_seqs: usize,
    /// Most tokens computed in one step (the prefill chunk).
    pub max_num_batched_tokens: usize,
    /// Whether finished blocks stay matchable for prefix hits.
    pub prefix_caching: bool,
    /// The device, in words.
    pub device: String,
    /// Ranks in the expert-parallel group.
    pub expert_parallel_size: usize,
    /// Seed for requests that don't give one (`--seed`).
    pub default_seed: u64,
    /// Bytes of weights one decoded token reads (see `Model::weight_bytes_per_token`).
    pub weight_bytes_per_token: usize,
}
