//! [`KvCache`]: the block pool plus every live sequence, pin and the prefix index —
//! what the engine owns and hands to [`Model::forward`](crate::model::Model::forward)
//! as its [`KvStore`](crate::model::KvStore).
//!
//! A sequence is a [`BlockTable`] plus the token ids of its valid positions (needed to
//! hash full blocks for the prefix index). Its life, as the engine drives it:
//!
//! 1. [`new_sequence`](KvCache::new_sequence), or [`start_sequence`](KvCache::start_sequence)
//!    with a prompt (adopts the longest cached run of full blocks; only the rest is
//!    prefilled), or [`fork`](KvCache::fork) / [`fork_pin`](KvCache::fork_pin).
//! 2. Per step: [`reserve`](KvCache::reserve)`(seq, n)` (allocates blocks and makes the
//!    blocks to be written private; fails with [`KvError::OutOfBlocks`] and changes
//!    nothing when the pool can't), the forward (writes positions `len..len+n` through
//!    [`KvStore::store`](crate::model::KvStore::store)), then
//!    [`commit`](KvCache::commit)`(seq, tokens)`, which makes them valid and indexes the
//!    blocks that became full.
//! 3. [`truncate`](KvCache::truncate) to rewind, [`pin`](KvCache::pin) to keep a prefix for
//!    later branches, [`free`](KvCache::free) when done.
//!
//! Copy-on-write: a block may be written in place only if exactly one holder has it and
//! it is not in the prefix index (indexed blocks are immutable). Otherwise the write
//! (in `reserve`, or as a fallback in `store`) first copies the block's valid rows into a
//! fresh block. Forking therefore copies no KV data: only the partly filled last block is
//! copied, by whichever side writes to it first.
//!
//! O(1) forks: a table is a chain of frozen [segments](super::segment) (full blocks,
//! shared and refcounted as a whole) plus its own part (full blocks not yet frozen, the
//! partly filled last block, reserved blocks). A fork first moves the parent's own full
//! blocks into a new segment (each block is frozen once), then gives the child the same
//! segment and one more reference on the partial block: the cost does not grow with
//! the prefix. Positions in a frozen segment are immutable; `truncate` below them
//! rebuilds the table's own part from the chain.

use std::collections::{HashMap, HashSet};

use super::error::KvError;
use super::ids::{BlockId, PinId, SeqId};
use super::pool::{BlockPool, KvConfig};
use super::prefix::{chain_hash, BlockHash, PrefixIndex, ROOT_HASH};
use super::segment::{Segment, SegmentId, Segments};
use super::table::{blocks_for, BlockTable};
use crate::model::{ModelConfig, TokenId};

mod preempt;

/// A table with what the prefix index needs to know about its tokens. Sequences and
/// pins are both this: a chain of frozen segments (blocks `0..frozen_blocks`) and the
/// table's own part after it.
#[derive(Debug, Clone)]
struct Prefix {
    /// The last segment of the frozen chain (`None` when `frozen_blocks == 0`).
    frozen: Option<SegmentId>,
    frozen_blocks: usize,
    /// Blocks from index `frozen_blocks` on: unfrozen full blocks, the partly filled
    /// last block, reserved blocks. The table holds one reference on each.
    blocks: Vec<BlockId>,
    /// Token ids of positions `frozen_blocks * bs..len`.
    tokens: Vec<TokenId>,
    /// Chain hashes of the own full blocks (`len / bs - frozen_blocks` of them).
    hashes: Vec<BlockHash>,
    /// Valid positions.
    len: usize,
    /// The prefix-cache epoch the KV was computed in; blocks of an older epoch (before a
    /// [`KvCache::clear_prefix_cache`]) are never indexed.
    epoch: u64,
}

impl Prefix {
    fn empty(epoch: u64) -> Self {
        Prefix {
            frozen: None,
            frozen_blocks: 0,
            blocks: Vec::new(),
            tokens: Vec::new(),
            hashes: Vec::new(),
            len: 0,
            epoch,
        }
    }

    /// Positions the table's blocks can hold.
    fn capacity(&self, bs: usize) -> usize {
        (self.frozen_blocks + self.blocks.len()) * bs
    }

    /// Moves the own full blocks into a new segment that `self` then ends with.
    /// Amortised O(1): every block is frozen once.
    fn freeze(&mut self, segments: &mut Segments, bs: usize) {
        let k = self.hashes.len();
        if k == 0 {
            return;
        }
        let rest = self.blocks.split_off(k);
        let blocks = std::mem::replace(&mut self.blocks, rest);
        let rest = self.tokens.split_off(k * bs);
        let tokens = std::mem::replace(&mut self.tokens, rest);
        let hashes = std::mem::take(&mut self.hashes);
        // The table's reference on its old last segment passes to the new segment.
        let id = segments.insert(Segment {
            parent: self.frozen,
            start_block: self.frozen_blocks,
            blocks,
            tokens,
            hashes,
            refs: 1,
        });
        self.frozen = Some(id);
        self.frozen_blocks += k;
    }
}

/// Block counts and sizes at one moment.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct KvStats {
    pub num_blocks: usize,
    pub block_size: usize,
    /// Blocks referenced by at least one table or pin.
    pub in_use: usize,
    /// Distinct blocks referenced by at least one pin (a subset of `in_use`).
    pub pinned: usize,
    /// Unreferenced blocks kept for prefix reuse (evictable).
    pub cached: usize,
    /// Blocks on the free list. `in_use + cached + free == num_blocks`.
    pub free: usize,
    /// Blocks in the prefix index (in use or cached).
    pub indexed: usize,
    pub bytes_per_block: usize,
    pub bytes_per_token: usize,
    /// Copy-on-write block copies so far.
    pub cow_copies: u64,
    /// Cached blocks evicted for reuse so far.
    pub evictions: u64,
}

/// Paged KV storage with forkable, pinnable prefixes and a prefix cache.
#[derive(Debug)]
pub struct KvCache {
    pool: BlockPool,
    index: PrefixIndex,
    segments: Segments,
    seqs: HashMap<SeqId, Prefix>,
    pins: HashMap<PinId, Prefix>,
    next_seq: usize,
    next_pin: u64,
    epoch: u64,
    cow_copies: u64,
    evictions: u64,
}

impl KvCache {
    /// A cache for a model of `num_layers` layers and `kv_dim` KV floats per position.
    pub fn new(config: KvConfig, num_layers: usize, kv_dim: usize) -> Result<Self, KvError> {
        let pool = BlockPool::new(config, num_layers, kv_dim)?;
        Ok(KvCache {
            index: PrefixIndex::new(pool.block_size()),
            pool,
            segments: Segments::default(),
            seqs: HashMap::new(),
            pins: HashMap::new(),
            next_seq: 0,
            next_pin: 0,
            epoch: 0,
            cow_copies: 0,
            evictions: 0,
        })
    }

    /// A cache shaped for `model`.
    pub fn for_model(config: KvConfig, model: &ModelConfig) -> Result<Self, KvError> {
        Self::new(config, model.num_layers, model.kv_dim())
    }

    // ----- sizes and counters -------------------------------------------------------

    /// The pool (read-only: refcounts, free list, raw block data).
    pub fn pool(&self) -> &BlockPool {
        &self.pool
    }

    pub fn block_size(&self) -> usize {
        self.pool.block_size()
    }

    pub fn num_blocks(&self) -> usize {
        self.pool.num_blocks()
    }

    pub fn bytes_per_block(&self) -> usize {
        self.pool.bytes_per_block()
    }

    pub fn bytes_per_token(&self) -> usize {
        self.pool.bytes_per_token()
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
        self.pool.num_blocks() - self.pool.free_count() - self.index.cached_len()
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
        self.index.cached_len()
    }

    pub fn free_blocks(&self) -> usize {
        self.pool.free_count()
    }

    /// Blocks a reservation could get right now (free + evictable).
    pub fn available_blocks(&self) -> usize {
        self.pool.free_count() + self.index.cached_len()
    }

    pub fn is_cached(&self, block: BlockId) -> bool {
        self.index.is_cached(block)
    }

    pub fn is_indexed(&self, block: BlockId) -> bool {
        self.index.is_indexed(block)
    }

    /// The cached blocks, most recently released first.
    pub fn cached_block_ids(&self) -> Vec<BlockId> {
        self.index.cached_blocks().collect()
    }

    pub fn stats(&self) -> KvStats {
        KvStats {
            num_blocks: self.num_blocks(),
            block_size: self.block_size(),
            in_use: self.blocks_in_use(),
            pinned: self.pinned_blocks(),
            cached: self.cached_blocks(),
            free: self.free_blocks(),
            indexed: self.index.indexed_len(),
            bytes_per_block: self.bytes_per_block(),
            bytes_per_token: self.bytes_per_token(),
            cow_copies: self.cow_copies,
            evictions: self.evictions,
        }
    }

    // ----- inspection ---------------------------------------------------------------

    fn seq(&self, seq: SeqId) -> Result<&Prefix, KvError> {
        self.seqs.get(&seq).ok_or(KvError::UnknownSequence(seq))
    }

    fn pin_state(&self, pin: PinId) -> Result<&Prefix, KvError> {
        self.pins.get(&pin).ok_or(KvError::UnknownPin(pin))
    }

    /// Every block of a table in position order: the frozen chain, then its own part.
    fn blocks_of(&self, p: &Prefix) -> Vec<BlockId> {
        let mut out = Vec::with_capacity(p.frozen_blocks + p.blocks.len());
        for id in self.segments.chain(p.frozen) {
            out.extend_from_slice(&self.segments.get(id).blocks);
        }
        out.extend_from_slice(&p.blocks);
        out
    }

    /// Token ids of a table's valid positions.
    fn tokens_of(&self, p: &Prefix) -> Vec<TokenId> {
        let mut out = Vec::with_capacity(p.len);
        for id in self.segments.chain(p.frozen) {
            out.extend_from_slice(&self.segments.get(id).tokens);
        }
        out.extend_from_slice(&p.tokens);
        out
    }

    /// Chain hashes of a table's full blocks.
    fn hashes_of(&self, p: &Prefix) -> Vec<BlockHash> {
        let mut out = Vec::with_capacity(p.len / self.block_size());
        for id in self.segments.chain(p.frozen) {
            out.extend_from_slice(&self.segments.get(id).hashes);
        }
        out.extend_from_slice(&p.hashes);
        out
    }

    fn table_of(&self, p: &Prefix) -> BlockTable {
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

    pub fn pin_table(&self, pin: PinId) -> Result<BlockTable, KvError> {
        Ok(self.table_of(self.pin_state(pin)?))
    }

    pub fn pin_tokens(&self, pin: PinId) -> Result<Vec<TokenId>, KvError> {
        Ok(self.tokens_of(self.pin_state(pin)?))
    }

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

    // ----- block bookkeeping --------------------------------------------------------

    /// A fresh block (refcount 1): from the free list, else by evicting the least
    /// recently released cached block.
    fn alloc_block(&mut self) -> Option<BlockId> {
        if let Some(b) = self.pool.allocate() {
            return Some(b);
        }
        let b = self.index.evict_lru()?;
        self.evictions += 1;
        self.pool.retain(b);
        Some(b)
    }

    /// Takes a reference on a block, taking it out of the prefix cache if it was there.
    fn retain_block(&mut self, block: BlockId) {
        if self.pool.refcount(block) == 0 {
            let was_cached = self.index.unpark(block);
            debug_assert!(was_cached, "retaining an unreferenced uncached {block}");
        }
        self.pool.retain(block);
    }

    /// Drops a reference; at zero an indexed block is parked in the prefix cache and
    /// any other block goes back to the free list.
    fn release_block(&mut self, block: BlockId) {
        if self.pool.release(block) == 0 {
            if self.index.is_indexed(block) {
                self.index.park(block);
            } else {
                self.pool.recycle(block);
            }
        }
    }

    /// Releases blocks last to first, so a chain's earlier blocks stay cached longest.
    fn release_all(&mut self, blocks: &[BlockId]) {
        for &b in blocks.iter().rev() {
            self.release_block(b);
        }
    }

    /// Drops one reference on a segment; a segment left unreferenced releases its
    /// blocks and its reference on its parent, and so on up the chain.
    fn release_segment(&mut self, mut at: Option<SegmentId>) {
        while let Some(id) = at {
            match self.segments.release(id) {
                Some(seg) => {
                    self.release_all(&seg.blocks);
                    at = seg.parent;
                }
                None => break,
            }
        }
    }

    /// Releases everything a table holds (own blocks last to first, then its chain).
    fn release_prefix(&mut self, p: Prefix) {
        self.release_all(&p.blocks);
        self.release_segment(p.frozen);
    }

    /// Whether `block` may be written in place by its (single) holder.
    fn writable(&self, block: BlockId) -> bool {
        self.pool.refcount(block) == 1 && !self.index.is_indexed(block)
    }

    fn out_of_blocks(&self, needed: usize) -> KvError {
        KvError::OutOfBlocks {
            needed,
            available: self.available_blocks(),
            total: self.num_blocks(),
        }
    }

    /// Replaces block `i` of `seq`'s table (in its own part) by a private copy of its
    /// first `rows` rows.
    fn copy_on_write(&mut self, seq: SeqId, i: usize, rows: usize) -> Result<BlockId, KvError> {
        let new = self.alloc_block().ok_or_else(|| self.out_of_blocks(1))?;
        let st = self
            .seqs
            .get_mut(&seq)
            .expect("caller checked the sequence");
        let own = i - st.frozen_blocks;
        let old = std::mem::replace(&mut st.blocks[own], new);
        if rows > 0 {
            self.pool.copy_block(old, new, rows);
            self.cow_copies += 1;
        }
        self.release_block(old);
        Ok(new)
    }

    /// Rows of block `i` that hold data to keep: positions below `max(len, upto)`.
    fn rows_to_keep(&self, i: usize, len: usize, upto: usize) -> usize {
        let bs = self.block_size();
        len.max(upto).saturating_sub(i * bs).min(bs)
    }

    fn insert_seq(&mut self, state: Prefix) -> SeqId {
        let id = SeqId::from_slot(self.next_seq);
        self.next_seq += 1;
        self.seqs.insert(id, state);
        id
    }

    /// A new table sharing every valid position of `p`, which must be frozen (no own
    /// full blocks): one more reference on its last segment and on its partly filled
    /// last block. O(1) in the prefix length.
    fn share(&mut self, p: &Prefix) -> Prefix {
        debug_assert!(p.hashes.is_empty(), "share() of an unfrozen table");
        if let Some(id) = p.frozen {
            self.segments.retain(id);
        }
        let partial = p.len > p.frozen_blocks * self.block_size();
        let blocks = if partial {
            vec![p.blocks[0]]
        } else {
            Vec::new()
        };
        for &b in &blocks {
            self.retain_block(b);
        }
        Prefix {
            frozen: p.frozen,
            frozen_blocks: p.frozen_blocks,
            blocks,
            tokens: p.tokens.clone(),
            hashes: Vec::new(),
            len: p.len,
            epoch: p.epoch,
        }
    }

    /// A new table holding the first `len` positions of `p` (references taken). Shares
    /// the longest run of `p`'s segments that ends at or before `len`; the blocks after
    /// it are listed (and referenced) one by one.
    fn prefix_of(&mut self, p: &Prefix, len: usize) -> Prefix {
        let bs = self.block_size();
        debug_assert!(len <= p.len);
        let full = len / bs;
        let need = blocks_for(len, bs);
        let mut out = if full >= p.frozen_blocks {
            if let Some(id) = p.frozen {
                self.segments.retain(id);
            }
            let skip = p.frozen_blocks * bs;
            Prefix {
                frozen: p.frozen,
                frozen_blocks: p.frozen_blocks,
                blocks: p.blocks[..need - p.frozen_blocks].to_vec(),
                tokens: p.tokens[..len - skip].to_vec(),
                hashes: p.hashes[..full - p.frozen_blocks].to_vec(),
                len,
                epoch: p.epoch,
            }
        } else {
            // The deepest segment of the chain that ends within the first `full` blocks.
            let chain = self.segments.chain(p.frozen);
            let keep = chain
                .iter()
                .rev()
                .copied()
                .find(|&id| self.segments.get(id).end_block() <= full);
            let start = keep.map_or(0, |id| self.segments.get(id).end_block());
            if let Some(id) = keep {
                self.segments.retain(id);
            }
            let (blocks, tokens, hashes) =
                (self.blocks_of(p), self.tokens_of(p), self.hashes_of(p));
            Prefix {
                frozen: keep,
                frozen_blocks: start,
                blocks: blocks[start..need].to_vec(),
                tokens: tokens[start * bs..len].to_vec(),
                hashes: hashes[start..full].to_vec(),
                len,
                epoch: p.epoch,
            }
        };
        let own = std::mem::take(&mut out.blocks);
        for &b in &own {
            self.retain_block(b);
        }
        out.blocks = own;
        out
    }

    // ----- sequences ----------------------------------------------------------------

    /// An empty sequence.
    pub fn new_sequence(&mut self) -> SeqId {
        self.insert_seq(Prefix::empty(self.epoch))
    }

    /// The longest run of cached full blocks holding a prefix of `tokens`, and the
    /// tokens they cover (a multiple of the block size). A lookup only: nothing is
    /// referenced; [`start_sequence`](Self::start_sequence) adopts the blocks.
    pub fn match_prefix(&self, tokens: &[TokenId]) -> (Vec<BlockId>, usize) {
        let (blocks, _) = self.index.lookup(tokens);
        let n = blocks.len() * self.block_size();
        (blocks, n)
    }

    /// A new sequence for `prompt` that starts with the cached full blocks of its
    /// longest cached prefix (one reference each, no data copied). Returns the sequence
    /// and how many of `prompt`'s tokens are already in it: the caller prefills
    /// `prompt[cached..]` at positions `cached..`.
    ///
    /// At least one token is always left to prefill (a non-empty prompt whose blocks are
    /// all cached comes back one token short), since the next token's logits need a
    /// forward; that last token's block is then copied on write.
    pub fn start_sequence(&mut self, prompt: &[TokenId]) -> (SeqId, usize) {
        let seq = self.new_sequence();
        let matched = self
            .adopt_cached_prefix(seq, prompt)
            .expect("a new sequence is empty");
        if matched > 0 && matched == prompt.len() {
            self.truncate(seq, matched - 1)
                .expect("a shorter length of a live sequence");
        }
        let len = self.seqs[&seq].len;
        (seq, len)
    }

    /// A new sequence sharing every block of `seq`'s valid positions, in O(1) of the
    /// prefix length (see the module docs: `seq`'s own full blocks are frozen into a
    /// segment both then share; no KV is copied). Blocks `seq` reserved beyond its
    /// length stay its own.
    pub fn fork(&mut self, seq: SeqId) -> Result<SeqId, KvError> {
        let bs = self.block_size();
        let st = self
            .seqs
            .get_mut(&seq)
            .ok_or(KvError::UnknownSequence(seq))?;
        st.freeze(&mut self.segments, bs);
        let st = self.seqs[&seq].clone();
        let child = self.share(&st);
        Ok(self.insert_seq(child))
    }
    /// Makes room for `n_new` more positions of `seq` (at `len..len + n_new`): allocates
    /// the missing blocks and replaces any of the blocks to be written that are shared
    /// or indexed by private copies, evicting cached blocks LRU-first if the free list
    /// runs dry. All or nothing: on [`KvError::OutOfBlocks`] nothing changed.
    pub fn reserve(&mut self, seq: SeqId, n_new: usize) -> Result<(), KvError> {
        let bs = self.block_size();
        let st = self.seq(seq)?;
        if n_new == 0 {
            return Ok(());
        }
        let start = st.len;
        let end = start.checked_add(n_new).ok_or(KvError::BeyondCapacity {
            seq,
            position: usize::MAX,
            capacity: st.capacity(bs),
        })?;
        let fb = st.frozen_blocks;
        let have = fb + st.blocks.len();
        let want = blocks_for(end, bs);
        // Blocks to be written start at `len / bs >= frozen_blocks`: all in the own part.
        let copies: Vec<usize> = (start / bs..have.min(want))
            .filter(|&i| !self.writable(st.blocks[i - fb]))
            .collect();
        let needed = want.saturating_sub(have) + copies.len();
        if needed > self.available_blocks() {
            return Err(self.out_of_blocks(needed));
        }
        for i in copies {
            let rows = self.rows_to_keep(i, start, 0);
            self.copy_on_write(seq, i, rows)?;
        }
        for _ in have..want {
            let b = self.alloc_block().ok_or_else(|| self.out_of_blocks(1))?;
            if let Some(st) = self.seqs.get_mut(&seq) {
                st.blocks.push(b);
            }
        }
        Ok(())
    }

    /// Declares that the KV of `tokens` has been stored at `seq`'s next positions
    /// (`len..len + tokens.len()`, all reserved): they become valid, and each block
    /// that became full is entered into the prefix index.
    pub fn commit(&mut self, seq: SeqId, tokens: &[TokenId]) -> Result<(), KvError> {
        let bs = self.block_size();
        let epoch = self.epoch;
        let st = self
            .seqs
            .get_mut(&seq)
            .ok_or(KvError::UnknownSequence(seq))?;
        let new_len = st.len + tokens.len();
        let capacity = st.capacity(bs);
        if new_len > capacity {
            return Err(KvError::BeyondCapacity {
                seq,
                position: new_len - 1,
                capacity,
            });
        }
        st.tokens.extend_from_slice(tokens);
        st.len = new_len;
        let fb = st.frozen_blocks;
        while fb + st.hashes.len() < new_len / bs {
            let i = st.hashes.len();
            let parent = match (st.hashes.last(), st.frozen) {
                (Some(&h), _) => h,
                (None, Some(id)) => *self
                    .segments
                    .get(id)
                    .hashes
                    .last()
                    .expect("segments are never empty"),
                (None, None) => ROOT_HASH,
            };
            let chunk = &st.tokens[i * bs..(i + 1) * bs];
            let hash = chain_hash(parent, chunk);
            st.hashes.push(hash);
            if st.epoch == epoch {
                self.index.register(hash, parent, chunk, st.blocks[i]);
            }
        }
        Ok(())
    }

    /// Rewinds `seq` to its first `len` positions, releasing the blocks past them
    /// (reserved ones included: `truncate(seq, seq_len)` cancels a reservation).
    pub fn truncate(&mut self, seq: SeqId, len: usize) -> Result<(), KvError> {
        let bs = self.block_size();
        let st = self
            .seqs
            .get_mut(&seq)
            .ok_or(KvError::UnknownSequence(seq))?;
        if len > st.len {
            return Err(KvError::BeyondLength {
                seq,
                len: st.len,
                requested: len,
            });
        }
        let fb = st.frozen_blocks;
        if len >= fb * bs {
            let keep = blocks_for(len, bs) - fb;
            let dropped = st.blocks.split_off(keep.min(st.blocks.len()));
            st.len = len;
            st.tokens.truncate(len - fb * bs);
            st.hashes.truncate(len / bs - fb);
            self.release_all(&dropped);
        } else {
            // Into the frozen chain: rebuild the table from its shared prefix.
            let old = st.clone();
            let new = self.prefix_of(&old, len);
            self.seqs.insert(seq, new);
            self.release_prefix(old);
        }
        Ok(())
    }

    /// Drops `seq`, releasing its blocks (indexed full ones stay cached for reuse).
    /// O(1) in the prefix it shares with other tables.
    pub fn free(&mut self, seq: SeqId) -> Result<(), KvError> {
        let st = self
            .seqs
            .remove(&seq)
            .ok_or(KvError::UnknownSequence(seq))?;
        self.release_prefix(st);
        Ok(())
    }

    // ----- pins ---------------------------------------------------------------------

    /// Pins `seq`'s current valid positions: their blocks stay referenced (never freed,
    /// never evicted) until [`unpin`](Self::unpin), whatever happens to `seq`.
    pub fn pin(&mut self, seq: SeqId) -> Result<PinId, KvError> {
        let len = self.seq_len(seq)?;
        self.pin_prefix(seq, len)
    }

    /// Pins the first `len` positions of `seq`.
    pub fn pin_prefix(&mut self, seq: SeqId, len: usize) -> Result<PinId, KvError> {
        let bs = self.block_size();
        let st = self
            .seqs
            .get_mut(&seq)
            .ok_or(KvError::UnknownSequence(seq))?;
        if len > st.len {
            return Err(KvError::BeyondLength {
                seq,
                len: st.len,
                requested: len,
            });
        }
        st.freeze(&mut self.segments, bs);
        let st = st.clone();
        let state = self.prefix_of(&st, len);
        let id = PinId::new(self.next_pin);
        self.next_pin += 1;
        self.pins.insert(id, state);
        Ok(id)
    }

    /// Releases a pin's references.
    pub fn unpin(&mut self, pin: PinId) -> Result<(), KvError> {
        let st = self.pins.remove(&pin).ok_or(KvError::UnknownPin(pin))?;
        self.release_prefix(st);
        Ok(())
    }

    /// A new sequence holding the pinned prefix (shared, as [`fork`](Self::fork)).
    pub fn fork_pin(&mut self, pin: PinId) -> Result<SeqId, KvError> {
        let bs = self.block_size();
        let st = self.pins.get_mut(&pin).ok_or(KvError::UnknownPin(pin))?;
        st.freeze(&mut self.segments, bs);
        let st = st.clone();
        let child = self.share(&st);
        Ok(self.insert_seq(child))
    }

    /// Valid positions of a pin.
    pub fn pin_len(&self, pin: PinId) -> Result<usize, KvError> {
        Ok(self.pin_state(pin)?.len)
    }

    // ----- prefix cache -------------------------------------------------------------

    /// Forgets every prefix-index entry and frees every cached block. Call it after a
    /// weight update: cached KV is stale. Live sequences and pins keep their blocks, but
    /// nothing computed before the call is ever matched again, and blocks such
    /// sequences fill later (mixing old and new KV) are not indexed either.
    pub fn clear_prefix_cache(&mut self) {
        for b in self.index.clear() {
            self.pool.recycle(b);
        }
        self.epoch += 1;
    }

    // ----- writes and reads (the KvStore side) -----------------------------------------

    /// Writes one position's key and value for `layer`. The block holding `position`
    /// must be reserved; if it is shared or indexed, it is first copied (copy-on-write,
    /// which can fail with [`KvError::OutOfBlocks`] if `reserve` was skipped). Positions
    /// in a frozen (shared) segment are immutable: [`KvError::Frozen`].
    pub fn write(
        &mut self,
        seq: SeqId,
        layer: usize,
        position: usize,
        key: &[f32],
        value: &[f32],
    ) -> Result<(), KvError> {
        let (bs, kv_dim) = (self.block_size(), self.pool.kv_dim());
        if layer >= self.pool.num_layers() {
            return Err(KvError::BadLayer {
                layer,
                num_layers: self.pool.num_layers(),
            });
        }
        for row in [key, value] {
            if row.len() != kv_dim {
                return Err(KvError::RowWidth {
                    expected: kv_dim,
                    found: row.len(),
                });
            }
        }
        let st = self.seq(seq)?;
        let (i, row) = BlockTable::locate(position, bs);
        if i < st.frozen_blocks {
            return Err(KvError::Frozen { seq, position });
        }
        let Some(&block) = st.blocks.get(i - st.frozen_blocks) else {
            return Err(KvError::BeyondCapacity {
                seq,
                position,
                capacity: st.capacity(bs),
            });
        };
        let block = if self.writable(block) {
            block
        } else {
            let rows = self.rows_to_keep(i, st.len, position);
            self.copy_on_write(seq, i, rows)?
        };
        self.pool.write_row(layer, block, row, key, value);
        Ok(())
    }

    /// The blocks holding positions `0..len` of `seq` in `layer` (whole blocks: the last
    /// may hold more rows than `len` needs). Empty for an unknown sequence or layer.
    pub fn read_blocks(&self, seq: SeqId, layer: usize, len: usize) -> Vec<(&[f32], &[f32])> {
        let Some(st) = self.seqs.get(&seq) else {
            return Vec::new();
        };
        if layer >= self.pool.num_layers() {
            return Vec::new();
        }
        let n = blocks_for(len, self.block_size()).min(st.frozen_blocks + st.blocks.len());
        let mut out = Vec::with_capacity(n);
        let chain = self.segments.chain(st.frozen);
        let frozen = chain.iter().flat_map(|&id| &self.segments.get(id).blocks);
        for &b in frozen.chain(&st.blocks).take(n) {
            out.push((self.pool.keys(layer, b), self.pool.values(layer, b)));
        }
        out
    }

    // ----- self-check ---------------------------------------------------------------

    /// Checks the layer's invariants; `Err` names the first one broken. O(blocks).
    ///
    /// - every block's refcount equals its holders: the live segments listing it plus
    ///   the tables and pins listing it in their own part;
    /// - every segment's refcount equals the tables, pins and segments ending on it;
    ///   segments chain without gaps and hold whole blocks of tokens and hashes;
    /// - every block is exactly one of: in use (refcount > 0), cached, free;
    /// - cached blocks are indexed; pinned blocks are in use (so never evicted);
    /// - every table's length fits its blocks and matches its token history.
    pub fn check_invariants(&self) -> Result<(), String> {
        let n = self.num_blocks();
        let bs = self.block_size();
        let mut refs = vec![0u32; n];
        let mut seg_refs: HashMap<SegmentId, u32> = HashMap::new();
        for (id, seg) in self.segments.iter() {
            if seg.blocks.is_empty()
                || seg.tokens.len() != seg.blocks.len() * bs
                || seg.hashes.len() != seg.blocks.len()
            {
                return Err(format!("segment {id:?}: sizes out of step"));
            }
            let parent_end = seg.parent.map_or(0, |p| self.segments.get(p).end_block());
            if seg.start_block != parent_end {
                return Err(format!("segment {id:?}: starts at {}", seg.start_block));
            }
            if let Some(p) = seg.parent {
                *seg_refs.entry(p).or_default() += 1;
            }
            for b in &seg.blocks {
                refs[b.index()] += 1;
            }
        }
        for (what, st) in self
            .seqs
            .iter()
            .map(|(id, st)| (id.to_string(), st))
            .chain(self.pins.iter().map(|(id, st)| (id.to_string(), st)))
        {
            let frozen_end = st.frozen.map_or(0, |f| self.segments.get(f).end_block());
            if st.frozen_blocks != frozen_end {
                return Err(format!("{what}: frozen blocks out of step"));
            }
            if let Some(f) = st.frozen {
                *seg_refs.entry(f).or_default() += 1;
            }
            if st.len > st.capacity(bs) || st.len < st.frozen_blocks * bs {
                return Err(format!("{what}: length {} past its blocks", st.len));
            }
            if st.tokens.len() != st.len - st.frozen_blocks * bs
                || st.hashes.len() != st.len / bs - st.frozen_blocks
            {
                return Err(format!("{what}: token history out of step"));
            }
            for b in &st.blocks {
                refs[b.index()] += 1;
            }
        }
        for (id, seg) in self.segments.iter() {
            let expected = seg_refs.get(&id).copied().unwrap_or(0);
            if seg.refs != expected {
                return Err(format!(
                    "segment {id:?}: refcount {} but {expected} references",
                    seg.refs
                ));
            }
        }
        let mut seen = vec![0u8; n];
        for b in self.pool.free_blocks() {
            seen[b.index()] += 1;
        }
        for b in self.index.cached_blocks() {
            seen[b.index()] += 1;
            if !self.index.is_indexed(b) {
                return Err(format!("cached {b} is not indexed"));
            }
        }
        for i in 0..n {
            let b = BlockId::new(i as u32);
            let rc = self.pool.refcount(b);
            if rc != refs[i] {
                return Err(format!("{b}: refcount {rc} but {} holders", refs[i]));
            }
            let states = seen[i] as u32 + u32::from(rc > 0);
            if states != 1 {
                return Err(format!("{b}: in {states} of in-use / cached / free"));
            }
        }
        Ok(())
    }
}
