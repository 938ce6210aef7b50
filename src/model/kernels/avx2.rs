//! [`Lanes`] on AVX2 + FMA (+ F16C): two 256-bit registers per panel of 16 outputs.

use std::arch::x86_64::*;
use std::ops::Range;

use super::packed::PackedMatrix;
use super::tile::{gemm as tile_gemm, Lanes};
use super::TileSink;

pub(super) struct Avx2;

/// A panel's 16 lanes as outputs 0–7 and 8–15.
#[derive(Clone, Copy)]
pub(super) struct Pair(__m256, __m256);

impl Lanes for Avx2 {
    type V = Pair;
    // 1 panel × 6 rows = 12 accumulators of the 16 registers: each weight vector
    // loaded serves six rows (two panels × three rows halves that, and the weight
    // loads from L2 were the bound).
    const ROW_TILE: usize = 6;
    const PANEL_GROUP: usize = 1;
    #[inline(always)]
    unsafe fn zero() -> Pair {
        Pair(_mm256_setzero_ps(), _mm256_setzero_ps())
    }
    #[inline(always)]
    unsafe fn load(at: *const f32) -> Pair {
        Pair(_mm256_loadu_ps(at), _mm256_loadu_ps(at.add(8)))
    }
    #[inline(always)]
    unsafe fn store(at: *mut f32, v: Pair) {
        _mm256_storeu_ps(at, v.0);
        _mm256_storeu_ps(at.add(8), v.1);
    }
    #[inline(always)]
    unsafe fn splat(x: f32) -> Pair {
        let v = _mm256_set1_ps(x);
        Pair(v, v)
    }
    #[inline(always)]
    unsafe fn fmadd(a: Pair, b: Pair, c: Pair) -> Pair {
        Pair(
            _mm256_fmadd_ps(a.0, b.0, c.0),
            _mm256_fmadd_ps(a.1, b.1, c.1),
        )
    }
    #[inline(always)]
    unsafe fn mul_add_twice(a: Pair, b: Pair, c: Pair) -> Pair {
        Pair(
            _mm256_add_ps(_mm256_mul_ps(a.0, b.0), c.0),
            _mm256_add_ps(_mm256_mul_ps(a.1, b.1), c.1),
        )
    }
    #[inline(always)]
    unsafe fn widen_bf16(at: *const u16) -> Pair {
        let w = |p: *const u16| {
            let bits = _mm256_cvtepu16_epi32(_mm_loadu_si128(p as *const __m128i));
            _mm256_castsi256_ps(_mm256_slli_epi32(bits, 16))
        };
        Pair(w(at), w(at.add(8)))
    }
    #[inline(always)]
    unsafe fn widen_f16(at: *const u16) -> Pair {
        let w = |p: *const u16| _mm256_cvtph_ps(_mm_loadu_si128(p as *const __m128i));
        Pair(w(at), w(at.add(8)))
    }
    #[inline(always)]
    unsafe fn q4_pair<const OFFSET: bool>(at: *const u8, d: Pair, m: Pair) -> (Pair, Pair) {
        // Eight bytes (lanes 0–7 or 8–15) into the weights at k and k + 1.
        let half = |p: *const u8, d: __m256, m: __m256| {
            let v = _mm256_cvtepu8_epi32(_mm_loadl_epi64(p as *const __m128i));
            let mut lo = _mm256_and_si256(v, _mm256_set1_epi32(0x0F));
            let mut hi = _mm256_srli_epi32(v, 4);
            if !OFFSET {
                lo = _mm256_sub_epi32(lo, _mm256_set1_epi32(8));
                hi = _mm256_sub_epi32(hi, _mm256_set1_epi32(8));
            }
            let a = _mm256_mul_ps(_mm256_cvtepi32_ps(lo), d);
            let b = _mm256_mul_ps(_mm256_cvtepi32_ps(hi), d);
            if OFFSET {
                (_mm256_add_ps(a, m), _mm256_add_ps(b, m))
            } else {
                (a, b)
            }
        };
        let (a0, b0) = half(at, d.0, m.0);
        let (a1, b1) = half(at.add(8), d.1, m.1);
        (Pair(a0, a1), Pair(b0, b1))
    }
    #[inline(always)]
    unsafe fn q8(at: *const u8, d: Pair) -> Pair {
        let w = |p: *const u8, d: __m256| {
            let v = _mm256_cvtepi8_epi32(_mm_loadl_epi64(p as *const __m128i));
            _mm256_mul_ps(_mm256_cvtepi32_ps(v), d)
        };
        Pair(w(at, d.0), w(at.add(8), d.1))
    }
}

/// # Safety
/// The CPU must support AVX2, FMA and F16C (see [`super::Isa::available`]); bounds are
/// checked by [`tile_gemm`].
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn gemm(
    m: &PackedMatrix,
    x: &[f32],
    rows: usize,
    panels: Range<usize>,
    sink: &dyn TileSink,
) {
    tile_gemm::<Avx2>(m, x, rows, panels, sink)
}

/// # Safety
/// As [`super::rows::weighted_sum`], on a CPU with avx2,fma,f16c.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn weighted_sum(
    rows: &[&[f32]],
    offset: usize,
    probs: &[f32],
    scale: f32,
    out: &mut [f32],
) {
    super::rows::weighted_sum::<Avx2>(rows, offset, probs, scale, out)
}
