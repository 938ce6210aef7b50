//! The [`KvStore`] view of a [`KvCache`]: what [`Model::forward`](crate::model::Model::forward)
//! writes keys and values into and attention reads them from.
//!
//! `slot` is the raw value of a [`SeqId`] ([`SeqId::slot`]). `store` writes into the
//! block row of `position` (copying the block first if it is shared); it fails with
//! [`ModelError::KvStore`] if the position was not reserved. `chunks` returns one
//! [`KvChunk`] per block (each `block_size` rows; the kernel reads only `len` rows).

use super::cache::KvCache;
use super::ids::SeqId;
use super::storage::StoredBlock;
use crate::model::{KvChunk, KvChunks, KvStore, ModelError};

impl KvStore for KvCache {
    fn store(
        &mut self,
        layer: usize,
        slot: usize,
        position: usize,
        key: &[f32],
        value: &[f32],
    ) -> Result<(), ModelError> {
        Ok(self.write(SeqId::from_slot(slot), layer, position, key, value)?)
    }

    fn chunks(&self, layer: usize, slot: usize, len: usize) -> KvChunks<'_> {
        let heads = self.kv_heads();
        let blocks = self.read_blocks(SeqId::from_slot(slot), layer, len);
        // One format per pool: every block is of the first's kind.
        if let Some(StoredBlock::F16(..)) = blocks.first() {
            KvChunks::F16(
                blocks
                    .into_iter()
                    .filter_map(|b| match b {
                        StoredBlock::F16(k, v) => Some(KvChunk::head_major(k, v, heads)),
                        StoredBlock::F32(..) => None,
                    })
                    .collect(),
            )
        } else {
            KvChunks::F32(
                blocks
                    .into_iter()
                    .filter_map(|b| match b {
                        StoredBlock::F32(k, v) => Some(KvChunk::head_major(k, v, heads)),
                        StoredBlock::F16(..) => None,
                    })
                    .collect(),
            )
        }
    }
}
