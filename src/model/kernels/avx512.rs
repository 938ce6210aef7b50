//! [`Lanes`] on AVX-512F: one 512-bit register per panel of 16 outputs.

use std::arch::x86_64::*;

use super::tile::Lanes;

pub(super) struct Avx512;

impl Lanes for Avx512 {
    type V = __m512;
    // 2 panels × 8 rows = 16 accumulators of the 32 registers.
    const ROW_TILE: usize = 8;
    const PANEL_GROUP: usize = 2;
    #[inline(always)]
    unsafe fn zero() -> __m512 {
        _mm512_setzero_ps()
    }
    #[inline(always)]
    unsafe fn load(at: *const f32) -> __m512 {
        _mm512_loadu_ps(at)
    }
    #[inline(always)]
    unsafe fn store(at: *mut f32, v: __m512) {
        _mm512_storeu_ps(at, v)
    }
    #[inline(always)]
    unsafe fn splat(x: f32) -> __m512 {
        _mm512_set1_ps(x)
    }
    #[inline(always)]
    unsafe fn fmadd(a: __m512, b: __m512, c: __m512) -> __m512 {
        _mm512_fmadd_ps(a, b, c)
    }
    #[inline(always)]
    unsafe fn mul_add_twice(a: __m512, b: __m512, c: __m512) -> __m512 {
        _mm512_add_ps(_mm512_mul_ps(a, b), c)
    }
    #[inline(always)]
    unsafe fn widen_bf16(at: *const u16) -> __m512 {
        let bits = _mm256_loadu_si256(at as *const __m256i);
        _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(bits), 16))
    }
    #[inline(always)]
    unsafe fn widen_f16(at: *const u16) -> __m512 {
        _mm512_cvtph_ps(_mm256_loadu_si256(at as *const __m256i))
    }
    #[inline(always)]
    unsafe fn q4_pair<const OFFSET: bool>(at: *const u8, d: __m512, m: __m512) -> (__m512, __m512) {
        let v = _mm512_cvtepu8_epi32(_mm_loadu_si128(at as *const __m128i));
        let mut lo = _mm512_and_si512(v, _mm512_set1_epi32(0x0F));
        let mut hi = _mm512_srli_epi32(v, 4);
        if !OFFSET {
            lo = _mm512_sub_epi32(lo, _mm512_set1_epi32(8));
            hi = _mm512_sub_epi32(hi, _mm512_set1_epi32(8));
        }
        // `q·d` is exact (a 4-bit integer times an f16 scale fits f32's 24 bits),
        // so one fma rounds `q·d + m` exactly as a multiply and an add would.
        let (lo, hi) = (_mm512_cvtepi32_ps(lo), _mm512_cvtepi32_ps(hi));
        if OFFSET {
            (_mm512_fmadd_ps(lo, d, m), _mm512_fmadd_ps(hi, d, m))
        } else {
            (_mm512_mul_ps(lo, d), _mm512_mul_ps(hi, d))
        }
    }
    #[inline(always)]
    unsafe fn q8(at: *const u8, d: __m512) -> __m512 {
        let v = _mm512_cvtepi8_epi32(_mm_loadu_si128(at as *const __m128i));
        _mm512_mul_ps(_mm512_cvtepi32_ps(v), d)
    }
}

/// [`super::rows::dot_fixed`] of `q` with `rows[j][offset..]` into `out[j]`, four rows at
/// a time: one 16-lane register per key holds exactly `dot_fixed`'s sixteen lane sums
/// (one `fma` per chunk instead of AVX2's two), its halves are added (`l += l + 8`),
/// and the AVX2 variant's shuffles finish the sums, so each result is bit-identical.
///
/// # Safety
/// The CPU supports AVX-512F; `q.len()` is a multiple of 16 and every row holds
/// `offset + q.len()` values; `out.len() == rows.len()`.
#[target_feature(enable = "avx512f,avx2,fma")]
pub(super) unsafe fn dot_rows(q: &[f32], rows: &[&[f32]], offset: usize, out: &mut [f32]) {
    let chunks = q.len() / 16;
    let qp = q.as_ptr();
    let mut j = 0;
    while j + 4 <= rows.len() {
        let p: [*const f32; 4] = std::array::from_fn(|i| rows[j + i].as_ptr().add(offset));
        for ahead in rows.iter().skip(j + super::rows::PREFETCH_ROWS).take(4) {
            super::rows::prefetch_span(ahead.as_ptr().add(offset), q.len());
        }
        let mut acc = [_mm512_setzero_ps(); 4];
        for c in 0..chunks {
            let qc = _mm512_loadu_ps(qp.add(16 * c));
            for i in 0..4 {
                acc[i] = _mm512_fmadd_ps(qc, _mm512_loadu_ps(p[i].add(16 * c)), acc[i]);
            }
        }
        let s: [__m256; 4] = std::array::from_fn(|i| {
            _mm256_add_ps(
                _mm512_castps512_ps256(acc[i]),
                _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(acc[i]), 1)),
            )
        });
        out[j..j + 4].copy_from_slice(&super::avx2::reduce_four(s));
        j += 4;
    }
    for (o, row) in out[j..].iter_mut().zip(&rows[j..]) {
        *o = super::rows::dot_fixed(q, &row[offset..offset + q.len()]);
    }
}

super::tile::entry_points!(Avx512, "avx512f");
