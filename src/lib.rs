//! `routed`: an inference engine for Mixture-of-Experts and hybrid Mamba2/attention/MoE language
//! models, whose headline is routing replay.
//!
//! This facade re-exports the workspace crates; see `docs/ARCHITECTURE.md` for the map.

pub use routed_backend as backend;
pub use routed_cache as cache;
pub use routed_model as model;
pub use routed_routing as routing;
pub use routed_runtime as runtime;
pub use routed_runtime::{
    Engine, EngineConfig, EngineHandle, GenerateRequest, ModelSource, RequestEvent,
};
pub use routed_server as server;
pub use routed_types as types;

pub mod embedded;
