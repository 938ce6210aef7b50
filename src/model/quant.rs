//! Our quantised matmul: f32 activations against 4- and 8-bit weight blocks.
//!
//! Why not candle's: its CPU kernel quantises every activation row to 8 bits (Q8_1)
//! and then walks all the weights once per row. The 8-bit activations cost accuracy
//! (on the default model, logits move by about one unit against the f32 reference and
//! greedy answers change), and walking the weights per row means a batch of 32 reads
//! the weights 32 times. Here each weight block is unpacked once and applied to a tile
//! of rows, in f32, with the same fixed-order arithmetic for every row whatever the
//! batch: a row's result is bit-identical alone or in any batch (the engine's batch
//! invariance rests on this).
//!
//! Supported block formats (ggml layouts, 32 weights a block): Q4_0, Q4_1, Q8_0.

use candle_core::quantized::{GgmlDType, QTensor};
use half::f16;
use rayon::prelude::*;

const BLOCK: usize = 32;
/// Output rows per parallel task: their weights (a few KB) stay in L1 while every
/// activation row passes over them.
const OUT_TILE: usize = 16;
/// Activation rows per inner pass: their accumulators fit in AVX2 registers.
const ROW_TILE: usize = 8;

/// The block formats this kernel implements.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QuantFormat {
    /// `w = d · (q − 8)`, 4-bit q.
    Q4_0,
    /// `w = d · q + m`, 4-bit q.
    Q4_1,
    /// `w = d · q`, signed 8-bit q.
    Q8_0,
}

impl QuantFormat {
    fn from_ggml(dtype: GgmlDType) -> Option<Self> {
        match dtype {
            GgmlDType::Q4_0 => Some(QuantFormat::Q4_0),
            GgmlDType::Q4_1 => Some(QuantFormat::Q4_1),
            GgmlDType::Q8_0 => Some(QuantFormat::Q8_0),
            _ => None,
        }
    }

    /// Bytes of quantised values per block, after repacking.
    fn quant_bytes(self) -> usize {
        match self {
            QuantFormat::Q4_0 | QuantFormat::Q4_1 => 16,
            QuantFormat::Q8_0 => 32,
        }
    }
}

/// A `[out, in]` weight matrix, repacked from ggml blocks into separate arrays of f32
/// scales, offsets and packed quants, so the kernel does no f16 conversion.
///
/// Every format is evaluated as `w = q · d + m` on the raw unsigned/signed quant `q`:
/// Q4_1 stores `m`; Q4_0's `(q − 8) · d` becomes `m = −8d`; Q8_0 has `m = 0`. The kernel
/// dequantises a block once (`fma(q, d, m)`) and then applies it to every row, so no
/// per-row correction term (and no per-row Σx pass) is needed.
#[derive(Debug, Clone)]
pub struct QuantMatrix {
    format: QuantFormat,
    out: usize,
    inp: usize,
    blocks: usize,
    scales: Vec<f32>,
    /// The `m` of `w = q · d + m`, per block.
    offsets: Vec<f32>,
    quants: Vec<u8>,
}

impl QuantMatrix {
    /// Repacks a 2-D quantised tensor; `None` if its format is not one we implement.
    pub fn from_qtensor(t: &QTensor) -> Result<Option<Self>, candle_core::Error> {
        let Some(format) = QuantFormat::from_ggml(t.dtype()) else {
            return Ok(None);
        };
        let (out, inp) = t.shape().dims2()?;
        if inp % BLOCK != 0 {
            return Ok(None);
        }
        let data = t.data()?;
        Ok(Some(Self::from_ggml_bytes(format, out, inp, &data)))
    }

    /// Repacks raw ggml block bytes (row-major `[out, in]`).
    pub fn from_ggml_bytes(format: QuantFormat, out: usize, inp: usize, data: &[u8]) -> Self {
        let blocks = inp / BLOCK;
        let n = out * blocks;
        let qb = format.quant_bytes();
        let mut scales = Vec::with_capacity(n);
        let mut offsets = Vec::with_capacity(n);
        let mut quants = Vec::with_capacity(n * qb);
        let half = |b: &[u8]| f16::from_bits(u16::from_le_bytes([b[0], b[1]])).to_f32();
        let block_bytes = match format {
            QuantFormat::Q4_0 => 2 + 16,
            QuantFormat::Q4_1 => 4 + 16,
            QuantFormat::Q8_0 => 2 + 32,
        };
        for blk in data.chunks_exact(block_bytes).take(n) {
            let d = half(&blk[0..2]);
            scales.push(d);
            match format {
                QuantFormat::Q4_1 => {
                    offsets.push(half(&blk[2..4]));
                    quants.extend_from_slice(&blk[4..20]);
                }
                QuantFormat::Q4_0 => {
                    offsets.push(-8.0 * d);
                    quants.extend_from_slice(&blk[2..]);
                }
                QuantFormat::Q8_0 => {
                    offsets.push(0.0);
                    quants.extend_from_slice(&blk[2..]);
                }
            }
        }
        QuantMatrix {
            format,
            out,
            inp,
            blocks,
            scales,
            offsets,
            quants,
        }
    }

    pub fn out_features(&self) -> usize {
        self.out
    }

    pub fn in_features(&self) -> usize {
        self.inp
    }

    /// Unpacks block `b` of output row `o` into its 32 raw quants as f32.
    fn unpack(&self, o: usize, b: usize, q: &mut [f32; BLOCK]) {
        let i = o * self.blocks + b;
        let qb = self.format.quant_bytes();
        let bytes = &self.quants[i * qb..][..qb];
        match self.format {
            QuantFormat::Q4_0 | QuantFormat::Q4_1 => {
                for j in 0..16 {
                    q[j] = (bytes[j] & 0x0F) as f32;
                    q[j + 16] = (bytes[j] >> 4) as f32;
                }
            }
            QuantFormat::Q8_0 => {
                for j in 0..BLOCK {
                    q[j] = bytes[j] as i8 as f32;
                }
            }
        }
    }

    /// Dequantises output row `o` (reference path for tests).
    pub fn dequantize_row(&self, o: usize, dst: &mut [f32]) {
        let mut q = [0f32; BLOCK];
        for b in 0..self.blocks {
            self.unpack(o, b, &mut q);
            let i = o * self.blocks + b;
            let (d, m) = (self.scales[i], self.offsets[i]);
            for j in 0..BLOCK {
                dst[b * BLOCK + j] = match self.format {
                    // ggml's own formulas, so the result equals candle's dequantisation.
                    QuantFormat::Q4_0 => (q[j] - 8.0) * d,
                    QuantFormat::Q4_1 => q[j] * d + m,
                    QuantFormat::Q8_0 => q[j] * d,
                };
            }
        }
    }

    /// `y = x · Wᵀ` for `x: [rows, in]`; returns `[rows, out]`.
    pub fn matmul(&self, x: &[f32], rows: usize) -> Vec<f32> {
        assert_eq!(x.len(), rows * self.inp, "activation shape");
        // Results per output row first ([out, rows]) so tasks own disjoint slices.
        let mut yt = vec![0f32; self.out * rows];
        yt.par_chunks_mut(OUT_TILE * rows)
            .enumerate()
            .for_each(|(tile, dst)| {
                let o0 = tile * OUT_TILE;
                let n_out = dst.len() / rows;
                for r0 in (0..rows).step_by(ROW_TILE) {
                    let nr = ROW_TILE.min(rows - r0);
                    // Few rows: several outputs at once, so the CPU has independent
                    // accumulator chains to overlap (the decode case).
                    let step = match nr {
                        1 | 2 => 4,
                        3 | 4 => 2,
                        _ => 1,
                    };
                    let mut oi = 0;
                    while oi < n_out {
                        let no = if n_out - oi >= step { step } else { 1 };
                        let mut acc = [[0f32; ROW_TILE]; 4];
                        self.dot_tile(o0 + oi, no, x, r0, nr, &mut acc);
                        for (j, a) in acc.iter().enumerate().take(no) {
                            dst[(oi + j) * rows + r0..][..nr].copy_from_slice(&a[..nr]);
                        }
                        oi += no;
                    }
                }
            });
        if rows == 1 {
            return yt;
        }
        let mut y = vec![0f32; rows * self.out];
        for (o, col) in yt.chunks_exact(rows).enumerate() {
            for (r, v) in col.iter().enumerate() {
                y[r * self.out + o] = *v;
            }
        }
        y
    }

    /// Dot products of output rows `o0..o0+no` with activation rows `r0..r0+nr`.
    fn dot_tile(
        &self,
        o0: usize,
        no: usize,
        x: &[f32],
        r0: usize,
        nr: usize,
        acc: &mut [[f32; ROW_TILE]; 4],
    ) {
        #[cfg(target_arch = "x86_64")]
        {
            if std::arch::is_x86_feature_detected!("avx2")
                && std::arch::is_x86_feature_detected!("fma")
            {
                // SAFETY: the CPU supports AVX2 and FMA (checked above); all pointer
                // arithmetic stays within `x` and the packed arrays (see `avx2`).
                unsafe { avx2::dot_tile_dispatch(self, o0, no, x, r0, nr, acc) };
                return;
            }
        }
        for (j, a) in acc.iter_mut().enumerate().take(no) {
            self.dot_rows_scalar(o0 + j, x, r0, nr, a);
        }
    }

    /// Portable fallback with the same per-row structure (8 lanes, then a fixed sum).
    fn dot_rows_scalar(
        &self,
        o: usize,
        x: &[f32],
        r0: usize,
        nr: usize,
        acc: &mut [f32; ROW_TILE],
    ) {
        let mut q = [0f32; BLOCK];
        let mut lanes = [[0f32; 8]; ROW_TILE];
        for b in 0..self.blocks {
            self.unpack(o, b, &mut q);
            let i = o * self.blocks + b;
            let (d, m) = (self.scales[i], self.offsets[i]);
            for v in q.iter_mut() {
                *v = v.mul_add(d, m);
            }
            for (r, lane) in lanes.iter_mut().enumerate().take(nr) {
                let xr = &x[(r0 + r) * self.inp + b * BLOCK..][..BLOCK];
                for l in 0..8 {
                    let mut t = xr[l] * q[l];
                    t = xr[8 + l].mul_add(q[8 + l], t);
                    t = xr[16 + l].mul_add(q[16 + l], t);
                    t = xr[24 + l].mul_add(q[24 + l], t);
                    lane[l] += t;
                }
            }
        }
        for (a, l) in acc.iter_mut().zip(&lanes).take(nr) {
            *a = ((l[0] + l[4]) + (l[2] + l[6])) + ((l[1] + l[5]) + (l[3] + l[7]));
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use super::{QuantFormat, QuantMatrix, BLOCK, ROW_TILE};
    use std::arch::x86_64::*;

    /// Dequantises one block into four 8-lane vectors (elements 0-7, 8-15, 16-23, 24-31,
    /// the order of the activations they multiply): `fma(q, d, m)`.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn dequantize(m: &QuantMatrix, i: usize) -> [__m256; 4] {
        let q = match m.format {
            QuantFormat::Q4_0 | QuantFormat::Q4_1 => {
                let p = m.quants.as_ptr().add(i * 16) as *const __m128i;
                let bytes = _mm_loadu_si128(p);
                let mask = _mm_set1_epi8(0x0F);
                let lo = _mm_and_si128(bytes, mask);
                let hi = _mm_and_si128(_mm_srli_epi16(bytes, 4), mask);
                [
                    _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(lo)),
                    _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(lo, 8))),
                    _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(hi)),
                    _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(hi, 8))),
                ]
            }
            QuantFormat::Q8_0 => {
                let p = m.quants.as_ptr().add(i * 32);
                let load = |k: usize| _mm_loadl_epi64(p.add(8 * k) as *const __m128i);
                [
                    _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(load(0))),
                    _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(load(1))),
                    _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(load(2))),
                    _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(load(3))),
                ]
            }
        };
        let d = _mm256_set1_ps(*m.scales.get_unchecked(i));
        let off = _mm256_set1_ps(*m.offsets.get_unchecked(i));
        [
            _mm256_fmadd_ps(q[0], d, off),
            _mm256_fmadd_ps(q[1], d, off),
            _mm256_fmadd_ps(q[2], d, off),
            _mm256_fmadd_ps(q[3], d, off),
        ]
    }

    /// Horizontal sum in a fixed order (the scalar fallback pairs lanes the same way).
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn hsum(v: __m256) -> f32 {
        let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
        let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
        let s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 0b01));
        _mm_cvtss_f32(s)
    }

    /// Picks the monomorphised kernel for `no` outputs × `nr` rows, so accumulators
    /// live in registers. Every instance performs the same per-(row, output)
    /// operations in the same order, so a result does not depend on which ran it.
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn dot_tile_dispatch(
        m: &QuantMatrix,
        o0: usize,
        no: usize,
        x: &[f32],
        r0: usize,
        nr: usize,
        acc: &mut [[f32; ROW_TILE]; 4],
    ) {
        match (no, nr) {
            (4, 1) => dot_tile::<4, 1>(m, o0, x, r0, acc),
            (4, 2) => dot_tile::<4, 2>(m, o0, x, r0, acc),
            (2, 3) => dot_tile::<2, 3>(m, o0, x, r0, acc),
            (2, 4) => dot_tile::<2, 4>(m, o0, x, r0, acc),
            (_, 1) => dot_tile::<1, 1>(m, o0, x, r0, acc),
            (_, 2) => dot_tile::<1, 2>(m, o0, x, r0, acc),
            (_, 3) => dot_tile::<1, 3>(m, o0, x, r0, acc),
            (_, 4) => dot_tile::<1, 4>(m, o0, x, r0, acc),
            (_, 5) => dot_tile::<1, 5>(m, o0, x, r0, acc),
            (_, 6) => dot_tile::<1, 6>(m, o0, x, r0, acc),
            (_, 7) => dot_tile::<1, 7>(m, o0, x, r0, acc),
            _ => dot_tile::<1, 8>(m, o0, x, r0, acc),
        }
    }

    /// Each (row, output) pair's accumulation order is fixed: blocks in order; within
    /// a block the four 8-lane products are chained in order and added to the pair's
    /// accumulator; nothing depends on `NO`, `NR` or on other rows.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    #[allow(clippy::needless_range_loop)] // `j`, `r` index outputs and rows alike
    unsafe fn dot_tile<const NO: usize, const NR: usize>(
        m: &QuantMatrix,
        o0: usize,
        x: &[f32],
        r0: usize,
        acc_out: &mut [[f32; ROW_TILE]; 4],
    ) {
        debug_assert!((r0 + NR) * m.inp <= x.len());
        let mut acc = [[_mm256_setzero_ps(); NR]; NO];
        let xp = x.as_ptr();
        for b in 0..m.blocks {
            for j in 0..NO {
                let w = dequantize(m, (o0 + j) * m.blocks + b);
                for r in 0..NR {
                    let p = xp.add((r0 + r) * m.inp + b * BLOCK);
                    let mut t = _mm256_mul_ps(_mm256_loadu_ps(p), w[0]);
                    t = _mm256_fmadd_ps(_mm256_loadu_ps(p.add(8)), w[1], t);
                    t = _mm256_fmadd_ps(_mm256_loadu_ps(p.add(16)), w[2], t);
                    t = _mm256_fmadd_ps(_mm256_loadu_ps(p.add(24)), w[3], t);
                    acc[j][r] = _mm256_add_ps(acc[j][r], t);
                }
            }
        }
        for j in 0..NO {
            for r in 0..NR {
                acc_out[j][r] = hsum(acc[j][r]);
            }
        }
    }
}
