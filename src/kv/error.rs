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
    /// A pool shape that cannot be laid out; what is wrong is the source.
    #[error("invalid KV config")]
    InvalidConfig(#[source] KvConfigError),
    #[error("a KV budget of {budget_bytes} bytes holds no block of {bytes_per_block} bytes")]
    BudgetTooSmall {
        budget_bytes: usize,
        bytes_per_block: usize,
    },
    #[error("cannot allocate the KV pool ({bytes} bytes)")]
    Alloc { bytes: usize },
}

/// What is wrong with a KV pool's shape ([`KvError::InvalidConfig`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KvConfigError {
    /// The row of `kv_dim` values does not split evenly into the KV heads.
    #[error("kv_dim {kv_dim} does not split into {kv_heads} KV heads")]
    HeadSplit { kv_dim: usize, kv_heads: usize },
    /// An f16 block must fill whole f32 words (the storage is f32).
    #[error("an f16 block of {block_size} rows of {kv_dim} is not a whole number of f32 words")]
    OddF16Block { block_size: usize, kv_dim: usize },
    /// A size of zero.
    #[error(
        "block_size {block_size}, num_layers {num_layers} and kv_dim {kv_dim} must all be positive"
    )]
    ZeroSize {
        block_size: usize,
        num_layers: usize,
        kv_dim: usize,
    },
    /// A block's size in bytes does not fit `usize`.
    #[error("the size of a block overflows")]
    BlockOverflow,
    /// More blocks than a `BlockId` (a `u32`) can name.
    #[error("{blocks} blocks exceed the {} a BlockId can name", u32::MAX)]
    TooManyBlocks { blocks: usize },
}

/// A paged-cache error met inside a forward, kept whole as the model error's source.
impl From<KvError> for ModelError {
    fn from(e: KvError) -> Self {
        ModelError::KvStore(Box::new(e))
    }
}
