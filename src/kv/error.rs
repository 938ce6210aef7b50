//! [`KvError`]: every way a KV-cache operation can fail. None of them panics; running
//! out of blocks in particular is an ordinary error ([`KvError::OutOfBlocks`]) on which
//! the engine parks the work until blocks are released.

use super::ids::{PinId, SeqId};
use crate::model::ModelError;

/// Errors of the KV layer.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KvError {
    /// Not enough free or evictable blocks; nothing was changed. The engine treats
    /// this as back-pressure (it parks the work until blocks are released); a direct
    /// caller should free sequences or pins, or build the pool with a larger budget.
    #[error("KV pool out of blocks: {needed} needed, {available} free or evictable of {total}")]
    OutOfBlocks {
        /// Blocks the operation needed.
        needed: usize,
        /// Blocks that were free or cached (evictable) at the time.
        available: usize,
        /// Blocks in the whole pool.
        total: usize,
    },
    /// A sequence id that is not (or no longer) live in this cache: it was freed,
    /// preempted, or belongs to another cache.
    #[error("unknown {0}")]
    UnknownSequence(SeqId),
    /// A pin id that is not (or no longer) held: it was already unpinned, or belongs
    /// to another cache.
    #[error("unknown {0}")]
    UnknownPin(PinId),
    /// Cached blocks can be adopted only by a sequence that holds none yet.
    #[error("{0} already holds KV blocks")]
    NotEmpty(SeqId),
    /// A truncate or pin asked for more tokens than the sequence holds.
    #[error("{seq}: length {requested} is beyond its {len} tokens")]
    BeyondLength {
        /// The sequence asked about.
        seq: SeqId,
        /// Its length in tokens.
        len: usize,
        /// The length that was asked for.
        requested: usize,
    },
    /// A write to a position inside the frozen prefix the sequence shares with its
    /// forks: those rows are immutable (truncate the sequence first to rewrite them).
    #[error("{seq}: position {position} is in a frozen prefix shared with forks; it cannot be rewritten")]
    Frozen {
        /// The sequence written to.
        seq: SeqId,
        /// The token position of the write.
        position: usize,
    },
    /// A write or commit reached past the blocks reserved for the sequence: reserve
    /// room first ([`KvCache::reserve`](super::KvCache::reserve)).
    #[error("{seq}: position {position} is beyond its reserved capacity of {capacity}")]
    BeyondCapacity {
        /// The sequence written to.
        seq: SeqId,
        /// The token position (or end position) that was out of room.
        position: usize,
        /// The tokens its reserved blocks hold.
        capacity: usize,
    },
    /// A row write named a layer the pool does not have.
    #[error("layer {layer} is out of range: the pool has {num_layers} layers")]
    BadLayer {
        /// The layer index given.
        layer: usize,
        /// The pool's layer count: valid layers are `0..num_layers`.
        num_layers: usize,
    },
    /// A key or value row whose length is not the pool's `kv_dim` (KV heads times
    /// head size): the pool was built for another model.
    #[error("a KV row has {found} floats but kv_dim is {expected}")]
    RowWidth {
        /// The pool's `kv_dim`.
        expected: usize,
        /// The row's length.
        found: usize,
    },
    /// A pool shape that cannot be laid out; what is wrong is the source.
    #[error("invalid KV config")]
    InvalidConfig(#[source] KvConfigError),
    /// The byte budget is smaller than one block: raise the budget (or use a smaller
    /// `block_size`).
    #[error("a KV budget of {budget_bytes} bytes holds no block of {bytes_per_block} bytes")]
    BudgetTooSmall {
        /// The budget asked for, in bytes.
        budget_bytes: usize,
        /// The size of one block (all layers, K and V), in bytes.
        bytes_per_block: usize,
    },
    /// The operating system refused the pool's memory: lower the KV budget.
    #[error("cannot allocate the KV pool ({bytes} bytes)")]
    Alloc {
        /// The size of the allocation that failed, in bytes.
        bytes: usize,
    },
}

/// What is wrong with a KV pool's shape ([`KvError::InvalidConfig`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KvConfigError {
    /// The row of `kv_dim` values does not split evenly into the KV heads.
    #[error("kv_dim {kv_dim} does not split into {kv_heads} KV heads")]
    HeadSplit {
        /// The row width (KV heads times head size).
        kv_dim: usize,
        /// The number of KV heads.
        kv_heads: usize,
    },
    /// An f16 block must fill whole f32 words (the storage is f32).
    #[error("an f16 block of {block_size} rows of {kv_dim} is not a whole number of f32 words")]
    OddF16Block {
        /// Token rows per block.
        block_size: usize,
        /// Values per row.
        kv_dim: usize,
    },
    /// A size of zero.
    #[error(
        "block_size {block_size}, num_layers {num_layers} and kv_dim {kv_dim} must all be positive"
    )]
    ZeroSize {
        /// Token rows per block.
        block_size: usize,
        /// Layers of the model.
        num_layers: usize,
        /// Values per row.
        kv_dim: usize,
    },
    /// A block's size in bytes does not fit `usize`.
    #[error("the size of a block overflows")]
    BlockOverflow,
    /// More blocks than a `BlockId` (a `u32`) can name.
    #[error("{blocks} blocks exceed the {} a BlockId can name", u32::MAX)]
    TooManyBlocks {
        /// The blocks the budget would give.
        blocks: usize,
    },
}

/// A paged-cache error met inside a forward, kept whole as the model error's source.
impl From<KvError> for ModelError {
    fn from(e: KvError) -> Self {
        ModelError::KvStore(Box::new(e))
    }
}
