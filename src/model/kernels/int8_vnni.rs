//! The fast precision mode's matmul on AVX-512 VNNI: `vpdpbusd` multiplies one
//! output's four codes (unsigned bytes) by four broadcast activation bytes (signed) and
//! adds the four products into that output's 32-bit lane, so one instruction does 64
//! multiply-adds of a panel. The float steps per block are exactly the scalar
//! variant's (`int8.rs`), so the two agree bit for bit.

use std::arch::x86_64::*;
use std::ops::Range;

use super::int8::{Int8Matrix, QuantizedRows};
use super::packed::{BLOCK, PANEL};
use super::prefetch::prefetch_bytes;
use super::source::block_ahead;
use super::TileSink;

/// [`QuantizedRows`]'s quantisation of `rows` rows of `x`, 32 values at a time in two
/// registers: the same operations as the scalar loop (`max|x|`, `d = amax / 127`,
/// `x · (1/d)` rounded to nearest-even, clamped to ±127), so the same bytes.
///
/// # Safety
/// The CPU runs AVX-512F/BW; `x` holds `rows * inp` values, `inp % 32 == 0`, and
/// `q`'s buffers are sized for them.
#[target_feature(enable = "avx512f,avx512bw")]
pub(super) unsafe fn quantize(x: &[f32], q: &mut QuantizedRows, blocks_total: usize) {
    assert!(x.len() >= blocks_total * BLOCK && q.q.len() >= blocks_total * BLOCK);
    assert!(q.dx.len() >= blocks_total && q.sx.len() >= blocks_total);
    let (lo, hi) = (_mm512_set1_epi32(-127), _mm512_set1_epi32(127));
    for i in 0..blocks_total {
        let at = x.as_ptr().add(i * BLOCK);
        let (v0, v1) = (_mm512_loadu_ps(at), _mm512_loadu_ps(at.add(16)));
        let amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(v0), _mm512_abs_ps(v1)));
        let d = amax / 127.0;
        let id = _mm512_set1_ps(if d > 0.0 { 1.0 / d } else { 0.0 });
        let q0 = _mm512_min_epi32(
            _mm512_max_epi32(_mm512_cvtps_epi32(_mm512_mul_ps(v0, id)), lo),
            hi,
        );
        let q1 = _mm512_min_epi32(
            _mm512_max_epi32(_mm512_cvtps_epi32(_mm512_mul_ps(v1, id)), lo),
            hi,
        );
        let dst = q.q.as_mut_ptr().add(i * BLOCK) as *mut __m128i;
        _mm_storeu_si128(dst, _mm512_cvtepi32_epi8(q0));
        _mm_storeu_si128(dst.add(1), _mm512_cvtepi32_epi8(q1));
        let sum = _mm512_reduce_add_epi32(_mm512_add_epi32(q0, q1));
        q.dx[i] = d;
        q.sx[i] = d * sum as f32;
    }
}

/// Most rows one pass over a panel's blocks serves (their accumulators stay in
/// registers next to the panel's eight code vectors).
const ROW_TILE: usize = 8;
/// Panels computed together for a single row (independent chains hide latency).
const PANEL_GROUP: usize = 4;

/// # Safety
/// The CPU runs AVX-512F/BW/VNNI and F16C; `q` quantises `rows` rows of
/// `m.in_features()` values; `panels.end <= m.panels()`.
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,f16c")]
pub(super) unsafe fn gemm(
    m: &Int8Matrix,
    q: &QuantizedRows,
    rows: usize,
    panels: Range<usize>,
    sink: &dyn TileSink,
) {
    assert!(q.q.len() >= rows * m.inp && q.inp == m.inp && panels.end <= m.panels);
    if rows == 1 {
        single_row(m, q, panels, sink);
    } else {
        row_tiles(m, q, rows, panels, sink);
    }
}

/// Panel `p`, block `b`'s codes as eight vectors: vector `g` holds each output's
/// codes for `k = 32b + 4g .. + 4`.
#[inline(always)]
unsafe fn codes(m: &Int8Matrix, p: usize, b: usize) -> [__m512i; 8] {
    let at = m.codes.as_ptr().add((p * m.blocks + b) * m.block_bytes);
    let mut w = [_mm512_setzero_si512(); 8];
    if m.block_bytes == 256 {
        let low = _mm512_set1_epi8(0x0F);
        for c in 0..4 {
            let v = _mm512_loadu_si512(at.add(64 * c) as *const _);
            w[2 * c] = _mm512_and_si512(v, low);
            w[2 * c + 1] = _mm512_and_si512(_mm512_srli_epi16(v, 4), low);
        }
    } else {
        for (g, wg) in w.iter_mut().enumerate() {
            *wg = _mm512_loadu_si512(at.add(64 * g) as *const _);
        }
    }
    w
}

/// Asks for panel `p`, block `b`'s codes, scales and offsets (a hint, safe past the
/// matrix): at one row the codes are consumed faster than the hardware prefetchers
/// bring them from memory, as in the exact kernels (`source::PREFETCH_BLOCKS`).
#[inline(always)]
fn prefetch_block(m: &Int8Matrix, p: usize, b: usize) {
    let slot = p * m.blocks + b;
    prefetch_bytes(
        m.codes.as_ptr().wrapping_add(slot * m.block_bytes),
        m.block_bytes,
    );
    // 16 f16 scales (and offsets) a slot.
    prefetch_bytes(
        m.scales.as_ptr().wrapping_add(slot * PANEL) as *const u8,
        32,
    );
    if !m.offsets.is_empty() {
        prefetch_bytes(
            m.offsets.as_ptr().wrapping_add(slot * PANEL) as *const u8,
            32,
        );
    }
}

/// Asks for the block [`block_ahead`] of panel `p`'s block `b`.
#[inline(always)]
fn prefetch_ahead(m: &Int8Matrix, p: usize, b: usize, next: usize) {
    let (pa, ba) = block_ahead(p, b, m.blocks, next);
    prefetch_block(m, pa, ba);
}

/// `(d, m)` of panel `p`, block `b`, as `int8::Int8Matrix::scale_offset` computes them.
#[inline(always)]
unsafe fn scale_offset(m: &Int8Matrix, p: usize, b: usize) -> (__m512, __m512) {
    let slot = (p * m.blocks + b) * PANEL;
    let d = _mm512_cvtph_ps(_mm256_loadu_si256(m.scales.as_ptr().add(slot) as *const _));
    let off = if m.offsets.is_empty() {
        _mm512_mul_ps(d, _mm512_set1_ps(-m.offset_code))
    } else {
        _mm512_cvtph_ps(_mm256_loadu_si256(m.offsets.as_ptr().add(slot) as *const _))
    };
    (d, off)
}

/// Row `r`'s activation bytes for block `b` as eight broadcast groups of four.
#[inline(always)]
unsafe fn activations(q: &QuantizedRows, r: usize, b: usize) -> [__m512i; 8] {
    let at = q.q.as_ptr().add(r * q.inp + b * BLOCK) as *const i32;
    let mut x = [_mm512_setzero_si512(); 8];
    for (g, xg) in x.iter_mut().enumerate() {
        *xg = _mm512_set1_epi32(at.add(g).read_unaligned());
    }
    x
}

/// `Σ u·xq` over one block: two chains of four `vpdpbusd` (integer sums are exact in
/// any order).
#[inline(always)]
unsafe fn block_dot(w: &[__m512i; 8], x: &[__m512i; 8]) -> __m512i {
    let mut a = _mm512_setzero_si512();
    let mut b = _mm512_setzero_si512();
    for g in (0..8).step_by(2) {
        a = _mm512_dpbusd_epi32(a, w[g], x[g]);
        b = _mm512_dpbusd_epi32(b, w[g + 1], x[g + 1]);
    }
    _mm512_add_epi32(a, b)
}

/// The two fmas a block adds: `fma(Σ u·xq, d·dx, acc)`, then `fma(m, dx·Σ xq, acc)`.
#[inline(always)]
unsafe fn accumulate(
    acc: __m512,
    isum: __m512i,
    d: __m512,
    off: __m512,
    dx: f32,
    sx: f32,
) -> __m512 {
    let acc = _mm512_fmadd_ps(
        _mm512_cvtepi32_ps(isum),
        _mm512_mul_ps(d, _mm512_set1_ps(dx)),
        acc,
    );
    _mm512_fmadd_ps(off, _mm512_set1_ps(sx), acc)
}

#[inline(always)]
unsafe fn single_row(m: &Int8Matrix, q: &QuantizedRows, panels: Range<usize>, sink: &dyn TileSink) {
    let mut p0 = panels.start;
    while p0 < panels.end {
        let np = PANEL_GROUP.min(panels.end - p0);
        let mut acc = [_mm512_setzero_ps(); PANEL_GROUP];
        for b in 0..m.blocks {
            let x = activations(q, 0, b);
            let (dx, sx) = (q.dx[b], q.sx[b]);
            for (j, a) in acc.iter_mut().enumerate().take(np) {
                prefetch_ahead(m, p0 + j, b, np);
                let isum = block_dot(&codes(m, p0 + j, b), &x);
                let (d, off) = scale_offset(m, p0 + j, b);
                *a = accumulate(*a, isum, d, off, dx, sx);
            }
        }
        let mut out = [[0f32; PANEL]; PANEL_GROUP];
        for (o, a) in out.iter_mut().zip(&acc).take(np) {
            _mm512_storeu_ps(o.as_mut_ptr(), *a);
        }
        sink.tile(0, 1, p0, np, &out[..np]);
        p0 += np;
    }
}

#[inline(always)]
unsafe fn row_tiles(
    m: &Int8Matrix,
    q: &QuantizedRows,
    rows: usize,
    panels: Range<usize>,
    sink: &dyn TileSink,
) {
    for p in panels {
        let mut r0 = 0;
        while r0 < rows {
            let nr = ROW_TILE.min(rows - r0);
            let mut acc = [_mm512_setzero_ps(); ROW_TILE];
            for b in 0..m.blocks {
                if r0 == 0 {
                    // Later row tiles find the panel in cache.
                    prefetch_ahead(m, p, b, 1);
                }
                let w = codes(m, p, b);
                let (d, off) = scale_offset(m, p, b);
                for (i, a) in acc.iter_mut().enumerate().take(nr) {
                    let r = r0 + i;
                    let isum = block_dot(&w, &activations(q, r, b));
                    let (dx, sx) = (q.dx[r * m.blocks + b], q.sx[r * m.blocks + b]);
                    *a = accumulate(*a, isum, d, off, dx, sx);
                }
            }
            let mut out = [[0f32; PANEL]; ROW_TILE];
            for (o, a) in out.iter_mut().zip(&acc).take(nr) {
                _mm512_storeu_ps(o.as_mut_ptr(), *a);
            }
            sink.tile(r0, nr, p, 1, &out[..nr]);
            r0 += nr;
        }
    }
}
