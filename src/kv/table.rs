//! [`BlockTable`]: a sequence's (or a pin's) view of the pool — the blocks holding its
//! positions in order, and how many positions are valid.
//!
//! Position `p` lives in row `p % block_size` of `blocks[p / block_size]`. A table may
//! hold more blocks than `len` needs: those are reserved for positions about to be
//! written ([`KvCache::reserve`](super::KvCache::reserve)). A table never owns block data;
//! it holds one reference (refcount) on each block it lists.

use super::ids::BlockId;

/// The blocks of one sequence, in position order, and its number of valid positions.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BlockTable {
    /// The blocks holding positions `0..`, in order; may extend past `len` by reserved
    /// blocks.
    pub blocks: Vec<BlockId>,
    /// Valid (committed) positions.
    pub len: usize,
}

/// Blocks needed to hold `tokens` positions (rounded up).
pub fn blocks_for(tokens: usize, block_size: usize) -> usize {
    tokens.div_ceil(block_size)
}

impl BlockTable {
    /// An empty table: no blocks, no positions.
    pub fn new() -> Self {
        Self::default()
    }

    /// Positions the listed blocks can hold.
    pub fn capacity(&self, block_size: usize) -> usize {
        self.blocks.len() * block_size
    }

    /// Blocks whose every row is valid.
    pub fn full_blocks(&self, block_size: usize) -> usize {
        self.len / block_size
    }

    /// (block index, row) of `position`.
    pub fn locate(position: usize, block_size: usize) -> (usize, usize) {
        (position / block_size, position % block_size)
    }

    /// The table of the first `len` positions: the blocks covering them, no more.
    /// The caller must take a reference on each block of the result.
    pub fn prefix(&self, len: usize, block_size: usize) -> BlockTable {
        let n = blocks_for(len, block_size).min(self.blocks.len());
        BlockTable {
            blocks: self.blocks[..n].to_vec(),
            len,
        }
    }
}
