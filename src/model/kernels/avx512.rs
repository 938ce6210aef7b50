//! [`Lanes`] on AVX-512F: one 512-bit register per panel of 16 outputs.

use std::arch::x86_64::*;

use super::kv_elem::{self, KvElem};
use super::lanes::Lanes;
use super::row_runs::Rows;

pub(super) struct Avx512;

impl Lanes for Avx512 {
    type V = __m512;
    // 2 panels × 8 rows = 16 accumulators of the 32 registers.
    const ROW_TILE: usize = 8;
    const PANEL_GROUP: usize = 2;
    // Up to 24 accumulators of the 32 registers, one panel's weights and block
    // constants; each row's x comes from memory as a broadcast operand.
    const WIDE_ROWS: usize = 24;
    const HALF_ROWS: usize = 0;
    type Lo = Self;
    type Hi = Self;
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

/// [`super::rows::dot_fixed`] of `q` with `row_j[offset..]` into `out[j]`: the
/// one-head case of [`dot_rows_heads`].
///
/// # Safety
/// The CPU supports AVX-512F and AVX2; `q.len()` is a multiple of 16 and every row
/// holds `offset + q.len()` values; `out.len() == rows.len()`.
#[target_feature(enable = "avx512f,avx2,fma")]
pub(super) unsafe fn dot_rows(q: &[f32], rows: Rows, offset: usize, out: &mut [f32]) {
    dot_rows_heads::<1, f32>(q, rows, offset, out)
}

/// Most query heads [`dot_rows_heads`] takes at once: four heads' accumulators, four
/// vectors a head, stay in the 32 registers beside the key rows; larger groups go in
/// pieces.
pub(super) const MAX_SCORE_HEADS: usize = 4;

/// [`super::rows::dot_fixed`] of `H` queries (grouped-query attention's heads that
/// share a KV head) with `row_j[offset..]`, head `h`'s scores into
/// `out[h * rows.len()..]`, four keys at a time: each key row is loaded once for all
/// heads; one 16-lane register per (head, key) holds exactly `dot_fixed`'s sixteen
/// lane sums (one `fma` per chunk), its halves are added (`l += l + 8`), and the AVX2
/// variant's shuffles finish the sums, so every score is bit-identical.
///
/// # Safety
/// The CPU supports AVX-512F and AVX2; `qs.len() == H * dim` with `dim` a multiple of
/// 16, every row holds `offset + dim` values; `out.len() == H * rows.len()`.
#[target_feature(enable = "avx512f,avx2,fma")]
pub(super) unsafe fn dot_rows_heads<const H: usize, T: KvElem>(
    qs: &[f32],
    rows: Rows<T>,
    offset: usize,
    out: &mut [f32],
) {
    let (n, dim) = (rows.len(), qs.len() / H);
    let chunks = dim / 16;
    let qp = qs.as_ptr();
    let mut j = 0;
    while j + 4 <= n {
        let p: [*const T; 4] = std::array::from_fn(|i| rows.ptr(j + i).add(offset));
        for ahead in (j + super::prefetch::PREFETCH_ROWS..n).take(4) {
            kv_elem::prefetch(rows.ptr(ahead).add(offset), dim);
        }
        let mut acc = [[_mm512_setzero_ps(); 4]; H];
        for c in 0..chunks {
            let k: [__m512; 4] =
                std::array::from_fn(|i| kv_elem::lanes::<Avx512, T>(p[i].add(16 * c)));
            for (h, acc_h) in acc.iter_mut().enumerate() {
                let qc = _mm512_loadu_ps(qp.add(h * dim + 16 * c));
                for i in 0..4 {
                    acc_h[i] = _mm512_fmadd_ps(qc, k[i], acc_h[i]);
                }
            }
        }
        for (h, acc_h) in acc.iter().enumerate() {
            let s: [__m256; 4] = std::array::from_fn(|i| {
                _mm256_add_ps(
                    _mm512_castps512_ps256(acc_h[i]),
                    _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(acc_h[i]), 1)),
                )
            });
            out[h * n + j..h * n + j + 4].copy_from_slice(&super::avx2::reduce_four(s));
        }
        j += 4;
    }
    super::rows::dot_rows_tail(qs, H, rows, offset, j, out);
}

/// Most query heads [`weighted_sum_heads`] takes at once: four heads' 64-lane
/// accumulators are 16 of the 32 registers.
pub(super) const MAX_SUM_HEADS: usize = 4;

/// [`super::rows::weighted_sum_heads`] for `heads` (1 to 4) heads, 64 lanes at
/// a time.
///
/// # Safety
/// The CPU supports AVX-512F; shapes as `rows::weighted_sum_heads` asks.
#[target_feature(enable = "avx512f")]
pub(super) unsafe fn weighted_sum_heads<T: KvElem>(
    rows: Rows<T>,
    heads: usize,
    weights: &[f32],
    out: &mut [f32],
) {
    use super::rows::weighted_sum_heads as sum;
    match heads {
        1 => sum::<Avx512, T, 1, 4>(rows, weights, out),
        2 => sum::<Avx512, T, 2, 4>(rows, weights, out),
        3 => sum::<Avx512, T, 3, 4>(rows, weights, out),
        4 => sum::<Avx512, T, 4, 4>(rows, weights, out),
        h => unreachable!("{h} heads at once"),
    }
}

super::entry_points::entry_points!(Avx512, "avx512f");
