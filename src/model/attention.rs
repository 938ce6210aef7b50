//! Causal grouped-query attention that reads K/V from storage the engine owns.
//!
//! The model never holds per-sequence state: each forward hands it a [`KvStore`], into
//! which the new tokens' keys and values are written and from which attention reads
//! them back as a list of contiguous runs ([`KvChunk`]). A paged store returns one run
//! per block, a dense one a single run, and the kernel never concatenates a cache.

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

/// One layer's attention for a whole batch, planned once: each new token's sequence
/// and position, and each sequence's KV runs, looked up before the work is split.
///
/// The work is one item per (token, head) pair, `items()` of them; each item's
/// arithmetic is a fixed sequential loop over positions, so it depends neither on the
/// batch nor on which thread computes it.
pub struct AttentionPlan<'a> {
    shape: AttentionShape,
    /// Per new token: its sequence (index into `seq_chunks`) and position.
    row_info: Vec<(usize, usize)>,
    seq_chunks: Vec<Vec<KvChunk<'a>>>,
}

impl<'a> AttentionPlan<'a> {
    pub fn new(
        store: &'a dyn KvStore,
        layer: usize,
        spans: &[SeqSpan],
        shape: AttentionShape,
    ) -> Self {
        let mut row_info = Vec::new();
        let mut seq_chunks = Vec::with_capacity(spans.len());
        for (s, span) in spans.iter().enumerate() {
            seq_chunks.push(store.chunks(layer, span.slot, span.start + span.len));
            for i in 0..span.len {
                row_info.push((s, span.start + i));
            }
        }
        AttentionPlan {
            shape,
            row_info,
            seq_chunks,
        }
    }

    /// (token, head) pairs: item `i` is token `i / num_heads`, head `i % num_heads`.
    pub fn items(&self) -> usize {
        self.row_info.len() * self.shape.num_heads
    }

    /// Computes item `idx` from `q` (`[rows, num_heads * head_dim]`) into `out_h`
    /// (`head_dim` values, which must be zero on entry).
    pub fn attend_item(&self, q: &[f32], idx: usize, out_h: &mut [f32]) {
        let AttentionShape {
            num_heads,
            num_kv_heads,
            head_dim,
        } = self.shape;
        let (q_dim, kv_dim) = (num_heads * head_dim, num_kv_heads * head_dim);
        let scale = 1.0 / (head_dim as f32).sqrt();
        let (row, head) = (idx / num_heads, idx % num_heads);
        let (s, position) = self.row_info[row];
        let kv_head = head / (num_heads / num_kv_heads);
        let q_h = &q[row * q_dim + head * head_dim..][..head_dim];
        let n = position + 1;
        let mut scores = Vec::with_capacity(n);
        let mut max = f32::NEG_INFINITY;
        'runs: for chunk in &self.seq_chunks[s] {
            for k_row in chunk.keys.chunks_exact(kv_dim) {
                if scores.len() == n {
                    break 'runs;
                }
                let sc = dot(q_h, &k_row[kv_head * head_dim..][..head_dim]) * scale;
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
        'vals: for chunk in &self.seq_chunks[s] {
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
    }
}

/// A dot product in a fixed order that vectorises: sixteen lane sums over the chunks
/// of sixteen, a sequential tail, then one fixed pairwise reduction. (A plain iterator
/// sum is one dependent chain of adds, four cycles per element: at long contexts it
/// was most of the attention's time.)
#[inline]
fn dot(a: &[f32], b: &[f32]) -> f32 {
    const L: usize = 16;
    let mut lanes = [0f32; L];
    let (ca, cb) = (a.chunks_exact(L), b.chunks_exact(L));
    let (ta, tb) = (ca.remainder(), cb.remainder());
    for (xa, xb) in ca.zip(cb) {
        for l in 0..L {
            lanes[l] = xa[l].mul_add(xb[l], lanes[l]);
        }
    }
    let mut tail = 0f32;
    for (x, y) in ta.iter().zip(tb) {
        tail = x.mul_add(*y, tail);
    }
    let mut width = L;
    while width > 1 {
        width /= 2;
        for l in 0..width {
            lanes[l] += lanes[l + width];
        }
    }
    lanes[0] + tail
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
