//! A packed trie as the engine's forward sees a batch: each trie edge (a run of rows,
//! each the child of the one before) is a sequence of the batch, and [`TreeKvStore`]
//! hands attention the keys and values of its ancestors' rows and its own, so tree
//! attention *is* the engine's attention over a different store.
//!
//! The store holds one layer at a time (the forward writes a layer's keys and values
//! and reads them back before the next layer starts), as plain `[rows, kv_dim]` rows.

use crate::model::attention::SeqSpan;
use crate::model::kv_store::{KvChunk, KvChunks, KvSlot, KvStore};
use crate::model::ModelError;

use super::super::layout::TreeLayout;

/// The edges of `layout` as the batch's sequences: slot `i` is edge `i`, starting at
/// its first row's depth.
pub fn edge_spans(layout: &TreeLayout) -> Vec<SeqSpan> {
    let mut spans: Vec<SeqSpan> = Vec::new();
    for row in 0..layout.len() {
        let continues = row > 0 && layout.parent(row) == Some(row - 1);
        match spans.last_mut() {
            Some(last) if continues => last.len += 1,
            _ => spans.push(SeqSpan {
                slot: KvSlot::new(spans.len()),
                start: layout.positions()[row] as usize,
                row,
                len: 1,
            }),
        }
    }
    spans
}

/// One layer's keys and values of every row of a packed batch.
pub struct TreeKvStore<'a> {
    layout: &'a TreeLayout,
    spans: &'a [SeqSpan],
    kv_dim: usize,
    keys: Vec<f32>,
    values: Vec<f32>,
}

impl<'a> TreeKvStore<'a> {
    /// A zeroed store for one layer of `layout`'s rows, addressed through `spans`
    /// (from [`edge_spans`]); `kv_dim` is the width of one row's keys (and values),
    /// in f32 values.
    pub fn new(layout: &'a TreeLayout, spans: &'a [SeqSpan], kv_dim: usize) -> Self {
        TreeKvStore {
            layout,
            spans,
            kv_dim,
            keys: vec![0f32; layout.len() * kv_dim],
            values: vec![0f32; layout.len() * kv_dim],
        }
    }

    fn row_of(&self, slot: usize, position: usize) -> Option<usize> {
        let span = self.spans.get(slot)?;
        let i = position.checked_sub(span.start)?;
        (i < span.len).then_some(span.row + i)
    }
}

impl KvStore for TreeKvStore<'_> {
    fn store(
        &mut self,
        _layer: usize,
        slot: KvSlot,
        position: usize,
        key: &[f32],
        value: &[f32],
    ) -> Result<(), ModelError> {
        let row = self.row_of(slot.raw(), position).ok_or_else(|| {
            ModelError::KvStore(format!("no row at edge {slot} position {position}").into())
        })?;
        let at = row * self.kv_dim..(row + 1) * self.kv_dim;
        self.keys[at.clone()].copy_from_slice(key);
        self.values[at].copy_from_slice(value);
        Ok(())
    }

    fn chunks(&self, _layer: usize, slot: KvSlot, len: usize) -> KvChunks<'_> {
        let Some(span) = self.spans.get(slot.raw()) else {
            return KvChunks::F32(Vec::new());
        };
        // The first row's runs end at itself; the edge's later rows extend the last.
        let runs = self.layout.runs(span.row);
        let own_end = span.row + (len - span.start);
        let d = self.kv_dim;
        let chunks = runs
            .iter()
            .enumerate()
            .map(|(i, r)| {
                let end = if i + 1 == runs.len() {
                    own_end
                } else {
                    r.end as usize
                };
                let at = r.start as usize * d..end * d;
                KvChunk::rows(&self.keys[at.clone()], &self.values[at])
            })
            .collect();
        KvChunks::F32(chunks)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every edge's runs hold exactly its context: its ancestors' rows, then its own.
    #[test]
    fn each_edge_sees_its_ancestors_and_its_own_rows() {
        // 0 → 1 → 2, 1 → 3 → 4, 0 → 5, a second root 6 → 7, 2 → 8.
        let parents = vec![
            None,
            Some(0),
            Some(1),
            Some(1),
            Some(3),
            Some(0),
            None,
            Some(6),
            Some(2),
        ];
        let layout = TreeLayout::new(parents).unwrap();
        let spans = edge_spans(&layout);
        let kv_dim = 2;
        let mut store = TreeKvStore::new(&layout, &spans, kv_dim);
        for s in &spans {
            for i in 0..s.len {
                let row = (s.row + i) as f32;
                store
                    .store(0, s.slot, s.start + i, &[row, row], &[row, -row])
                    .unwrap();
            }
        }
        for s in &spans {
            for i in 0..s.len {
                let row = s.row + i;
                let len = s.start + i + 1;
                let KvChunks::F32(chunks) = store.chunks(0, s.slot, len) else {
                    panic!("f32 store")
                };
                let mut keys: Vec<usize> = chunks
                    .iter()
                    .flat_map(|c| c.keys.chunks(kv_dim).map(|k| k[0] as usize))
                    .collect();
                keys.truncate(len);
                let mut want = vec![row];
                let mut at = row;
                while let Some(p) = layout.parent(at) {
                    want.push(p);
                    at = p;
                }
                want.reverse();
                assert_eq!(keys, want, "row {row}");
            }
        }
    }
}
