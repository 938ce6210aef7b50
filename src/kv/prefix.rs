//! [`PrefixIndex`]: which full blocks hold the KV of which token prefixes.
//!
//! A full block is named by a hash chain: `hash_i = H(hash_{i-1}, tokens of block i)`
//! with `hash_{-1} = ROOT_HASH`, so a hash stands for the whole prefix up to the end of
//! its block (a block's KV depends on every token before it). The index maps a hash to
//! the block that holds it, keeping the parent hash and the block's tokens so a lookup
//! compares tokens exactly and a 64-bit collision within one block cannot hand out the
//! wrong KV. The first block registered under a hash keeps it; a later duplicate is
//! simply not indexed.
//!
//! Indexed blocks are immutable (a write to one copies it first, see
//! [`KvCache`](super::KvCache)). When the last reference to an indexed block goes, the
//! [`BlockPool`](super::BlockPool) that owns this index *parks* the block in its LRU
//! instead of freeing it: still matchable, and evictable least-recently-released first
//! when the pool needs blocks. A sequence
//! releases its blocks last-to-first, so a chain's later blocks are evicted before its
//! earlier ones. Evicting a block drops its entry; entries of its descendants stay but
//! are unreachable until the same prefix is computed (and registered) again, when they
//! become valid again (their KV depends only on the tokens).

use std::collections::hash_map::DefaultHasher;
use std::collections::HashMap;
use std::hash::{Hash, Hasher};

use super::ids::BlockId;
use crate::model::TokenId;

/// The hash of a full block together with all blocks before it.
pub type BlockHash = u64;

/// The parent hash of a sequence's first block.
pub const ROOT_HASH: BlockHash = 0x7472_6565_6772_706f; // "treegrpo"

/// `H(parent, tokens)`: the chain hash of a block with these tokens after `parent`.
pub fn chain_hash(parent: BlockHash, tokens: &[TokenId]) -> BlockHash {
    // `DefaultHasher::new()` has fixed keys: equal inputs hash equally within a process,
    // which is all the index needs (it is never persisted).
    let mut h = DefaultHasher::new();
    parent.hash(&mut h);
    tokens.hash(&mut h);
    h.finish()
}

/// The chain hashes of every full block of `tokens`.
pub fn chain_hashes(tokens: &[TokenId], block_size: usize) -> Vec<BlockHash> {
    let mut parent = ROOT_HASH;
    tokens
        .chunks_exact(block_size)
        .map(|chunk| {
            parent = chain_hash(parent, chunk);
            parent
        })
        .collect()
}

#[derive(Debug)]
struct Entry {
    block: BlockId,
    parent: BlockHash,
    tokens: Box<[TokenId]>,
}

/// Hash chain of full blocks → block.
#[derive(Debug)]
pub struct PrefixIndex {
    block_size: usize,
    entries: HashMap<BlockHash, Entry>,
    hash_of: HashMap<BlockId, BlockHash>,
}

impl PrefixIndex {
    /// An empty index over blocks of `block_size` positions.
    pub fn new(block_size: usize) -> Self {
        PrefixIndex {
            block_size,
            entries: HashMap::new(),
            hash_of: HashMap::new(),
        }
    }

    /// Indexes `block` as holding `tokens` (one full block) after the prefix `parent`.
    /// Returns false, changing nothing, if the hash already names a block or the block
    /// is already indexed.
    pub fn register(
        &mut self,
        hash: BlockHash,
        parent: BlockHash,
        tokens: &[TokenId],
        block: BlockId,
    ) -> bool {
        debug_assert_eq!(tokens.len(), self.block_size);
        if self.entries.contains_key(&hash) || self.hash_of.contains_key(&block) {
            return false;
        }
        self.entries.insert(
            hash,
            Entry {
                block,
                parent,
                tokens: tokens.into(),
            },
        );
        self.hash_of.insert(block, hash);
        true
    }

    /// Whether `block` is in the index (and therefore immutable).
    pub fn is_indexed(&self, block: BlockId) -> bool {
        self.hash_of.contains_key(&block)
    }

    /// Indexed blocks (in use or cached).
    pub fn indexed_len(&self) -> usize {
        self.entries.len()
    }

    /// The longest run of indexed full blocks that holds a prefix of `tokens`: the
    /// blocks and their chain hashes (matched tokens = `blocks.len() * block_size`).
    pub fn lookup(&self, tokens: &[TokenId]) -> (Vec<BlockId>, Vec<BlockHash>) {
        let mut blocks = Vec::new();
        let mut hashes = Vec::new();
        let mut parent = ROOT_HASH;
        for chunk in tokens.chunks_exact(self.block_size) {
            let hash = chain_hash(parent, chunk);
            match self.entries.get(&hash) {
                Some(e) if e.parent == parent && *e.tokens == *chunk => {
                    blocks.push(e.block);
                    hashes.push(hash);
                    parent = hash;
                }
                _ => break,
            }
        }
        (blocks, hashes)
    }

    /// Drops `block`'s entry (it is being evicted for reuse). Entries of its
    /// descendants stay, unreachable until the same prefix is registered again.
    pub fn remove(&mut self, block: BlockId) {
        if let Some(hash) = self.hash_of.remove(&block) {
            self.entries.remove(&hash);
        }
    }

    /// Forgets every entry (stale KV after a weight update).
    pub fn clear(&mut self) {
        self.entries.clear();
        self.hash_of.clear();
    }
}
