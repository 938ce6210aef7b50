//! Frozen segments: immutable runs of full blocks that forked tables share as a whole.
//!
//! A table's full blocks are moved into a segment the first time the table is forked or
//! pinned; parent and child then both point at the segment, which is refcounted as one
//! unit. That is what makes a fork (and the free of a fork) O(1) in the prefix length:
//! no per-block refcount is touched, no block list or token history is copied. A
//! segment chains to the segment before it (`parent`), so a tree of forks is a tree of
//! segments, each block held by exactly one segment.
//!
//! A block's pool refcount counts its *holders*: the segments that list it (once each,
//! however many tables share the segment) plus the tables and pins that list it in their
//! own, unfrozen part. [`KvCache::references`](super::KvCache::references) gives the
//! other view — how many tables and pins see a block — for tests and diagnostics.

use super::ids::BlockId;
use super::prefix::BlockHash;
use crate::model::TokenId;

/// Index of a segment in [`Segments`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SegmentId(u32);

/// An immutable run of full blocks (positions `start_block * bs ..end_block() * bs`).
#[derive(Debug)]
pub struct Segment {
    /// The segment holding the blocks before this one.
    pub parent: Option<SegmentId>,
    /// Index of this segment's first block in every table that shares it.
    pub start_block: usize,
    /// The segment's blocks, in position order; all full.
    pub blocks: Vec<BlockId>,
    /// Token ids of the segment's positions (`blocks.len() * block_size`).
    pub tokens: Vec<TokenId>,
    /// Chain hashes of the segment's blocks.
    pub hashes: Vec<BlockHash>,
    /// Tables and pins whose frozen part ends here, plus child segments.
    pub refs: u32,
}

impl Segment {
    /// One past the index of the segment's last block.
    pub fn end_block(&self) -> usize {
        self.start_block + self.blocks.len()
    }
}

/// The arena of live segments.
#[derive(Debug, Default)]
pub struct Segments {
    slots: Vec<Option<Segment>>,
    free: Vec<u32>,
}

impl Segments {
    /// Stores a new segment (its `refs` as given).
    pub fn insert(&mut self, segment: Segment) -> SegmentId {
        match self.free.pop() {
            Some(i) => {
                self.slots[i as usize] = Some(segment);
                SegmentId(i)
            }
            None => {
                self.slots.push(Some(segment));
                SegmentId((self.slots.len() - 1) as u32)
            }
        }
    }

    /// A live segment. Ids come only from this arena and are released exactly once, so
    /// a dead id here is a bug in the cache, not a caller's error.
    pub fn get(&self, id: SegmentId) -> &Segment {
        self.slots[id.0 as usize]
            .as_ref()
            .expect("a live segment id")
    }

    /// Adds one reference to a live segment (a new table, pin or child segment sharing it).
    pub fn retain(&mut self, id: SegmentId) {
        if let Some(s) = self.slots[id.0 as usize].as_mut() {
            s.refs += 1;
        }
    }

    /// Drops one reference; the segment comes back (and leaves the arena) when that was
    /// the last, so the caller releases its blocks and its parent.
    pub fn release(&mut self, id: SegmentId) -> Option<Segment> {
        let slot = &mut self.slots[id.0 as usize];
        let s = slot.as_mut()?;
        s.refs -= 1;
        if s.refs > 0 {
            return None;
        }
        self.free.push(id.0);
        slot.take()
    }

    /// The chain ending at `last`, root first.
    pub fn chain(&self, last: Option<SegmentId>) -> Vec<SegmentId> {
        let mut out = Vec::new();
        let mut at = last;
        while let Some(id) = at {
            out.push(id);
            at = self.get(id).parent;
        }
        out.reverse();
        out
    }

    /// Every live segment.
    pub fn iter(&self) -> impl Iterator<Item = (SegmentId, &Segment)> {
        self.slots
            .iter()
            .enumerate()
            .filter_map(|(i, s)| s.as_ref().map(|s| (SegmentId(i as u32), s)))
    }

    /// Live segments.
    pub fn len(&self) -> usize {
        self.slots.len() - self.free.len()
    }

    /// Whether no segment is live.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}
