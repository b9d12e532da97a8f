//! The actors of `routed` and the embedding API.
//!
//! Each component is its own actor owning its state; they exchange typed messages, each defined
//! beside the actor that receives it and documented with its sender, reply and what happens when a
//! peer is gone. See `docs/actors.md` for the whole picture.
//!
//! | actor | owns |
//! | --- | --- |
//! | [`scheduler`] | request lifecycle, token streams, stop conditions |
//! | [`cache_manager`] | `routed_cache::KvCacheManager` (one round trip per step) |
//! | [`routing_cache`] | `routed_routing::RoutingStore` |
//! | [`executor`] | the runners of every rank; sends each step and dummy forward to all in lockstep |
//! | [`runner`] | one rank's [`Worker`](worker::Worker) (dedicated OS thread) |
//! | [`copy_worker`] | the device-to-host copy of each step's routing (dedicated OS thread), over the slots of a [`routing_ring`] |
//! | [`heartbeat`] | the idle timer that asks for dummy forwards |
//!
//! [`Engine::start`] wires them in an actix system on its own thread and returns an
//! [`EngineHandle`], which is `Send + Clone` and works from any tokio runtime.

mod api;
pub mod cache_manager;
pub mod copy_worker;
mod engine;
pub mod executor;
mod handle;
pub mod heartbeat;
pub mod metrics;
pub mod outbox;
pub mod routing_cache;
pub mod routing_ring;
pub mod runner;
pub mod scheduler;
pub mod timings;
mod validate;
mod weight_versions;
pub mod worker;

pub use api::{
    Admission, EngineConfig, EngineError, EngineStats, FinalOutput, GenerateRequest, MemoryChange,
    MemoryTags, MissingDevice, ModelInfo, ModelSource, PauseMode, Paused, RequestEvent, TokenEvent,
    WeightUpdate, WeightsInfo, WeightsUpdated,
};
pub use engine::Engine;
pub use handle::{EngineHandle, RequestStream};
pub use routed_backend::cpu::MatmulPrecision;
pub use routing_cache::ExpertLoads;
pub use validate::{MAX_N, validate};
pub use weight_versions::{WeightVersionSpan, WeightVersions};
