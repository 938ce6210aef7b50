//! Peer engines: the same workloads run on a well-known CPU inference engine, on the
//! same GGUF file, prompt token ids, sampling settings and batch sizes, so our
//! engine's figures can be set beside another's measured in the same run. Each peer
//! sits behind a cargo feature of its own (their builds are long) and stays out of
//! `.ci/run`; `scripts/peer-*.sh` build and run them.
//!
//! - [mistral.rs](https://github.com/EricLBuehler/mistral.rs) (crate `mistralrs` 0.8.1,
//!   feature `mistralrs`): [`mistralrs_client`] (loading, one raw-token completion),
//!   [`mistralrs_chain`] (the GRPO chain workload with its prefix cache on) and
//!   [`mistralrs_speed`] (aggregate decode speed at a batch). mistral.rs answers with
//!   text, not token ids, so token counts there come from *our* tokenizer.
//! - [llama.cpp](https://github.com/ggml-org/llama.cpp) (crate `llama-cpp-2`, which
//!   builds llama.cpp's vendored source with cmake; feature `llamacpp`):
//!   [`llamacpp_speed`] (decode at a batch and prefill, through its C API, token ids
//!   in and logits out).
//!
//! Nothing here panics on bad input: every failure (a missing file, a model the peer
//! cannot load, a request it rejects) is a [`PeerError`].

#[cfg(feature = "llamacpp")]
pub mod llamacpp_speed;
#[cfg(feature = "mistralrs")]
pub mod mistralrs_chain;
#[cfg(feature = "mistralrs")]
pub mod mistralrs_client;
#[cfg(feature = "mistralrs")]
pub mod mistralrs_speed;

use std::path::PathBuf;

use crate::env::EnvError;
use crate::model::ModelError;

#[cfg(feature = "llamacpp")]
pub use llamacpp_speed::LlamaCppPeer;
#[cfg(feature = "mistralrs")]
pub use mistralrs_chain::{run_mistralrs_chains, ChainWorkload, PeerRunSummary};
#[cfg(feature = "mistralrs")]
pub use mistralrs_client::{
    complete, load_peer_model, sampling_params, sender, Completion, PeerDType, PeerModelConfig,
};
#[cfg(feature = "mistralrs")]
pub use mistralrs_speed::{
    mistralrs_decode_tokens_per_second, mistralrs_decode_tokens_per_second_with,
};

/// What can go wrong running a peer engine.
#[derive(Debug, thiserror::Error)]
pub enum PeerError {
    /// An argument is unusable (zero chains, an empty batch, ...).
    #[error("invalid peer run: {0}")]
    Invalid(String),
    /// Our side: the tokenizer or chat template.
    #[error(transparent)]
    Model(#[from] ModelError),
    /// Our side: the environment.
    #[error(transparent)]
    Env(#[from] EnvError),
    /// The model file cannot be handed to mistral.rs (`msg` says why: not a file, a
    /// name that is not UTF-8).
    #[error("mistral.rs could not load {}: {msg}", .path.display())]
    Load {
        /// The model path as given.
        path: PathBuf,
        /// Why it cannot be handed over.
        msg: String,
    },
    /// mistral.rs failed loading the model file, or panicked doing it; its error is
    /// the source (boxed: mistral.rs's loader answers with `anyhow`).
    #[error("mistral.rs could not load {}", .path.display())]
    LoadFailed {
        /// The model file.
        path: PathBuf,
        /// mistral.rs's error, or the panic of its loading task.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// A request to mistral.rs got no usable answer (`0` says what came back).
    #[error("mistral.rs request failed: {0}")]
    Request(String),
    /// mistral.rs refused or failed a request (`what`: how); its error is the source
    /// (boxed: its responses carry boxed errors and bare messages).
    #[error("mistral.rs request failed: {what}")]
    Rejected {
        /// What failed (`"no engine"`, `"validation"`, `"model error"`, `"internal"`).
        what: &'static str,
        /// mistral.rs's error.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// A task of ours panicked or was cancelled.
    #[error("peer task failed")]
    Task(#[source] tokio::task::JoinError),
    /// llama.cpp failed: loading the model, making a context, or a decode.
    #[cfg(feature = "llamacpp")]
    #[error("llama.cpp")]
    LlamaCpp(#[from] llama_cpp_2::LlamaCppError),
    /// llama.cpp refused a KV-cache operation (`what`); its error is the source.
    #[cfg(feature = "llamacpp")]
    #[error("llama.cpp: {what}")]
    LlamaCppCache {
        /// The KV-cache operation that was refused (`"cache copy"`).
        what: &'static str,
        /// llama.cpp's error.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
}
