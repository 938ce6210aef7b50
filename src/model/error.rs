//! The model layer's error type: every failure names the file and the problem.

use std::path::PathBuf;

/// Errors of the model layer. Loading errors carry the path of the file at fault so
/// that a user can tell which of several files is broken.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: not a valid GGUF file: {msg}")]
    CorruptGguf { path: PathBuf, msg: String },
    #[error("{path}: unsupported architecture '{arch}' (supported: llama, mistral, qwen2)")]
    UnsupportedArchitecture { path: PathBuf, arch: String },
    #[error("{path}: bad or missing config value: {msg}")]
    Config { path: PathBuf, msg: String },
    /// RoPE settings we cannot serve as declared (printed in the message, not as a
    /// second `source` line).
    #[error("{path}: RoPE: {problem}")]
    Rope {
        path: PathBuf,
        problem: super::rope::RopeConfigError,
    },
    #[error("{path}: missing tensor '{name}'")]
    MissingTensor { path: PathBuf, name: String },
    #[error("{path}: tensor '{name}' has shape {found:?} but the config implies {expected:?}")]
    ShapeMismatch {
        path: PathBuf,
        name: String,
        expected: Vec<usize>,
        found: Vec<usize>,
    },
    #[error("{path}: no usable tokenizer: {msg}")]
    MissingTokenizer { path: PathBuf, msg: String },
    #[error("tokenizer: {0}")]
    Tokenizer(String),
    #[error("chat template: {0}")]
    Template(String),
    #[error("sequence of {tokens} tokens does not fit the context window of {max} tokens")]
    ContextOverflow { tokens: usize, max: usize },
    /// The KV store the forward writes to refused a write; its own error is the
    /// source (the paged cache's is a `kv::KvError`: downcast to match on it).
    #[error("KV store: {0}")]
    KvStore(#[source] Box<dyn std::error::Error + Send + Sync>),
    #[error("model fetch: {0}")]
    Fetch(String),
    #[error("tensor op: {0}")]
    Candle(#[from] candle_core::Error),
    /// A weight matrix our kernels cannot hold as given.
    #[error("weights: {0}")]
    Pack(#[from] super::kernels::PackError),
    /// A tensor handed over by name that the model has no place for (a weight of
    /// another architecture, or a tied output layer that is not the embedding).
    #[error("{path}: tensor '{name}' {msg}")]
    UnusableTensor {
        path: PathBuf,
        name: String,
        msg: String,
    },
}

impl ModelError {
    pub(crate) fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        ModelError::Io {
            path: path.into(),
            source,
        }
    }
}
