//! Causal grouped-query attention that reads K/V from storage the engine owns.
//!
//! The model never holds per-sequence state: each forward hands it a [`KvStore`], into
//! which the new tokens' keys and values are written and from which attention reads
//! them back as a list of contiguous runs ([`KvChunk`]). A paged store returns one run
//! per block, a dense one a single run, and the kernel never concatenates a cache.

use rayon::prelude::*;

use super::error::ModelError;

/// A contiguous run of cached positions: `rows` keys and values, each `kv_dim` wide
/// (all KV heads of one position side by side).
#[derive(Debug, Clone, Copy)]
pub struct KvChunk<'a> {
    pub keys: &'a [f32],
    pub values: &'a [f32],
}

/// Per-sequence KV state, owned outside the model.
///
/// `slot` names a sequence in the store; the forward pass passes it through untouched.
pub trait KvStore: Sync {
    /// Stores one position's keys and values (`kv_dim` floats each) for `slot` in `layer`.
    fn store(
        &mut self,
        layer: usize,
        slot: usize,
        position: usize,
        key: &[f32],
        value: &[f32],
    ) -> Result<(), ModelError>;

    /// The runs that together hold positions `0..len` of `slot` in `layer`, in order.
    /// Runs may hold more rows than needed at the end; the kernel reads only `len`.
    fn chunks(&self, layer: usize, slot: usize, len: usize) -> Vec<KvChunk<'_>>;
}

/// Where one sequence's new tokens sit in a flattened batch.
#[derive(Debug, Clone, Copy)]
pub struct SeqSpan {
    pub slot: usize,
    /// Position of the first new token.
    pub start: usize,
    /// Index of the first new token's row in the flattened batch.
    pub row: usize,
    pub len: usize,
}

/// Shapes the kernel needs.
#[derive(Debug, Clone, Copy)]
pub struct AttentionShape {
    pub num_heads: usize,
    pub num_kv_heads: usize,
    pub head_dim: usize,
}

/// Attention of every new token over its sequence's cache (itself included).
///
/// `q` is `[rows, num_heads * head_dim]`; the result has the same shape. Work is split
/// over (token, head) pairs; each pair's arithmetic is a fixed sequential loop over
/// positions, so it does not depend on the batch or the thread count.
pub fn attend(
    store: &dyn KvStore,
    layer: usize,
    spans: &[SeqSpan],
    q: &[f32],
    shape: AttentionShape,
) -> Vec<f32> {
    let AttentionShape {
        num_heads,
        num_kv_heads,
        head_dim,
    } = shape;
    let q_dim = num_heads * head_dim;
    let kv_dim = num_kv_heads * head_dim;
    let group = num_heads / num_kv_heads;
    let scale = 1.0 / (head_dim as f32).sqrt();
    let rows = q.len() / q_dim;

    // Each row's sequence and position, and each sequence's runs, looked up once.
    let mut row_info = Vec::with_capacity(rows);
    let mut seq_chunks = Vec::with_capacity(spans.len());
    for (s, span) in spans.iter().enumerate() {
        seq_chunks.push(store.chunks(layer, span.slot, span.start + span.len));
        for i in 0..span.len {
            row_info.push((s, span.start + i));
        }
    }

    let mut out = vec![0f32; q.len()];
    out.par_chunks_mut(head_dim)
        .enumerate()
        .for_each(|(idx, out_h)| {
            let (row, head) = (idx / num_heads, idx % num_heads);
            let (s, position) = row_info[row];
            let kv_head = head / group;
            let q_h = &q[row * q_dim + head * head_dim..][..head_dim];
            let n = position + 1;
            let mut scores = Vec::with_capacity(n);
            let mut max = f32::NEG_INFINITY;
            'runs: for chunk in &seq_chunks[s] {
                for k_row in chunk.keys.chunks_exact(kv_dim) {
                    if scores.len() == n {
                        break 'runs;
                    }
                    let k_h = &k_row[kv_head * head_dim..][..head_dim];
                    let dot: f32 = q_h.iter().zip(k_h).map(|(a, b)| a * b).sum();
                    let sc = dot * scale;
                    max = max.max(sc);
                    scores.push(sc);
                }
            }
            let mut denom = 0f32;
            for sc in scores.iter_mut() {
                *sc = (*sc - max).exp();
                denom += *sc;
            }
            let inv = 1.0 / denom;
            let mut j = 0;
            'vals: for chunk in &seq_chunks[s] {
                for v_row in chunk.values.chunks_exact(kv_dim) {
                    if j == n {
                        break 'vals;
                    }
                    let p = scores[j] * inv;
                    let v_h = &v_row[kv_head * head_dim..][..head_dim];
                    for (o, v) in out_h.iter_mut().zip(v_h) {
                        *o += p * v;
                    }
                    j += 1;
                }
            }
        });
    out
}

/// The simplest [`KvStore`]: one growing buffer per sequence and layer. Used by
/// `generate`, tests and oracles; the engine uses the paged block pool instead.
#[derive(Debug, Default)]
pub struct DenseKvStore {
    num_layers: usize,
    kv_dim: usize,
    /// `seqs[slot][layer]` = (keys, values), each `len * kv_dim` floats.
    seqs: Vec<Vec<(Vec<f32>, Vec<f32>)>>,
}

impl DenseKvStore {
    pub fn new(num_layers: usize, kv_dim: usize) -> Self {
        DenseKvStore {
            num_layers,
            kv_dim,
            seqs: Vec::new(),
        }
    }

    /// Adds an empty sequence and returns its slot.
    pub fn add_sequence(&mut self) -> usize {
        self.seqs
            .push(vec![(Vec::new(), Vec::new()); self.num_layers]);
        self.seqs.len() - 1
    }

    /// Number of positions stored for `slot`.
    pub fn len(&self, slot: usize) -> usize {
        self.seqs
            .get(slot)
            .and_then(|layers| layers.first())
            .map_or(0, |(k, _)| k.len() / self.kv_dim.max(1))
    }

    pub fn is_empty(&self, slot: usize) -> bool {
        self.len(slot) == 0
    }

    /// Forgets positions from `len` on, so a sequence can be rewound.
    pub fn truncate(&mut self, slot: usize, len: usize) {
        if let Some(layers) = self.seqs.get_mut(slot) {
            for (k, v) in layers {
                k.truncate(len * self.kv_dim);
                v.truncate(len * self.kv_dim);
            }
        }
    }
}

impl KvStore for DenseKvStore {
    fn store(
        &mut self,
        layer: usize,
        slot: usize,
        position: usize,
        key: &[f32],
        value: &[f32],
    ) -> Result<(), ModelError> {
        let kv_dim = self.kv_dim;
        let (keys, values) = self
            .seqs
            .get_mut(slot)
            .and_then(|l| l.get_mut(layer))
            .ok_or_else(|| {
                ModelError::KvStore(format!("no sequence {slot} layer {layer}").into())
            })?;
        let len = keys.len() / kv_dim;
        if position < len {
            keys[position * kv_dim..][..kv_dim].copy_from_slice(key);
            values[position * kv_dim..][..kv_dim].copy_from_slice(value);
        } else if position == len {
            keys.extend_from_slice(key);
            values.extend_from_slice(value);
        } else {
            return Err(ModelError::KvStore(
                format!("sequence {slot}: position {position} written before {len}").into(),
            ));
        }
        Ok(())
    }

    fn chunks(&self, layer: usize, slot: usize, _len: usize) -> Vec<KvChunk<'_>> {
        match self.seqs.get(slot).and_then(|l| l.get(layer)) {
            Some((k, v)) => vec![KvChunk { keys: k, values: v }],
            None => Vec::new(),
        }
    }
}
