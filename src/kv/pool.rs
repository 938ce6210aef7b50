//! [`BlockPool`]: the preallocated KV memory, cut into fixed-size blocks.
//!
//! Per layer there is one f32 buffer for keys and one for values, each laid out
//! `[num_blocks, block_size, kv_dim]` (`kv_dim = n_kv_heads * head_dim`, all KV heads of a
//! position side by side, as the attention kernel reads them). The number of blocks
//! follows from a byte budget ([`KvConfig`]): one block costs
//! `2 * num_layers * block_size * kv_dim * 4` bytes, and nothing is allocated after
//! construction.
//!
//! The pool keeps a reference count per block and a free list; it does not know who
//! holds the references (tables, pins) nor about the prefix cache: a block whose count
//! drops to zero is handed back to the caller, which either parks it in the prefix
//! cache or [`recycle`](BlockPool::recycle)s it onto the free list.

use std::fmt;

use super::error::KvError;
use super::ids::BlockId;

/// Rows per block unless configured otherwise.
pub const DEFAULT_BLOCK_SIZE: usize = 16;

/// How the KV pool is sized.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KvConfig {
    /// Positions per block.
    pub block_size: usize,
    /// Bytes of KV memory (keys and values of all layers); rounded down to whole blocks.
    pub budget_bytes: usize,
}

impl KvConfig {
    /// Blocks of [`DEFAULT_BLOCK_SIZE`] within `budget_bytes`.
    pub fn with_budget(budget_bytes: usize) -> Self {
        KvConfig {
            block_size: DEFAULT_BLOCK_SIZE,
            budget_bytes,
        }
    }
}

/// Fixed-size KV blocks with reference counts and a free list.
pub struct BlockPool {
    num_layers: usize,
    kv_dim: usize,
    block_size: usize,
    num_blocks: usize,
    /// `keys[layer]`, `values[layer]`: `[num_blocks, block_size, kv_dim]` floats.
    keys: Vec<Vec<f32>>,
    values: Vec<Vec<f32>>,
    refcounts: Vec<u32>,
    /// Free blocks; the next allocation pops from the end (lowest ids first).
    free: Vec<BlockId>,
}

impl fmt::Debug for BlockPool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BlockPool")
            .field("num_layers", &self.num_layers)
            .field("kv_dim", &self.kv_dim)
            .field("block_size", &self.block_size)
            .field("num_blocks", &self.num_blocks)
            .field("free", &self.free.len())
            .finish()
    }
}

/// A zeroed buffer of `floats` f32s, or [`KvError::Alloc`]. The memory comes from
/// `alloc_zeroed` (fresh zero pages from the OS for a buffer this large), so a pool
/// costs physical memory only as its blocks are first written: a pool sized
/// generously from the machine's memory is cheap until it is used.
fn alloc_zeroed(floats: usize) -> Result<Vec<f32>, KvError> {
    let err = || KvError::Alloc {
        bytes: floats.saturating_mul(4),
    };
    if floats == 0 {
        return Ok(Vec::new());
    }
    let layout = std::alloc::Layout::array::<f32>(floats).map_err(|_| err())?;
    // SAFETY: the layout has a non-zero size; a null return is an allocation failure,
    // handled. A non-null pointer is a zeroed allocation of `floats` f32s from the
    // global allocator with f32's alignment — exactly what `Vec<f32>` with capacity
    // and length `floats` owns and frees — and all-zero bytes are a valid 0.0f32.
    unsafe {
        let ptr = std::alloc::alloc_zeroed(layout) as *mut f32;
        if ptr.is_null() {
            return Err(err());
        }
        Ok(Vec::from_raw_parts(ptr, floats, floats))
    }
}

impl BlockPool {
    /// Bytes one block takes across all layers, keys and values.
    pub fn block_bytes(num_layers: usize, block_size: usize, kv_dim: usize) -> Option<usize> {
        2usize
            .checked_mul(num_layers)?
            .checked_mul(block_size)?
            .checked_mul(kv_dim)?
            .checked_mul(std::mem::size_of::<f32>())
    }

    /// A pool of as many blocks as `config.budget_bytes` holds, all free.
    pub fn new(config: KvConfig, num_layers: usize, kv_dim: usize) -> Result<Self, KvError> {
        if config.block_size == 0 || num_layers == 0 || kv_dim == 0 {
            return Err(KvError::InvalidConfig(format!(
                "block_size {}, num_layers {num_layers} and kv_dim {kv_dim} must all be positive",
                config.block_size
            )));
        }
        let bytes_per_block = Self::block_bytes(num_layers, config.block_size, kv_dim)
            .ok_or_else(|| KvError::InvalidConfig("block size overflows".into()))?;
        let num_blocks = config.budget_bytes / bytes_per_block;
        if num_blocks == 0 {
            return Err(KvError::BudgetTooSmall {
                budget_bytes: config.budget_bytes,
                bytes_per_block,
            });
        }
        if num_blocks > u32::MAX as usize {
            return Err(KvError::InvalidConfig(format!(
                "{num_blocks} blocks exceed the {} a BlockId can name",
                u32::MAX
            )));
        }
        // Fits: num_blocks * bytes_per_block <= budget_bytes.
        let floats = num_blocks * config.block_size * kv_dim;
        let mut keys = Vec::with_capacity(num_layers);
        let mut values = Vec::with_capacity(num_layers);
        for _ in 0..num_layers {
            keys.push(alloc_zeroed(floats)?);
            values.push(alloc_zeroed(floats)?);
        }
        Ok(BlockPool {
            num_layers,
            kv_dim,
            block_size: config.block_size,
            num_blocks,
            keys,
            values,
            refcounts: vec![0; num_blocks],
            free: (0..num_blocks as u32).rev().map(BlockId::new).collect(),
        })
    }

    pub fn num_layers(&self) -> usize {
        self.num_layers
    }

    pub fn kv_dim(&self) -> usize {
        self.kv_dim
    }

    pub fn block_size(&self) -> usize {
        self.block_size
    }

    pub fn num_blocks(&self) -> usize {
        self.num_blocks
    }

    /// `2 * num_layers * block_size * kv_dim * 4`.
    pub fn bytes_per_block(&self) -> usize {
        self.block_size * self.bytes_per_token()
    }

    /// `2 * num_layers * kv_dim * 4`.
    pub fn bytes_per_token(&self) -> usize {
        2 * self.num_layers * self.kv_dim * std::mem::size_of::<f32>()
    }

    /// Blocks on the free list.
    pub fn free_count(&self) -> usize {
        self.free.len()
    }

    /// The free list (allocation order is from its end).
    pub fn free_blocks(&self) -> &[BlockId] {
        &self.free
    }

    pub fn refcount(&self, block: BlockId) -> u32 {
        self.refcounts[block.index()]
    }

    /// All reference counts, indexed by [`BlockId::index`].
    pub fn refcounts(&self) -> &[u32] {
        &self.refcounts
    }

    /// Takes a block off the free list with a reference count of one.
    pub fn allocate(&mut self) -> Option<BlockId> {
        let b = self.free.pop()?;
        debug_assert_eq!(self.refcounts[b.index()], 0);
        self.refcounts[b.index()] = 1;
        Some(b)
    }

    /// Adds a reference (also to a block at zero that is not on the free list, such as
    /// one taken out of the prefix cache).
    pub fn retain(&mut self, block: BlockId) {
        self.refcounts[block.index()] += 1;
    }

    /// Drops a reference and returns how many remain. At zero the block is neither
    /// free nor cached until the caller decides ([`recycle`](Self::recycle) or park it).
    pub fn release(&mut self, block: BlockId) -> u32 {
        let rc = &mut self.refcounts[block.index()];
        assert!(*rc > 0, "KV refcount underflow on {block}");
        *rc -= 1;
        *rc
    }

    /// Puts a block with no references back on the free list.
    pub fn recycle(&mut self, block: BlockId) {
        assert_eq!(self.refcounts[block.index()], 0, "recycling a used {block}");
        self.free.push(block);
    }

    fn block_range(&self, block: BlockId) -> std::ops::Range<usize> {
        let n = self.block_size * self.kv_dim;
        block.index() * n..(block.index() + 1) * n
    }

    /// Copies rows `0..rows` of `src` into `dst` in every layer, keys and values
    /// (copy-on-write of a shared, partly filled block).
    pub fn copy_block(&mut self, src: BlockId, dst: BlockId, rows: usize) {
        let rows = rows.min(self.block_size);
        if rows == 0 || src == dst {
            return;
        }
        let from = self.block_range(src).start;
        let to = self.block_range(dst).start;
        let n = rows * self.kv_dim;
        for buf in self.keys.iter_mut().chain(self.values.iter_mut()) {
            buf.copy_within(from..from + n, to);
        }
    }

    /// Writes one position's key and value (`kv_dim` floats each) into `row` of `block`.
    pub fn write_row(
        &mut self,
        layer: usize,
        block: BlockId,
        row: usize,
        key: &[f32],
        value: &[f32],
    ) {
        let at = self.block_range(block).start + row * self.kv_dim;
        self.keys[layer][at..at + self.kv_dim].copy_from_slice(key);
        self.values[layer][at..at + self.kv_dim].copy_from_slice(value);
    }

    /// The `block_size * kv_dim` keys of `block` in `layer`.
    pub fn keys(&self, layer: usize, block: BlockId) -> &[f32] {
        &self.keys[layer][self.block_range(block)]
    }

    /// The `block_size * kv_dim` values of `block` in `layer`.
    pub fn values(&self, layer: usize, block: BlockId) -> &[f32] {
        &self.values[layer][self.block_range(block)]
    }
}
