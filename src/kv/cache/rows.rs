//! Writes and reads of KV rows: what the model's forward stores through
//! [`KvStore`](crate::model::KvStore) and what attention reads back, block by block.

use super::KvCache;
use crate::kv::table::{blocks_for, BlockTable};
use crate::kv::{KvError, SeqId};
use crate::model::KvChunks;

impl KvCache {
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
        let (bs, kv_dim) = (self.block_size(), self.storage.kv_dim());
        if layer >= self.storage.num_layers() {
            return Err(KvError::BadLayer {
                layer,
                num_layers: self.storage.num_layers(),
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
        self.storage.write_row(layer, block, row, key, value);
        Ok(())
    }

    /// The blocks holding positions `0..len` of `seq` in `layer` (whole blocks: the last
    /// may hold more rows than `len` needs), as runs in the pool's format. Empty for an
    /// unknown sequence or layer.
    pub fn read_blocks(&self, seq: SeqId, layer: usize, len: usize) -> KvChunks<'_> {
        let mut ids = Vec::new();
        if let (Some(st), true) = (self.seqs.get(&seq), layer < self.storage.num_layers()) {
            let n = blocks_for(len, self.block_size()).min(st.frozen_blocks + st.blocks.len());
            let chain = self.segments.chain(st.frozen);
            let frozen = chain.iter().flat_map(|&id| &self.segments.get(id).blocks);
            ids.extend(frozen.chain(&st.blocks).take(n).copied());
        }
        self.storage.chunks(layer, &ids)
    }
}
