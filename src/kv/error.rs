//! [`KvError`]: every way a KV-cache operation can fail. None of them panics; running
//! out of blocks in particular is an ordinary error ([`KvError::OutOfBlocks`]) on which
//! the engine parks the work until blocks are released.

use super::ids::{PinId, SeqId};
use crate::model::ModelError;

/// Errors of the KV layer.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KvError {
    /// Not enough free or evictable blocks; nothing was changed.
    #[error("KV pool out of blocks: {needed} needed, {available} free or evictable of {total}")]
    OutOfBlocks {
        needed: usize,
        available: usize,
        total: usize,
    },
    #[error("unknown {0}")]
    UnknownSequence(SeqId),
    #[error("unknown {0}")]
    UnknownPin(PinId),
    /// Cached blocks can be adopted only by a sequence that holds none yet.
    #[error("{0} already holds KV blocks")]
    NotEmpty(SeqId),
    /// A truncate or pin asked for more tokens than the sequence holds.
    #[error("{seq}: length {requested} is beyond its {len} tokens")]
    BeyondLength {
        seq: SeqId,
        len: usize,
        requested: usize,
    },
    /// A write or commit reached past the blocks reserved for the sequence.
    #[error("{seq}: position {position} is in a frozen prefix shared with forks; it cannot be rewritten")]
    Frozen { seq: SeqId, position: usize },
    #[error("{seq}: position {position} is beyond its reserved capacity of {capacity}")]
    BeyondCapacity {
        seq: SeqId,
        position: usize,
        capacity: usize,
    },
    #[error("layer {layer} is out of range: the pool has {num_layers} layers")]
    BadLayer { layer: usize, num_layers: usize },
    #[error("a KV row has {found} floats but kv_dim is {expected}")]
    RowWidth { expected: usize, found: usize },
    #[error("invalid KV config: {0}")]
    InvalidConfig(String),
    #[error("a KV budget of {budget_bytes} bytes holds no block of {bytes_per_block} bytes")]
    BudgetTooSmall {
        budget_bytes: usize,
        bytes_per_block: usize,
    },
    #[error("cannot allocate the KV pool ({bytes} bytes)")]
    Alloc { bytes: usize },
}

/// A paged-cache error met inside a forward, kept whole as the model error's source.
impl From<KvError> for ModelError {
    fn from(e: KvError) -> Self {
        ModelError::KvStore(Box::new(e))
    }
}
