//! The model crate's error type. Every variant names the file, key or tensor at fault.

use std::path::PathBuf;

/// Errors while loading a checkpoint or running a model.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    /// A file of the checkpoint could not be read.
    #[error("cannot read {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// A JSON file is not valid JSON.
    #[error("{path} is not valid JSON: {source}")]
    Json {
        /// The file.
        path: PathBuf,
        /// Where and why parsing failed.
        source: serde_json::Error,
    },
    /// `config.json` lacks a key the architecture needs, or it has the wrong type.
    #[error("{path}: {message}")]
    Config {
        /// The file.
        path: PathBuf,
        /// The key at fault and what is wrong with it.
        message: String,
    },
    /// The checkpoint's `architectures` names a family this engine does not implement.
    #[error("{path}: unknown architecture {name:?}; supported: {supported}")]
    UnknownArchitecture {
        /// The file.
        path: PathBuf,
        /// The architecture the file names.
        name: String,
        /// The architectures this engine implements.
        supported: String,
    },
    /// A safetensors file is malformed.
    #[error("{path}: invalid safetensors file: {message}")]
    Safetensors {
        /// The file.
        path: PathBuf,
        /// What is malformed.
        message: String,
    },
    /// A tensor the model needs is absent from every shard.
    #[error("tensor {name:?} is missing from the checkpoint in {dir}")]
    MissingTensor {
        /// The tensor.
        name: String,
        /// The checkpoint directory.
        dir: PathBuf,
    },
    /// A tensor has a shape other than the config implies.
    #[error("tensor {name:?} in {path} has shape {found:?}, expected {expected:?}")]
    ShapeMismatch {
        /// The tensor.
        name: String,
        /// The file.
        path: PathBuf,
        /// The shape the config implies.
        expected: Vec<usize>,
        /// The shape stored.
        found: Vec<usize>,
    },
    /// A tensor is stored in a dtype the CPU loader cannot convert.
    #[error("tensor {name:?} in {path} has unsupported dtype {dtype}; expected BF16, F16 or F32")]
    UnsupportedDtype {
        /// The tensor.
        name: String,
        /// The file.
        path: PathBuf,
        /// The stored dtype.
        dtype: String,
    },
    /// The tokenizer could not be loaded or failed on an input.
    #[error("tokenizer: {0}")]
    Tokenizer(String),
    /// The chat template failed to parse or render.
    #[error("chat template: {0}")]
    ChatTemplate(String),
    /// A model feature the checkpoint uses is not implemented.
    #[error("{path}: unsupported configuration: {message}")]
    Unsupported {
        /// The file.
        path: PathBuf,
        /// The feature and its setting.
        message: String,
    },
    /// The model cannot be split as asked over an expert-parallel group.
    #[error("expert parallelism: {message}")]
    ExpertParallel {
        /// What does not fit.
        message: String,
    },
    /// The ranks of an expert-parallel group failed to exchange expert outputs.
    #[error(transparent)]
    Collective(#[from] routed_backend::collective::CollectiveError),
    /// A forward call was given inconsistent inputs.
    #[error("invalid forward input: {0}")]
    BadInput(String),
    /// The compute device failed (a CUDA call, an allocation, a launch the sizes do not fit).
    #[error("device: {0}")]
    Device(#[from] routed_backend::BackendError),
}

/// Shorthand for results of this crate.
pub type Result<T, E = ModelError> = std::result::Result<T, E>;
