//! Sizes, counters and read-only views of the cache: block counts, a sequence's
//! length, tokens and table, the ids alive, reference counts.

use std::collections::HashSet;

use super::{KvCache, KvStats, TableState};
use crate::kv::prefix::BlockHash;
use crate::kv::table::{blocks_for, BlockTable};
use crate::kv::{BlockId, BlockPool, KvError, KvStorage, PinId, SeqId};
use crate::model::TokenId;

impl KvCache {
    // ----- sizes and counters -------------------------------------------------------

    /// The block states (read-only: refcounts, free list, cached LRU, index).
    pub fn pool(&self) -> &BlockPool {
        &self.pool
    }

    /// The KV bytes (read-only: each block's keys and values per layer).
    pub fn storage(&self) -> &KvStorage {
        &self.storage
    }

    /// Positions (token rows) per block.
    pub fn block_size(&self) -> usize {
        self.storage.block_size()
    }

    /// Blocks in the pool (fixed when the cache is made).
    pub fn num_blocks(&self) -> usize {
        self.storage.num_blocks()
    }

    /// Bytes one block takes: keys and values of every layer for `block_size` positions.
    pub fn bytes_per_block(&self) -> usize {
        self.storage.bytes_per_block()
    }

    /// Bytes one position takes: keys and values of every layer.
    pub fn bytes_per_token(&self) -> usize {
        self.storage.bytes_per_token()
    }

    /// Blocks needed for `tokens` positions in one table (rounded up).
    pub fn blocks_for_tokens(&self, tokens: usize) -> usize {
        blocks_for(tokens, self.block_size())
    }

    /// Full blocks of a `prefix_len`-token prefix: what a fork from its end keeps
    /// sharing once both sides have written (the partly filled last block is copied).
    pub fn shared_blocks(&self, prefix_len: usize) -> usize {
        prefix_len / self.block_size()
    }

    /// Bytes of `unique_tokens` positions at exactly [`bytes_per_token`](Self::bytes_per_token)
    /// each: the lower bound [`bytes_in_use`](Self::bytes_in_use) reaches up to rounding
    /// to blocks (at most one partly filled block per table).
    pub fn unique_tokens_bytes(&self, unique_tokens: usize) -> usize {
        unique_tokens * self.bytes_per_token()
    }

    /// Bytes of `blocks` blocks.
    pub fn blocks_bytes(&self, blocks: usize) -> usize {
        blocks * self.bytes_per_block()
    }

    /// Blocks referenced by a table or pin.
    pub fn blocks_in_use(&self) -> usize {
        self.storage.num_blocks() - self.pool.free_count() - self.pool.cached_count()
    }

    /// KV bytes held by live tables and pins.
    pub fn bytes_in_use(&self) -> usize {
        self.blocks_bytes(self.blocks_in_use())
    }

    /// Distinct blocks referenced by a pin. O(pinned blocks).
    pub fn pinned_blocks(&self) -> usize {
        let set: HashSet<BlockId> = self.pins.values().flat_map(|p| self.blocks_of(p)).collect();
        set.len()
    }

    /// Unreferenced blocks kept for prefix reuse.
    pub fn cached_blocks(&self) -> usize {
        self.pool.cached_count()
    }

    /// Blocks on the free list (never allocated, or released while not in the
    /// prefix index).
    pub fn free_blocks(&self) -> usize {
        self.pool.free_count()
    }

    /// Blocks a reservation could get right now (free + evictable).
    pub fn available_blocks(&self) -> usize {
        self.pool.available_count()
    }

    /// Whether `block` is unreferenced and kept for prefix reuse (evictable).
    pub fn is_cached(&self, block: BlockId) -> bool {
        self.pool.is_cached(block)
    }

    /// Whether `block` is in the prefix index (full, hashed, and so immutable).
    pub fn is_indexed(&self, block: BlockId) -> bool {
        self.pool.is_indexed(block)
    }

    /// The cached blocks, most recently released first.
    pub fn cached_block_ids(&self) -> Vec<BlockId> {
        self.pool.cached_blocks().collect()
    }

    /// Block counts, sizes and counters now. O(pinned blocks), for the pinned count.
    pub fn stats(&self) -> KvStats {
        KvStats {
            num_blocks: self.num_blocks(),
            block_size: self.block_size(),
            in_use: self.blocks_in_use(),
            pinned: self.pinned_blocks(),
            cached: self.cached_blocks(),
            free: self.free_blocks(),
            indexed: self.pool.indexed_count(),
            bytes_per_block: self.bytes_per_block(),
            bytes_per_token: self.bytes_per_token(),
            cow_copies: self.cow_copies,
            evictions: self.pool.evictions(),
        }
    }

    // ----- inspection ---------------------------------------------------------------

    pub(super) fn seq(&self, seq: SeqId) -> Result<&TableState, KvError> {
        self.seqs.get(&seq).ok_or(KvError::UnknownSequence(seq))
    }

    pub(super) fn pin_state(&self, pin: PinId) -> Result<&TableState, KvError> {
        self.pins.get(&pin).ok_or(KvError::UnknownPin(pin))
    }

    /// Every block of a table in position order: the frozen chain, then its own part.
    pub(super) fn blocks_of(&self, p: &TableState) -> Vec<BlockId> {
        let mut out = Vec::with_capacity(p.frozen_blocks + p.blocks.len());
        for id in self.segments.chain(p.frozen) {
            out.extend_from_slice(&self.segments.get(id).blocks);
        }
        out.extend_from_slice(&p.blocks);
        out
    }

    /// Token ids of a table's valid positions.
    pub(super) fn tokens_of(&self, p: &TableState) -> Vec<TokenId> {
        let mut out = Vec::with_capacity(p.len);
        for id in self.segments.chain(p.frozen) {
            out.extend_from_slice(&self.segments.get(id).tokens);
        }
        out.extend_from_slice(&p.tokens);
        out
    }

    /// Chain hashes of a table's full blocks.
    pub(super) fn hashes_of(&self, p: &TableState) -> Vec<BlockHash> {
        let mut out = Vec::with_capacity(p.len / self.block_size());
        for id in self.segments.chain(p.frozen) {
            out.extend_from_slice(&self.segments.get(id).hashes);
        }
        out.extend_from_slice(&p.hashes);
        out
    }

    pub(super) fn table_of(&self, p: &TableState) -> BlockTable {
        BlockTable {
            blocks: self.blocks_of(p),
            len: p.len,
        }
    }

    /// Valid positions of `seq` (where its next token goes).
    pub fn seq_len(&self, seq: SeqId) -> Result<usize, KvError> {
        Ok(self.seq(seq)?.len)
    }

    /// Positions `seq` can hold without another [`reserve`](Self::reserve).
    pub fn capacity(&self, seq: SeqId) -> Result<usize, KvError> {
        Ok(self.seq(seq)?.capacity(self.block_size()))
    }

    /// Token ids of `seq`'s valid positions (assembled: O(length)).
    pub fn tokens(&self, seq: SeqId) -> Result<Vec<TokenId>, KvError> {
        Ok(self.tokens_of(self.seq(seq)?))
    }

    /// `seq`'s block table (assembled: O(blocks)).
    pub fn table(&self, seq: SeqId) -> Result<BlockTable, KvError> {
        Ok(self.table_of(self.seq(seq)?))
    }

    /// The pinned prefix's block table (assembled: O(blocks)); an error if the pin is
    /// unknown.
    pub fn pin_table(&self, pin: PinId) -> Result<BlockTable, KvError> {
        Ok(self.table_of(self.pin_state(pin)?))
    }

    /// Token ids of the pinned prefix (assembled: O(length)); an error if the pin is
    /// unknown.
    pub fn pin_tokens(&self, pin: PinId) -> Result<Vec<TokenId>, KvError> {
        Ok(self.tokens_of(self.pin_state(pin)?))
    }

    /// Whether `seq` is a live sequence (created and not freed).
    pub fn contains(&self, seq: SeqId) -> bool {
        self.seqs.contains_key(&seq)
    }

    /// Live sequences, in id order.
    pub fn sequence_ids(&self) -> Vec<SeqId> {
        let mut v: Vec<SeqId> = self.seqs.keys().copied().collect();
        v.sort();
        v
    }

    /// Live pins, in id order.
    pub fn pin_ids(&self) -> Vec<PinId> {
        let mut v: Vec<PinId> = self.pins.keys().copied().collect();
        v.sort();
        v
    }

    /// How many tables and pins list each block (indexed by block). The pool's
    /// refcounts count holders instead (a shared segment is one holder); both are zero
    /// for exactly the same blocks. O(blocks of every table).
    pub fn references(&self) -> Vec<u32> {
        let mut refs = vec![0u32; self.num_blocks()];
        for p in self.seqs.values().chain(self.pins.values()) {
            for b in self.blocks_of(p) {
                refs[b.index()] += 1;
            }
        }
        refs
    }

    /// Frozen segments alive (diagnostics: a fork adds at most one).
    pub fn segment_count(&self) -> usize {
        self.segments.len()
    }
}
