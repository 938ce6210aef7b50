//! The [`KvStore`] view of a [`KvCache`]: what [`Model::forward`](crate::model::Model::forward)
//! writes keys and values into and attention reads them from.
//!
//! `slot` is the raw value of a [`SeqId`] ([`SeqId::slot`]). `store` writes into the
//! block row of `position` (copying the block first if it is shared); it fails with
//! [`ModelError::KvStore`] if the position was not reserved. `chunks` returns one
//! [`KvChunk`](crate::model::KvChunk) per block (each `block_size` rows; the kernel
//! reads only `len` rows).

use super::cache::KvCache;
use super::ids::SeqId;
use crate::model::{KvChunks, KvSlot, KvStore, ModelError};

impl KvStore for KvCache {
    fn store(
        &mut self,
        layer: usize,
        slot: KvSlot,
        position: usize,
        key: &[f32],
        value: &[f32],
    ) -> Result<(), ModelError> {
        Ok(self.write(SeqId::from_slot(slot), layer, position, key, value)?)
    }

    fn chunks(&self, layer: usize, slot: KvSlot, len: usize) -> KvChunks<'_> {
        self.read_blocks(SeqId::from_slot(slot), layer, len)
    }
}
