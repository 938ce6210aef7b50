//! The engine layer's error type.

use crate::kv::{KvError, SeqId};
use crate::model::ModelError;

#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error(transparent)]
    Model(#[from] ModelError),
    #[error(transparent)]
    Kv(#[from] KvError),
    #[error("sequence {0:?} does not exist (freed, or never created)")]
    UnknownSequence(SeqId),
    #[error("sequence {0:?} is already generating")]
    Busy(SeqId),
    #[error("sequence {0:?} has no tokens to continue from")]
    EmptySequence(SeqId),
    #[error(
        "sequence {seq:?} needs {needed} KV blocks but the whole pool has {total}: \
         raise the KV budget or shorten the sequence"
    )]
    NeverFits {
        seq: SeqId,
        needed: usize,
        total: usize,
    },
    #[error("sequence {0:?} was freed before its work finished")]
    Freed(SeqId),
    #[error("token id {token} is outside the model's vocabulary of {vocab}")]
    BadToken { token: u32, vocab: usize },
    #[error("{0}")]
    Failed(String),
    #[error("the engine thread has stopped")]
    Stopped,
}
