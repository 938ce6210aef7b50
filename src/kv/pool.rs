//! [`BlockPool`]: the one owner of every block's state — *free*, *cached* (no
//! reference, still matchable through the prefix index, evictable) or *in use*
//! (referenced by tables, pins or segments) — the way vLLM's `block_pool.py` keeps its
//! free queue and its hash → block map together.
//!
//! It holds the reference counts, the free list, the LRU of cached blocks and the
//! [`PrefixIndex`], and moves a block between the three states in one place:
//!
//! - [`allocate`](BlockPool::allocate): a free block, else the least recently released
//!   cached one (evicted: it leaves the index); refcount 1. With
//!   [`set_reuse_cached_first`](BlockPool::set_reuse_cached_first), a cached block goes
//!   before a free block never handed out (whose memory has not been written).
//! - [`retain`](BlockPool::retain): one more reference; a cached block leaves the LRU.
//! - [`release`](BlockPool::release): one reference less; at zero an indexed block is
//!   parked in the LRU, any other goes back to the free list.
//! - [`clear_cache`](BlockPool::clear_cache): forgets the index and frees every cached
//!   block (stale KV after a weight update).
//!
//! It does not know who holds the references, nor the KV bytes
//! ([`KvStorage`](super::KvStorage)): the cache above it does.

use lru::LruCache;

use super::ids::BlockId;
use super::prefix::{BlockHash, PrefixIndex};
use crate::model::TokenId;

/// Block states: reference counts, free list, cached LRU and the prefix index.
#[derive(Debug)]
pub struct BlockPool {
    refcounts: Vec<u32>,
    /// Free blocks; the next allocation pops from the end (lowest ids first).
    free: Vec<BlockId>,
    /// Indexed blocks with no reference, least recently released first.
    cached: LruCache<BlockId, ()>,
    index: PrefixIndex,
    /// Cached blocks evicted for reuse so far.
    evictions: u64,
    /// Blocks `0..handed_out` have been allocated at least once (the free list hands
    /// out lowest ids first, so every block above has never been written).
    handed_out: usize,
    /// Evict a cached block before handing out one never written.
    reuse_cached_first: bool,
}

impl BlockPool {
    /// `num_blocks` free blocks of `block_size` positions.
    pub fn new(num_blocks: usize, block_size: usize) -> Self {
        BlockPool {
            refcounts: vec![0; num_blocks],
            free: (0..num_blocks as u32).rev().map(BlockId::new).collect(),
            cached: LruCache::unbounded(),
            index: PrefixIndex::new(block_size),
            evictions: 0,
            handed_out: 0,
            reuse_cached_first: false,
        }
    }

    /// Whether an allocation evicts the least recently released cached block before it
    /// hands out a block never allocated. Off (the default), the prefix cache keeps
    /// every released block until the pool has no other room, which suits a server.
    /// On, the pool's written memory stays near its peak in use: a job whose released
    /// prefixes are not looked up again (a rollout's finished trees) then writes fewer
    /// fresh pages, each a page fault and, on a virtual machine that backs memory
    /// lazily, about 1.5 ms a MiB (the main rollout command: 1.66 -> 1.21 GB resident,
    /// 1.1-1.5 s -> 0.4 s between steps, the same tokens).
    pub fn set_reuse_cached_first(&mut self, on: bool) {
        self.reuse_cached_first = on;
    }

    /// Blocks the pool manages, whatever their state.
    pub fn num_blocks(&self) -> usize {
        self.refcounts.len()
    }

    // ----- state transitions --------------------------------------------------------

    /// A block with refcount 1: from the free list, else by evicting the least
    /// recently released cached block. `None` when every block is in use.
    pub fn allocate(&mut self) -> Option<BlockId> {
        let never_written = self
            .free
            .last()
            .is_some_and(|b| b.index() >= self.handed_out);
        let from_free = if never_written && self.reuse_cached_first && !self.cached.is_empty() {
            None
        } else {
            self.free.pop()
        };
        let b = match from_free {
            Some(b) => b,
            None => {
                let (b, ()) = self.cached.pop_lru()?;
                self.index.remove(b);
                self.evictions += 1;
                b
            }
        };
        debug_assert_eq!(self.refcounts[b.index()], 0);
        self.handed_out = self.handed_out.max(b.index() + 1);
        self.refcounts[b.index()] = 1;
        Some(b)
    }

    /// Takes a reference on a block in use or cached (a cached block leaves the LRU).
    pub fn retain(&mut self, block: BlockId) {
        if self.refcounts[block.index()] == 0 {
            let was_cached = self.cached.pop(&block).is_some();
            debug_assert!(was_cached, "retaining an unreferenced uncached {block}");
        }
        self.refcounts[block.index()] += 1;
    }

    /// Drops a reference; at zero an indexed block is parked in the LRU (most recently
    /// used) and any other block goes back to the free list.
    pub fn release(&mut self, block: BlockId) {
        let rc = &mut self.refcounts[block.index()];
        assert!(*rc > 0, "KV refcount underflow on {block}");
        *rc -= 1;
        if *rc == 0 {
            if self.index.is_indexed(block) {
                self.cached.put(block, ());
            } else {
                self.free.push(block);
            }
        }
    }

    /// Indexes the full block `block` (in use) as holding `tokens` after the prefix
    /// `parent`. False, changing nothing, if the hash or the block is already indexed.
    pub fn register(
        &mut self,
        hash: BlockHash,
        parent: BlockHash,
        tokens: &[TokenId],
        block: BlockId,
    ) -> bool {
        debug_assert!(self.refcounts[block.index()] > 0, "indexing unused {block}");
        self.index.register(hash, parent, tokens, block)
    }

    /// Forgets every index entry and frees every cached block. Blocks in use stay
    /// with their holders, no longer matchable, and are freed normally when released.
    pub fn clear_cache(&mut self) {
        self.index.clear();
        while let Some((b, ())) = self.cached.pop_lru() {
            self.free.push(b);
        }
    }

    // ----- queries ------------------------------------------------------------------

    /// The longest run of indexed full blocks (in use or cached) that holds a prefix of
    /// `tokens`, with their chain hashes. A lookup only: nothing is referenced.
    pub fn lookup(&self, tokens: &[TokenId]) -> (Vec<BlockId>, Vec<BlockHash>) {
        self.index.lookup(tokens)
    }

    /// How many holders reference `block` (0: free or cached). Panics if `block` is not
    /// from this pool.
    pub fn refcount(&self, block: BlockId) -> u32 {
        self.refcounts[block.index()]
    }

    /// All reference counts, indexed by [`BlockId::index`].
    pub fn refcounts(&self) -> &[u32] {
        &self.refcounts
    }

    /// The free list (allocation order is from its end).
    pub fn free_blocks(&self) -> &[BlockId] {
        &self.free
    }

    /// Blocks on the free list.
    pub fn free_count(&self) -> usize {
        self.free.len()
    }

    /// Cached (unreferenced, evictable) blocks.
    pub fn cached_count(&self) -> usize {
        self.cached.len()
    }

    /// The cached blocks, most recently released first.
    pub fn cached_blocks(&self) -> impl Iterator<Item = BlockId> + '_ {
        self.cached.iter().map(|(b, _)| *b)
    }

    /// Blocks referenced by at least one holder.
    pub fn in_use_count(&self) -> usize {
        self.num_blocks() - self.free.len() - self.cached.len()
    }

    /// Blocks an allocation could get right now (free + evictable).
    pub fn available_count(&self) -> usize {
        self.free.len() + self.cached.len()
    }

    /// Whether `block` is unreferenced and kept for prefix reuse (evictable).
    pub fn is_cached(&self, block: BlockId) -> bool {
        self.cached.contains(&block)
    }

    /// Whether `block` is in the prefix index (and therefore immutable).
    pub fn is_indexed(&self, block: BlockId) -> bool {
        self.index.is_indexed(block)
    }

    /// Indexed blocks (in use or cached).
    pub fn indexed_count(&self) -> usize {
        self.index.indexed_len()
    }

    /// Cached blocks evicted to serve an allocation, since the pool was made.
    pub fn evictions(&self) -> u64 {
        self.evictions
    }

    /// Checks that every block is in exactly one state and that its refcount equals
    /// `holders[block]` (the references the caller counted); cached blocks must be
    /// indexed. The cache's self-check calls it.
    pub fn check_states(&self, holders: &[u32]) -> Result<(), String> {
        let n = self.num_blocks();
        if holders.len() != n {
            return Err(format!("{} holder counts for {n} blocks", holders.len()));
        }
        let mut seen = vec![0u8; n];
        for b in &self.free {
            seen[b.index()] += 1;
        }
        for b in self.cached_blocks() {
            seen[b.index()] += 1;
            if !self.index.is_indexed(b) {
                return Err(format!("cached {b} is not indexed"));
            }
        }
        for (i, (&rc, &expected)) in self.refcounts.iter().zip(holders).enumerate() {
            let b = BlockId::new(i as u32);
            if rc != expected {
                return Err(format!("{b}: refcount {rc} but {expected} holders"));
            }
            let states = seen[i] as u32 + u32::from(rc > 0);
            if states != 1 {
                return Err(format!("{b}: in {states} of in-use / cached / free"));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kv::prefix::{chain_hash, ROOT_HASH};

    /// A pool of 4 blocks of 2 positions whose blocks 0 and 1 were filled, indexed
    /// and released (so cached, block 0 the least recently released).
    fn pool_with_two_cached(reuse_cached_first: bool) -> BlockPool {
        let mut pool = BlockPool::new(4, 2);
        pool.set_reuse_cached_first(reuse_cached_first);
        let mut parent = ROOT_HASH;
        for tokens in [[1, 2], [3, 4]] {
            let b = pool.allocate().unwrap();
            let hash = chain_hash(parent, &tokens);
            assert!(pool.register(hash, parent, &tokens, b));
            parent = hash;
        }
        pool.release(BlockId::new(0));
        pool.release(BlockId::new(1));
        assert_eq!(pool.lookup(&[1, 2, 3, 4]).0.len(), 2);
        pool
    }

    #[test]
    fn by_default_never_written_blocks_go_before_cached_ones() {
        let mut pool = pool_with_two_cached(false);
        assert_eq!(pool.allocate(), Some(BlockId::new(2)));
        assert_eq!(pool.allocate(), Some(BlockId::new(3)));
        assert_eq!(pool.evictions(), 0);
        // Then the cached ones, least recently released first.
        assert_eq!(pool.allocate(), Some(BlockId::new(0)));
        assert_eq!(pool.evictions(), 1);
    }

    #[test]
    fn reusing_cached_first_evicts_before_writing_a_fresh_block_but_takes_freed_ones() {
        let mut pool = pool_with_two_cached(true);
        assert_eq!(pool.allocate(), Some(BlockId::new(0)));
        assert_eq!(pool.evictions(), 1);
        // The evicted block left the index: the prefix now matches nothing.
        assert_eq!(pool.lookup(&[1, 2, 3, 4]).0.len(), 0);
        // A freed block that was written goes before the remaining cached one.
        pool.release(BlockId::new(0));
        assert_eq!(pool.allocate(), Some(BlockId::new(0)));
        assert_eq!(pool.allocate(), Some(BlockId::new(1)));
        // No cached block left: the never-written ones, then nothing.
        assert_eq!(pool.allocate(), Some(BlockId::new(2)));
        assert_eq!(pool.allocate(), Some(BlockId::new(3)));
        assert_eq!(pool.allocate(), None);
        assert_eq!(pool.evictions(), 2);
    }
}
