//! The seam between the model and the KV state the engine owns: the [`KvStore`] trait
//! the forward writes new keys and values into and attention reads them back from, the
//! runs it hands out ([`KvChunk`], in the store's number format: [`KvChunks`]), and
//! [`DenseKvStore`], the simplest store (one growing buffer per sequence and layer).

use std::fmt;

use half::f16;

use super::error::ModelError;

/// A sequence's name in a [`KvStore`], chosen by the store (the dense store's index of
/// it, the paged cache's `SeqId`) and carried through the forward pass untouched.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct KvSlot(usize);

impl KvSlot {
    /// The slot a store numbers `raw`.
    pub fn new(raw: usize) -> Self {
        KvSlot(raw)
    }

    /// The store's number for it (an index, for the stores that keep a list).
    pub fn raw(self) -> usize {
        self.0
    }
}

impl fmt::Display for KvSlot {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// A contiguous run of cached positions' keys and values, `kv_dim` values a position
/// (`f32`, or `f16` from a store that keeps them in half precision, see
/// [`super::KvFormat`]), laid out either as plain rows (all KV heads of a position side
/// by side: `heads` is 1) or head after head (`[heads, rows, head_dim]`: one KV head's
/// rows contiguous, the paged cache's blocks). Values are laid out as the keys.
#[derive(Debug)]
pub struct KvChunk<'a, T = f32> {
    /// The run's keys, laid out as the type's docs say.
    pub keys: &'a [T],
    /// The run's values, laid out as the keys.
    pub values: &'a [T],
    /// 1 for plain rows, else the number of KV heads stored one after the other.
    pub heads: usize,
}

// By hand: a derive would ask `T: Copy`, and a chunk copies only references.
impl<T> Clone for KvChunk<'_, T> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<T> Copy for KvChunk<'_, T> {}

/// The runs holding one sequence's cached positions of one layer, in the store's
/// number format.
#[derive(Debug)]
pub enum KvChunks<'a> {
    /// Runs of a store keeping keys and values in f32.
    F32(Vec<KvChunk<'a, f32>>),
    /// Runs of a store keeping keys and values in f16.
    F16(Vec<KvChunk<'a, f16>>),
}

impl<'a> KvChunks<'a> {
    /// Runs in the list.
    pub fn len(&self) -> usize {
        match self {
            KvChunks::F32(c) => c.len(),
            KvChunks::F16(c) => c.len(),
        }
    }

    /// Whether there is no run (nothing cached).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The runs of an f32 store, `None` from an f16 one.
    pub fn into_f32(self) -> Option<Vec<KvChunk<'a, f32>>> {
        match self {
            KvChunks::F32(c) => Some(c),
            KvChunks::F16(_) => None,
        }
    }
}

impl<'a, T> KvChunk<'a, T> {
    /// Plain rows of `kv_dim`.
    pub fn rows(keys: &'a [T], values: &'a [T]) -> Self {
        KvChunk {
            keys,
            values,
            heads: 1,
        }
    }

    /// `[heads, rows, head_dim]`.
    pub fn head_major(keys: &'a [T], values: &'a [T], heads: usize) -> Self {
        KvChunk {
            keys,
            values,
            heads,
        }
    }

    /// Positions this run holds.
    pub(super) fn positions(&self, kv_dim: usize) -> usize {
        self.keys.len() / kv_dim
    }

    /// Where KV head `h`'s first row starts in `data` (this run's keys or values), and
    /// how far apart its rows lie: `head_dim` when head-major, `kv_dim` for plain rows.
    pub(super) fn head_start(
        &self,
        data: &'a [T],
        h: usize,
        kv_dim: usize,
        head_dim: usize,
    ) -> (&'a [T], usize) {
        if self.heads == 1 {
            (&data[h * head_dim..], kv_dim)
        } else {
            (&data[h * (data.len() / kv_dim) * head_dim..], head_dim)
        }
    }

    /// The first `rows` rows of KV head `h` in `data`, `head_dim` wide each.
    pub(super) fn head_rows(
        &self,
        data: &'a [T],
        h: usize,
        rows: usize,
        kv_dim: usize,
        head_dim: usize,
    ) -> impl Iterator<Item = &'a [T]> {
        let (start, stride) = self.head_start(data, h, kv_dim, head_dim);
        start
            .chunks(stride)
            .take(rows)
            .map(move |row| &row[..head_dim])
    }
}

/// Per-sequence KV state, owned outside the model.
///
/// `slot` names a sequence in the store; the forward pass passes it through untouched.
pub trait KvStore: Sync {
    /// Stores one position's keys and values (`kv_dim` floats each) for `slot` in `layer`.
    fn store(
        &mut self,
        layer: usize,
        slot: KvSlot,
        position: usize,
        key: &[f32],
        value: &[f32],
    ) -> Result<(), ModelError>;

    /// The runs that together hold positions `0..len` of `slot` in `layer`, in order.
    /// Runs may hold more rows than needed at the end; the kernel reads only `len`.
    /// A store keeping K/V in f16 must only be handed values f16 holds exactly (the
    /// model rounds them first under [`super::KvFormat::F16`]), so both formats give
    /// attention the same values.
    fn chunks(&self, layer: usize, slot: KvSlot, len: usize) -> KvChunks<'_>;
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
    /// An empty store for a model of `num_layers` layers and `kv_dim` floats of keys (and
    /// of values) per position.
    pub fn new(num_layers: usize, kv_dim: usize) -> Self {
        DenseKvStore {
            num_layers,
            kv_dim,
            seqs: Vec::new(),
        }
    }

    /// Adds an empty sequence and returns its slot.
    pub fn add_sequence(&mut self) -> KvSlot {
        self.seqs
            .push(vec![(Vec::new(), Vec::new()); self.num_layers]);
        KvSlot(self.seqs.len() - 1)
    }

    /// Number of positions stored for `slot`.
    pub fn len(&self, slot: KvSlot) -> usize {
        self.seqs
            .get(slot.0)
            .and_then(|layers| layers.first())
            .map_or(0, |(k, _)| k.len() / self.kv_dim.max(1))
    }

    /// Whether `slot` holds no position (also for an unknown slot).
    pub fn is_empty(&self, slot: KvSlot) -> bool {
        self.len(slot) == 0
    }

    /// Forgets positions from `len` on, so a sequence can be rewound.
    pub fn truncate(&mut self, slot: KvSlot, len: usize) {
        if let Some(layers) = self.seqs.get_mut(slot.0) {
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
        slot: KvSlot,
        position: usize,
        key: &[f32],
        value: &[f32],
    ) -> Result<(), ModelError> {
        let kv_dim = self.kv_dim;
        let (keys, values) = self
            .seqs
            .get_mut(slot.0)
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

    fn chunks(&self, layer: usize, slot: KvSlot, _len: usize) -> KvChunks<'_> {
        KvChunks::F32(match self.seqs.get(slot.0).and_then(|l| l.get(layer)) {
            Some((k, v)) => vec![KvChunk::rows(k, v)],
            None => Vec::new(),
        })
    }
}
