//! How each weight format's panels are read as f32 lanes for [`tile`](super::tile)'s
//! loop: a [`Source`] per storage (f32 or its widened copy, bf16/f16, Q4_0/Q4_1, Q8_0)
//! converts a panel's weights at `k` and `k + 1` exactly, and asks for the block the
//! loop will need [`PREFETCH_BLOCKS`] later.

use super::lanes::Lanes;
use super::packed::{BLOCK, PANEL};
use super::prefetch::prefetch_bytes;

/// Reads a panel's weights as f32 vectors; `Consts` is what a block shares (scales).
pub(super) trait Source<L: Lanes> {
    type Consts: Copy;
    unsafe fn consts(&self, p: usize, b: usize) -> Self::Consts;
    /// Weights of panel `p` at `k = 32b + 2t` and `k + 1`.
    unsafe fn pair(&self, c: &Self::Consts, p: usize, b: usize, t: usize) -> (L::V, L::V);
    /// Weights of panel `p` at `k` (dense formats' tail past the last full block).
    unsafe fn single(&self, p: usize, k: usize) -> L::V;
    /// Asks for panel `p`'s weights at `k = 32b .. 32b + 32` to be brought into cache:
    /// a hint, safe for any `p` and `b` (even past the matrix).
    #[inline(always)]
    unsafe fn prefetch(&self, _p: usize, _b: usize) {}
}

/// Blocks ahead of the one being computed whose weights the tile loops ask for. At a few
/// rows the kernel converts weights faster than one core's hardware prefetchers
/// stream them from memory (Q4_1 at 1 row: 41 GFLOP/s from cache against 26 from
/// DRAM, `kernel_speed` on a matrix past L3).
pub(super) const PREFETCH_BLOCKS: usize = 4;

/// The (panel, block) [`PREFETCH_BLOCKS`] after panel `p`'s block `b` in the order a
/// loop walks them: later in the same panel, or past its end (`blocks` a panel) in
/// the panel `next` panels on, which the loop takes up after this one.
#[inline(always)]
pub(super) fn block_ahead(p: usize, b: usize, blocks: usize, next: usize) -> (usize, usize) {
    if b + PREFETCH_BLOCKS < blocks {
        (p, b + PREFETCH_BLOCKS)
    } else {
        (p + next, b + PREFETCH_BLOCKS - blocks)
    }
}

/// f32 panels at `base`, `inp` vectors each (the matrix itself or a widened copy).
pub(super) struct F32Src {
    pub(super) base: *const f32,
    pub(super) inp: usize,
}

impl<L: Lanes> Source<L> for F32Src {
    type Consts = ();
    #[inline(always)]
    unsafe fn consts(&self, _: usize, _: usize) {}
    #[inline(always)]
    unsafe fn pair(&self, _: &(), p: usize, b: usize, t: usize) -> (L::V, L::V) {
        let at = self.base.add((p * self.inp + b * BLOCK + 2 * t) * PANEL);
        (L::load(at), L::load(at.add(PANEL)))
    }
    #[inline(always)]
    unsafe fn single(&self, p: usize, k: usize) -> L::V {
        L::load(self.base.add((p * self.inp + k) * PANEL))
    }
}

/// bf16 (`F16 = false`) or f16 (`F16 = true`) panels, widened exactly.
pub(super) struct HalfSrc<const F16: bool> {
    pub(super) base: *const u16,
    pub(super) inp: usize,
}

impl<const F16: bool> HalfSrc<F16> {
    #[inline(always)]
    unsafe fn widen<L: Lanes>(at: *const u16) -> L::V {
        if F16 {
            L::widen_f16(at)
        } else {
            L::widen_bf16(at)
        }
    }
}

impl<L: Lanes, const F16: bool> Source<L> for HalfSrc<F16> {
    type Consts = ();
    #[inline(always)]
    unsafe fn consts(&self, _: usize, _: usize) {}
    #[inline(always)]
    unsafe fn pair(&self, _: &(), p: usize, b: usize, t: usize) -> (L::V, L::V) {
        let at = self.base.add((p * self.inp + b * BLOCK + 2 * t) * PANEL);
        (Self::widen::<L>(at), Self::widen::<L>(at.add(PANEL)))
    }
    #[inline(always)]
    unsafe fn single(&self, p: usize, k: usize) -> L::V {
        Self::widen::<L>(self.base.add((p * self.inp + k) * PANEL))
    }
    #[inline(always)]
    unsafe fn prefetch(&self, p: usize, b: usize) {
        // 32 × 16 halves; a panel's tail past its last full block is not asked for.
        let at = self.base.wrapping_add((p * self.inp + b * BLOCK) * PANEL);
        prefetch_bytes(at as *const u8, BLOCK * PANEL * 2);
    }
}

/// Q4_0 (`OFFSET = false`) or Q4_1 (`OFFSET = true`) panels.
pub(super) struct Q4Src<const OFFSET: bool> {
    pub(super) scales: *const f32,
    pub(super) offsets: *const f32,
    pub(super) bytes: *const u8,
    pub(super) blocks: usize,
}

impl<L: Lanes, const OFFSET: bool> Source<L> for Q4Src<OFFSET> {
    type Consts = (L::V, L::V);
    #[inline(always)]
    unsafe fn consts(&self, p: usize, b: usize) -> (L::V, L::V) {
        let slot = (p * self.blocks + b) * PANEL;
        let m = if OFFSET {
            L::load(self.offsets.add(slot))
        } else {
            L::zero()
        };
        (L::load(self.scales.add(slot)), m)
    }
    #[inline(always)]
    unsafe fn pair(&self, c: &(L::V, L::V), p: usize, b: usize, t: usize) -> (L::V, L::V) {
        let at = self.bytes.add(((p * self.blocks + b) * 16 + t) * PANEL);
        L::q4_pair::<OFFSET>(at, c.0, c.1)
    }
    #[inline(always)]
    unsafe fn prefetch(&self, p: usize, b: usize) {
        // A block of a panel: 16 × 16 bytes of nibbles, 16 scales and 16 offsets.
        let slot = p * self.blocks + b;
        prefetch_bytes(self.bytes.wrapping_add(slot * 16 * PANEL), 16 * PANEL);
        prefetch_bytes(self.scales.wrapping_add(slot * PANEL) as *const u8, 64);
        if OFFSET {
            prefetch_bytes(self.offsets.wrapping_add(slot * PANEL) as *const u8, 64);
        }
    }
    unsafe fn single(&self, _: usize, _: usize) -> L::V {
        unreachable!("quantised widths are whole blocks")
    }
}

/// Q8_0 panels.
pub(super) struct Q8Src {
    pub(super) scales: *const f32,
    pub(super) bytes: *const u8,
    pub(super) blocks: usize,
}

impl<L: Lanes> Source<L> for Q8Src {
    type Consts = L::V;
    #[inline(always)]
    unsafe fn consts(&self, p: usize, b: usize) -> L::V {
        L::load(self.scales.add((p * self.blocks + b) * PANEL))
    }
    #[inline(always)]
    unsafe fn pair(&self, d: &L::V, p: usize, b: usize, t: usize) -> (L::V, L::V) {
        let at = self.bytes.add(((p * self.blocks + b) * 32 + 2 * t) * PANEL);
        (L::q8(at, *d), L::q8(at.add(PANEL), *d))
    }
    #[inline(always)]
    unsafe fn prefetch(&self, p: usize, b: usize) {
        // A block of a panel: 32 × 16 bytes and 16 scales.
        let slot = p * self.blocks + b;
        prefetch_bytes(self.bytes.wrapping_add(slot * 32 * PANEL), 32 * PANEL);
        prefetch_bytes(self.scales.wrapping_add(slot * PANEL) as *const u8, 64);
    }
    unsafe fn single(&self, _: usize, _: usize) -> L::V {
        unreachable!("quantised widths are whole blocks")
    }
}
