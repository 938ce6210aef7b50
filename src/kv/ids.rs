//! The KV layer's ids: [`BlockId`] (a block of the pool), [`SeqId`] (a live sequence,
//! whose raw value is the `slot` the model's [`KvStore`](crate::model::KvStore) sees)
//! and [`PinId`] (a pinned prefix). Newtypes, so one cannot be passed for another.
//!
//! Sequence and pin ids are never reused within one [`KvCache`](super::KvCache): a stale
//! id is an [`UnknownSequence`](super::KvError::UnknownSequence) /
//! [`UnknownPin`](super::KvError::UnknownPin) error, never someone else's data.

use std::fmt;

use crate::model::KvSlot;

/// A block of the [`BlockPool`](super::BlockPool): `block_size` rows in every layer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct BlockId(u32);

impl BlockId {
    /// The block with index `index` (the pool checks the range where it matters).
    pub fn new(index: u32) -> Self {
        BlockId(index)
    }

    /// Index into the pool's buffers and counters.
    pub fn index(self) -> usize {
        self.0 as usize
    }
}

impl fmt::Display for BlockId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "block {}", self.0)
    }
}

/// A live sequence of a [`KvCache`](super::KvCache).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SeqId(usize);

impl SeqId {
    /// The cache's sequence number `raw` (never reused within one cache).
    pub(crate) fn new(raw: usize) -> Self {
        SeqId(raw)
    }

    /// The `slot` to put in a [`BatchSeq`](crate::model::BatchSeq) for this sequence.
    pub fn slot(self) -> KvSlot {
        KvSlot::new(self.0)
    }

    /// The sequence a `slot` (e.g. of a [`SeqLogits`](crate::model::SeqLogits)) names.
    pub fn from_slot(slot: KvSlot) -> Self {
        SeqId(slot.raw())
    }
}

impl fmt::Display for SeqId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "sequence {}", self.0)
    }
}

/// A pinned prefix: references held on a prefix's blocks so branches can fork from it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PinId(u64);

impl PinId {
    pub(crate) fn new(raw: u64) -> Self {
        PinId(raw)
    }

    /// The pin's number (a cache numbers its pins from 0 in the order
    /// taken, never reusing one).
    pub fn raw(self) -> u64 {
        self.0
    }
}

impl fmt::Display for PinId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "pin {}", self.0)
    }
}
