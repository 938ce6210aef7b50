//! [`KvCache`]: the block pool plus every live sequence, pin and the prefix index —
//! what the engine owns and hands to [`Model::forward`](crate::model::Model::forward)
//! as its [`KvStore`](crate::model::KvStore).
//!
//! A sequence is a [`BlockTable`](super::BlockTable) plus the token ids of its valid
//! positions (needed to hash full blocks for the prefix index). Its life, as the
//! engine drives it:
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
//!
//! This file holds the tables' state machine (block bookkeeping and the sequence
//! operations); beside it: `inspect` (sizes, counters, read-only views), `pins`
//! (pins, clearing the prefix cache), `rows` (the KV rows a forward writes and
//! reads), `preempt` (what the engine's preemption needs), `check` (the self-check).

use std::collections::HashMap;

use super::error::KvError;
use super::ids::{BlockId, PinId, SeqId};
use super::pool::BlockPool;
use super::prefix::{chain_hash, BlockHash, ROOT_HASH};
use super::segment::{Segment, SegmentId, Segments};
use super::storage::{KvConfig, KvStorage};
use super::table::blocks_for;
use crate::model::{ModelConfig, TokenId};

mod check;
mod inspect;
mod pins;
mod preempt;
mod rows;

/// The state of one block table — a sequence's or a pin's — with what the prefix
/// index needs to know about its tokens. Sequences and pins are both this: a chain of frozen segments (blocks `0..frozen_blocks`) and the
/// table's own part after it.
#[derive(Debug, Clone)]
struct TableState {
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

impl TableState {
    fn empty(epoch: u64) -> Self {
        TableState {
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
    /// Blocks in the pool (fixed when the cache is made).
    pub num_blocks: usize,
    /// Positions (token rows) per block.
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
    /// Bytes one block takes: keys and values of every layer for `block_size` positions.
    pub bytes_per_block: usize,
    /// Bytes one position takes: keys and values of every layer.
    pub bytes_per_token: usize,
    /// Copy-on-write block copies so far.
    pub cow_copies: u64,
    /// Cached blocks evicted for reuse so far.
    pub evictions: u64,
}

/// Paged KV storage with forkable, pinnable prefixes and a prefix cache.
#[derive(Debug)]
pub struct KvCache {
    storage: KvStorage,
    /// Every block's state: refcounts, free list, cached LRU, prefix index.
    pool: BlockPool,
    segments: Segments,
    seqs: HashMap<SeqId, TableState>,
    pins: HashMap<PinId, TableState>,
    next_seq: usize,
    next_pin: u64,
    epoch: u64,
    cow_copies: u64,
}

impl KvCache {
    /// A cache for a model of `num_layers` layers and `kv_dim` KV floats per position.
    pub fn new(config: KvConfig, num_layers: usize, kv_dim: usize) -> Result<Self, KvError> {
        Self::with_storage(KvStorage::new(config, num_layers, kv_dim)?)
    }

    fn with_storage(storage: KvStorage) -> Result<Self, KvError> {
        Ok(KvCache {
            pool: BlockPool::new(storage.num_blocks(), storage.block_size()),
            storage,
            segments: Segments::default(),
            seqs: HashMap::new(),
            pins: HashMap::new(),
            next_seq: 0,
            next_pin: 0,
            epoch: 0,
            cow_copies: 0,
        })
    }

    /// A cache shaped for `model`, each block storing one KV head after the other.
    pub fn for_model(config: KvConfig, model: &ModelConfig) -> Result<Self, KvError> {
        let storage =
            KvStorage::with_heads(config, model.num_layers, model.kv_dim(), model.num_kv_heads)?;
        Self::with_storage(storage)
    }

    /// KV heads each block stores one after the other (1: plain rows of `kv_dim`).
    pub fn kv_heads(&self) -> usize {
        self.storage.kv_heads()
    }

    /// The number format the pool stores keys and values in.
    pub fn format(&self) -> crate::model::KvFormat {
        self.storage.format()
    }

    // ----- block bookkeeping --------------------------------------------------------

    /// Releases blocks last to first, so a chain's earlier blocks stay cached longest.
    fn release_all(&mut self, blocks: &[BlockId]) {
        for &b in blocks.iter().rev() {
            self.pool.release(b);
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
    fn release_prefix(&mut self, p: TableState) {
        self.release_all(&p.blocks);
        self.release_segment(p.frozen);
    }

    /// Whether `block` may be written in place by its (single) holder.
    fn writable(&self, block: BlockId) -> bool {
        self.pool.refcount(block) == 1 && !self.pool.is_indexed(block)
    }

    /// A block from the pool (refcount 1), its memory's next blocks touched ahead
    /// of use ([`KvStorage::touch_ahead`]).
    fn allocate(&mut self) -> Result<BlockId, KvError> {
        let b = self.pool.allocate().ok_or_else(|| self.out_of_blocks(1))?;
        self.storage.touch_ahead(b);
        Ok(b)
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
        let new = self.allocate()?;
        let st = self
            .seqs
            .get_mut(&seq)
            .expect("caller checked the sequence");
        let own = i - st.frozen_blocks;
        let old = std::mem::replace(&mut st.blocks[own], new);
        if rows > 0 {
            self.storage.copy_block(old, new, rows);
            self.cow_copies += 1;
        }
        self.pool.release(old);
        Ok(new)
    }

    /// Rows of block `i` that hold data to keep: positions below `max(len, upto)`.
    fn rows_to_keep(&self, i: usize, len: usize, upto: usize) -> usize {
        let bs = self.block_size();
        len.max(upto).saturating_sub(i * bs).min(bs)
    }

    fn insert_seq(&mut self, state: TableState) -> SeqId {
        let id = SeqId::new(self.next_seq);
        self.next_seq += 1;
        self.seqs.insert(id, state);
        id
    }

    /// A new table sharing every valid position of `p`, which must be frozen (no own
    /// full blocks): one more reference on its last segment and on its partly filled
    /// last block. O(1) in the prefix length.
    fn share(&mut self, p: &TableState) -> TableState {
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
            self.pool.retain(b);
        }
        TableState {
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
    fn prefix_of(&mut self, p: &TableState, len: usize) -> TableState {
        let bs = self.block_size();
        debug_assert!(len <= p.len);
        let full = len / bs;
        let need = blocks_for(len, bs);
        let mut out = if full >= p.frozen_blocks {
            if let Some(id) = p.frozen {
                self.segments.retain(id);
            }
            let skip = p.frozen_blocks * bs;
            TableState {
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
            TableState {
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
            self.pool.retain(b);
        }
        out.blocks = own;
        out
    }

    // ----- sequences ----------------------------------------------------------------

    /// An empty sequence.
    pub fn new_sequence(&mut self) -> SeqId {
        self.insert_seq(TableState::empty(self.epoch))
    }

    /// The longest run of cached full blocks holding a prefix of `tokens`, and the
    /// tokens they cover (a multiple of the block size). A lookup only: nothing is
    /// referenced; [`start_sequence`](Self::start_sequence) adopts the blocks.
    pub fn match_prefix(&self, tokens: &[TokenId]) -> (Vec<BlockId>, usize) {
        let (blocks, _) = self.pool.lookup(tokens);
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
            let b = self.allocate()?;
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
                self.pool.register(hash, parent, chunk, st.blocks[i]);
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
}
