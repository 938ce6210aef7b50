//! [`KvStorage`]: the preallocated KV memory, cut into fixed-size blocks — the bytes
//! only; which block is free, cached or in use is [`BlockPool`](super::BlockPool)'s.
//!
//! Per layer there is one buffer for keys and one for values (f32, or f16 for a model
//! that keeps them so: [`KvFormat`]), each laid out
//! `[num_blocks, kv_heads, block_size, head_dim]` (`kv_dim = kv_heads * head_dim`): within
//! a block, one KV head's rows are contiguous, so attention, which reads one KV head
//! of every position at a time, streams a block's 4 KiB of that head instead of a
//! 256-byte piece of every 768-byte row (on the default model that read pattern ran
//! at a third of the speed; `examples/speed/attention_speed.rs`). With one KV head the layout
//! is plain rows of `kv_dim`. The number of blocks
//! follows from a byte budget ([`KvConfig`]): one block costs
//! `2 * num_layers * block_size * kv_dim * format.bytes()` bytes, and nothing is
//! allocated after construction. An f16 pool's buffers are f32 words viewed as twice as
//! many f16s (both types accept any bits, and f16's alignment divides f32's).

use std::fmt;

use super::error::{KvConfigError, KvError};
use super::ids::BlockId;
use half::f16;

use crate::model::huge_pages;
use crate::model::team::{self, SharedBuf};
use crate::model::{KvChunk, KvChunks, KvFormat};

/// About how much of the pool [`KvStorage::touch_ahead`] keeps written ahead of use.
pub const TOUCH_AHEAD_BYTES: usize = 64 << 20;

/// Floats in a 4 KiB page.
const PAGE_FLOATS: usize = 1024;

/// Rows per block unless configured otherwise.
///
/// 64, not the 16 vLLM uses on GPUs: decode attention on a CPU waits on memory latency
/// (each block is a separate run of rows the prefetcher must find), and 64-row runs read
/// K/V about 1.5x faster than 16-row ones (`attention_speed 1024 16 0`, 14-17 -> 10-11 ns
/// a (head, key)), the main command about 9% faster, results bit-identical. The cost is
/// at most 63 unused rows per sequence and prompt sharing in 64-token steps.
pub const DEFAULT_BLOCK_SIZE: usize = 64;

/// How the KV pool is sized.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KvConfig {
    /// Positions per block.
    pub block_size: usize,
    /// Bytes of KV memory (keys and values of all layers); rounded down to whole blocks.
    pub budget_bytes: usize,
    /// The number format of the stored values: the served model's
    /// ([`crate::model::Model::kv_format`]).
    pub format: KvFormat,
}

impl KvConfig {
    /// f32 blocks of [`DEFAULT_BLOCK_SIZE`] within `budget_bytes`.
    pub fn with_budget(budget_bytes: usize) -> Self {
        KvConfig {
            block_size: DEFAULT_BLOCK_SIZE,
            budget_bytes,
            format: KvFormat::F32,
        }
    }
}

/// The K and V buffers of every layer, addressed by block.
pub struct KvStorage {
    num_layers: usize,
    kv_dim: usize,
    /// KV heads a row holds side by side in `kv_dim`; each block stores them one
    /// after the other.
    kv_heads: usize,
    block_size: usize,
    num_blocks: usize,
    format: KvFormat,
    /// `keys[layer]`, `values[layer]`: `[num_blocks, kv_heads, block_size, head_dim]`
    /// values of `format`, in f32 words (half as many for f16).
    keys: Vec<Vec<f32>>,
    values: Vec<Vec<f32>>,
    /// Blocks `0..touched` have had their pages written ahead of use
    /// ([`Self::touch_ahead`]).
    touched: usize,
}

impl fmt::Debug for KvStorage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KvStorage")
            .field("num_layers", &self.num_layers)
            .field("kv_dim", &self.kv_dim)
            .field("kv_heads", &self.kv_heads)
            .field("block_size", &self.block_size)
            .field("num_blocks", &self.num_blocks)
            .field("format", &self.format)
            .finish()
    }
}

/// A zeroed buffer of `floats` f32s, or [`KvError::Alloc`]. The memory comes from
/// `alloc_zeroed` (fresh zero pages from the OS for a buffer this large), so a pool
/// costs physical memory only as its blocks are first written (and
/// [`TOUCH_AHEAD_BYTES`] ahead of them): a pool sized generously from the machine's
/// memory is cheap until it is used.
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
        let buf = Vec::from_raw_parts(ptr, floats, floats);
        // Before any write: blocks are scattered through the pool, and with 4 KiB
        // pages attention's reads of them miss the TLB (module docs of `huge_pages`).
        huge_pages::advise(&buf);
        Ok(buf)
    }
}

impl KvStorage {
    /// Bytes one block takes across all layers, keys and values.
    pub fn block_bytes(
        num_layers: usize,
        block_size: usize,
        kv_dim: usize,
        format: KvFormat,
    ) -> Option<usize> {
        2usize
            .checked_mul(num_layers)?
            .checked_mul(block_size)?
            .checked_mul(kv_dim)?
            .checked_mul(format.bytes())
    }

    /// Buffers for as many blocks as `config.budget_bytes` holds, zeroed.
    pub fn new(config: KvConfig, num_layers: usize, kv_dim: usize) -> Result<Self, KvError> {
        Self::with_heads(config, num_layers, kv_dim, 1)
    }

    /// As [`Self::new`], each block storing `kv_heads` heads of `kv_dim / kv_heads`
    /// values one after the other (see the module docs).
    pub fn with_heads(
        config: KvConfig,
        num_layers: usize,
        kv_dim: usize,
        kv_heads: usize,
    ) -> Result<Self, KvError> {
        if kv_heads == 0 || !kv_dim.is_multiple_of(kv_heads) {
            return Err(KvError::InvalidConfig(KvConfigError::HeadSplit {
                kv_dim,
                kv_heads,
            }));
        }
        if config.format == KvFormat::F16 && !(config.block_size * kv_dim).is_multiple_of(2) {
            return Err(KvError::InvalidConfig(KvConfigError::OddF16Block {
                block_size: config.block_size,
                kv_dim,
            }));
        }
        if config.block_size == 0 || num_layers == 0 || kv_dim == 0 {
            return Err(KvError::InvalidConfig(KvConfigError::ZeroSize {
                block_size: config.block_size,
                num_layers,
                kv_dim,
            }));
        }
        let bytes_per_block =
            Self::block_bytes(num_layers, config.block_size, kv_dim, config.format)
                .ok_or(KvError::InvalidConfig(KvConfigError::BlockOverflow))?;
        let num_blocks = config.budget_bytes / bytes_per_block;
        if num_blocks == 0 {
            return Err(KvError::BudgetTooSmall {
                budget_bytes: config.budget_bytes,
                bytes_per_block,
            });
        }
        if num_blocks > u32::MAX as usize {
            return Err(KvError::InvalidConfig(KvConfigError::TooManyBlocks {
                blocks: num_blocks,
            }));
        }
        // Fits: num_blocks * bytes_per_block <= budget_bytes.
        let floats = num_blocks * config.block_size * kv_dim * config.format.bytes() / 4;
        let mut keys = Vec::with_capacity(num_layers);
        let mut values = Vec::with_capacity(num_layers);
        for _ in 0..num_layers {
            keys.push(alloc_zeroed(floats)?);
            values.push(alloc_zeroed(floats)?);
        }
        Ok(KvStorage {
            num_layers,
            kv_dim,
            kv_heads,
            block_size: config.block_size,
            num_blocks,
            format: config.format,
            keys,
            values,
            touched: 0,
        })
    }

    /// Transformer layers, each with its own key and value buffers.
    pub fn num_layers(&self) -> usize {
        self.num_layers
    }

    /// Values per position per layer, for keys and again for values (KV heads × head dim).
    pub fn kv_dim(&self) -> usize {
        self.kv_dim
    }

    /// Positions (token rows) per block.
    pub fn block_size(&self) -> usize {
        self.block_size
    }

    /// KV heads per row, stored head after head within a block.
    pub fn kv_heads(&self) -> usize {
        self.kv_heads
    }

    /// Blocks the storage holds (what the budget allowed, fixed at creation).
    pub fn num_blocks(&self) -> usize {
        self.num_blocks
    }

    /// The number format of the stored values.
    pub fn format(&self) -> KvFormat {
        self.format
    }

    /// `2 * num_layers * block_size * kv_dim * format.bytes()`.
    pub fn bytes_per_block(&self) -> usize {
        self.block_size * self.bytes_per_token()
    }

    /// `2 * num_layers * kv_dim * format.bytes()`.
    pub fn bytes_per_token(&self) -> usize {
        2 * self.num_layers * self.kv_dim * self.format.bytes()
    }

    /// Where `block` lies in a buffer, in values (of the format).
    fn block_range(&self, block: BlockId) -> std::ops::Range<usize> {
        let n = self.block_size * self.kv_dim;
        block.index() * n..(block.index() + 1) * n
    }

    /// Where blocks `from..to` lie in a buffer, in f32 words.
    fn word_range(&self, from: usize, to: usize) -> std::ops::Range<usize> {
        let words = self.block_size * self.kv_dim * self.format.bytes() / 4;
        from * words..to * words
    }

    /// Blocks [`Self::touch_ahead`] keeps written ahead of the highest block handed
    /// out: at least 2, about [`TOUCH_AHEAD_BYTES`] of them.
    pub fn touch_ahead_blocks(&self) -> usize {
        (TOUCH_AHEAD_BYTES / self.bytes_per_block().max(1)).max(2)
    }

    /// Blocks `0..n` whose pages [`Self::touch_ahead`] has written (every block handed
    /// out so far lies below it).
    pub fn touched_blocks(&self) -> usize {
        self.touched
    }

    /// Called with each block the pool hands out: when `block` comes near the end of
    /// the blocks already touched, the pages of the next few (about
    /// [`TOUCH_AHEAD_BYTES`]) are written now, split over the forward's thread team.
    ///
    /// Why: the pool's memory is fresh from the OS, and the first write to each page
    /// faults. On a virtual machine whose host backs guest memory lazily (the
    /// Firecracker VMs this project is developed on), a fault costs 2–30 µs a 4 KiB
    /// page, 7–20 ms a 64-row block of the default model, and the main rollout
    /// command spent 5% of its CPU time there, all of it on the engine thread while
    /// the forward's other thread waited. Touched here, the same pages fault on every
    /// member at once, in runs of blocks, outside the forward's critical path. Each
    /// page is touched by `touch_page`: a write access (so it faults the page in as
    /// written) that leaves whatever the page holds, so the call is safe whichever
    /// blocks the caller has written.
    pub fn touch_ahead(&mut self, block: BlockId) {
        let ahead = self.touch_ahead_blocks();
        if block.index() + ahead / 2 < self.touched || self.touched >= self.num_blocks {
            return;
        }
        let from = self.touched.max(block.index());
        let to = (block.index() + 1 + ahead).min(self.num_blocks);
        let range = self.word_range(from, to);
        let bufs: Vec<SharedBuf> = self
            .keys
            .iter_mut()
            .chain(self.values.iter_mut())
            .map(|b| SharedBuf::new(&mut b[range.clone()]))
            .collect();
        // One f32 in each 4 KiB page (1024 floats) of every buffer's range.
        let pages_per_buf = range.len().div_ceil(PAGE_FLOATS);
        team::global().run(|m| {
            for page in m.share(bufs.len() * pages_per_buf) {
                let (buf, at) = (page / pages_per_buf, page % pages_per_buf * PAGE_FLOATS);
                // SAFETY: members take disjoint pages, and `&mut self` keeps every
                // other reader and writer away during the run.
                unsafe { touch_page(bufs[buf].get_mut(at..at + 1).as_mut_ptr()) };
            }
        });
        self.touched = to;
    }

    /// Copies rows `0..rows` of `src` into `dst` in every layer, keys and values
    /// (copy-on-write of a shared, partly filled block).
    pub fn copy_block(&mut self, src: BlockId, dst: BlockId, rows: usize) {
        let rows = rows.min(self.block_size);
        if rows == 0 || src == dst {
            return;
        }
        let (from, to) = (self.block_range(src).start, self.block_range(dst).start);
        let head_dim = self.kv_dim / self.kv_heads;
        let (head_span, n) = (self.block_size * head_dim, rows * head_dim);
        let (format, heads) = (self.format, self.kv_heads);
        for buf in self.keys.iter_mut().chain(self.values.iter_mut()) {
            for h in 0..heads {
                let at = h * head_span;
                match format {
                    KvFormat::F32 => buf.copy_within(from + at..from + at + n, to + at),
                    KvFormat::F16 => halves_mut(buf).copy_within(from + at..from + at + n, to + at),
                }
            }
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
        // The model rounds what an f16 pool keeps (`KvStore::chunks`): stored as given.
        debug_assert!(self.format.holds(key) && self.format.holds(value));
        let start = self.block_range(block).start;
        let head_dim = self.kv_dim / self.kv_heads;
        for h in 0..self.kv_heads {
            let at = start + (h * self.block_size + row) * head_dim;
            let part = h * head_dim..(h + 1) * head_dim;
            match self.format {
                KvFormat::F32 => {
                    self.keys[layer][at..at + head_dim].copy_from_slice(&key[part.clone()]);
                    self.values[layer][at..at + head_dim].copy_from_slice(&value[part]);
                }
                KvFormat::F16 => {
                    let (keys, values) = (
                        &mut halves_mut(&mut self.keys[layer])[at..at + head_dim],
                        &mut halves_mut(&mut self.values[layer])[at..at + head_dim],
                    );
                    for (d, &x) in keys.iter_mut().zip(&key[part.clone()]) {
                        *d = crate::model::kv_format::to_f16(x);
                    }
                    for (d, &x) in values.iter_mut().zip(&value[part]) {
                        *d = crate::model::kv_format::to_f16(x);
                    }
                }
            }
        }
    }

    /// The `block_size * kv_dim` keys of `block` in `layer` (`[kv_heads, block_size,
    /// head_dim]`) of an f32 pool, widened from an f16 one.
    pub fn keys(&self, layer: usize, block: BlockId) -> std::borrow::Cow<'_, [f32]> {
        self.widened(&self.keys[layer], block)
    }

    /// The `block_size * kv_dim` values of `block` in `layer`, laid out as the keys.
    pub fn values(&self, layer: usize, block: BlockId) -> std::borrow::Cow<'_, [f32]> {
        self.widened(&self.values[layer], block)
    }

    fn widened<'a>(&self, buf: &'a [f32], block: BlockId) -> std::borrow::Cow<'a, [f32]> {
        let range = self.block_range(block);
        match self.format {
            KvFormat::F32 => std::borrow::Cow::Borrowed(&buf[range]),
            KvFormat::F16 => halves(buf)[range].iter().map(|h| h.to_f32()).collect(),
        }
    }

    /// `blocks`' keys and values of `layer` as stored, one head-major run a block, for
    /// attention.
    pub fn chunks(&self, layer: usize, blocks: &[BlockId]) -> KvChunks<'_> {
        fn runs<'a, T>(
            keys: &'a [T],
            values: &'a [T],
            blocks: &[BlockId],
            span: usize,
            heads: usize,
        ) -> Vec<KvChunk<'a, T>> {
            blocks
                .iter()
                .map(|b| {
                    let r = b.index() * span..(b.index() + 1) * span;
                    KvChunk::head_major(&keys[r.clone()], &values[r], heads)
                })
                .collect()
        }
        let (k, v) = (&self.keys[layer], &self.values[layer]);
        let (span, heads) = (self.block_size * self.kv_dim, self.kv_heads);
        match self.format {
            KvFormat::F32 => KvChunks::F32(runs(k, v, blocks, span, heads)),
            KvFormat::F16 => KvChunks::F16(runs(halves(k), halves(v), blocks, span, heads)),
        }
    }
}

/// An f16 pool's buffer as the f16s it holds.
fn halves(words: &[f32]) -> &[f16] {
    // SAFETY: the same bytes, read as twice as many f16s: f16's size is half of f32's,
    // its alignment (2) divides f32's (4), and every bit pattern is a valid f16.
    unsafe { std::slice::from_raw_parts(words.as_ptr() as *const f16, words.len() * 2) }
}

/// [`halves`], writable.
fn halves_mut(words: &mut [f32]) -> &mut [f16] {
    // SAFETY: as in `halves`; the borrow of `words` is exclusive for the result's life.
    unsafe { std::slice::from_raw_parts_mut(words.as_mut_ptr() as *mut f16, words.len() * 2) }
}

/// Writes the f32 at `p` with the value it holds: one write access, which faults a
/// page never touched in as a private written page (a read would map the shared
/// zero page and leave the write fault for later). Not an atomic `fetch_or(0)`:
/// LLVM turns an idempotent atomic RMW into a load and drops it when its result is
/// unused, and this function then did nothing (0570992 to 2026-12-04).
///
/// # Safety
/// `p` is valid for reads and writes, and no other thread accesses it meanwhile.
unsafe fn touch_page(p: *mut f32) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: `lock or` of zero into a valid, 4-aligned f32 changes no bit; the
    // caller rules out other accesses.
    unsafe {
        std::arch::asm!("lock or dword ptr [{p}], 0", p = in(reg) p, options(nostack));
    }
    #[cfg(not(target_arch = "x86_64"))]
    // SAFETY: as the caller promises; volatile, so neither access is dropped.
    unsafe {
        p.write_volatile(p.read_volatile());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A pool of `format` with 4 blocks of 2 rows, 2 layers, 2 heads of 2.
    fn pool(format: KvFormat) -> KvStorage {
        let bytes = KvStorage::block_bytes(2, 2, 4, format).unwrap();
        let config = KvConfig {
            block_size: 2,
            budget_bytes: 4 * bytes,
            format,
        };
        KvStorage::with_heads(config, 2, 4, 2).unwrap()
    }

    #[test]
    fn an_f16_pool_holds_half_the_bytes_and_gives_back_what_was_written() {
        let (wide, narrow) = (pool(KvFormat::F32), pool(KvFormat::F16));
        assert_eq!(wide.num_blocks(), 4);
        assert_eq!(narrow.bytes_per_token() * 2, wide.bytes_per_token());
        for mut s in [wide, narrow] {
            // Values f16 holds exactly, as the model hands them to an f16 pool.
            let (key, value) = ([1.5, -2.0, 0.25, 65504.0], [3.0, 0.5, -0.125, 7.0]);
            s.write_row(1, BlockId::new(2), 1, &key, &value);
            // Head-major: head 0's rows, then head 1's.
            assert_eq!(
                &s.keys(1, BlockId::new(2))[..],
                &[0.0, 0.0, 1.5, -2.0, 0.0, 0.0, 0.25, 65504.0]
            );
            assert_eq!(
                &s.values(1, BlockId::new(2))[..],
                &[0.0, 0.0, 3.0, 0.5, 0.0, 0.0, -0.125, 7.0]
            );
            s.copy_block(BlockId::new(2), BlockId::new(3), 2);
            assert_eq!(s.keys(1, BlockId::new(3)), s.keys(1, BlockId::new(2)));
            assert_eq!(s.values(1, BlockId::new(3)), s.values(1, BlockId::new(2)));
            // Other layers and blocks untouched.
            assert!(s.keys(0, BlockId::new(2)).iter().all(|&x| x == 0.0));
            assert!(s.keys(1, BlockId::new(1)).iter().all(|&x| x == 0.0));
            match s.chunks(1, &[BlockId::new(2)]) {
                KvChunks::F32(c) => {
                    assert_eq!(s.format(), KvFormat::F32);
                    assert_eq!(c[0].keys[2], 1.5);
                }
                KvChunks::F16(c) => {
                    assert_eq!(s.format(), KvFormat::F16);
                    assert_eq!(c[0].keys[2].to_f32(), 1.5);
                }
            }
        }
    }
}
