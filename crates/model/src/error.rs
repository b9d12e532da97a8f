//! The model crate's error type. Every variant names the file, key or tensor at fault.

use std::path::PathBuf;

/// Errors while loading a checkpoint or running a model.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    /// A file of the checkpoint could not be read.
    #[error("cannot read {path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    /// A JSON file is not valid JSON.
    #[error("{path} is not valid JSON: {source}")]
    Json { path: PathBuf, source: serde_json::Error },
    /// `config.json` lacks a key the architecture needs, or it has the wrong type.
    #[error("{path}: {message}")]
    Config { path: PathBuf, message: String },
    /// The checkpoint's `architectures` names a family this engine does not implement.
    #[error("{path}: unknown architecture {name:?}; supported: {supported}")]
    UnknownArchitecture { path: PathBuf, name: String, supported: String },
    /// A safetensors file is malformed.
    #[error("{path}: invalid safetensors file: {message}")]
    Safetensors { path: PathBuf, message: String },
    /// A tensor the model needs is absent from every shard.
    #[error("tensor {name:?} is missing from the checkpoint in {dir}")]
    MissingTensor { name: String, dir: PathBuf },
    /// A tensor has a shape other than the config implies.
    #[error("tensor {name:?} in {path} has shape {found:?}, expected {expected:?}")]
    ShapeMismatch { name: String, path: PathBuf, expected: Vec<usize>, found: Vec<usize> },
    /// A tensor is stored in a dtype the CPU loader cannot convert.
    #[error("tensor {name:?} in {path} has unsupported dtype {dtype}; expected BF16, F16 or F32")]
    UnsupportedDtype { name: String, path: PathBuf, dtype: String },
    /// The tokenizer could not be loaded or failed on an input.
    #[error("tokenizer: {0}")]
    Tokenizer(String),
    /// The chat template failed to parse or render.
    #[error("chat template: {0}")]
    ChatTemplate(String),
    /// A model feature the checkpoint uses is not implemented.
    #[error("{path}: unsupported configuration: {message}")]
    Unsupported { path: PathBuf, message: String },
    /// The model cannot be split as asked over an expert-parallel group.
    #[error("expert parallelism: {message}")]
    ExpertParallel { message: String },
    /// The ranks of an expert-parallel group failed to exchange expert outputs.
    #[error(transparent)]
    Collective(#[from] routed_backend::collective::CollectiveError),
    /// A forward call was given inconsistent inputs.
    #[error("invalid forward input: {0}")]
    BadInput(String),
}

/// Shorthand for results of this crate.
pub type Result<T, E = ModelError> = std::result::Result<T, E>;
