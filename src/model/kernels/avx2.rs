//! [`Lanes`] on AVX2 + FMA (+ F16C): two 256-bit registers per panel of 16 outputs.

use std::arch::x86_64::*;

use super::kv_elem::{self, KvElem};
use super::lanes::Lanes;
use super::row_runs::Rows;

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
    // Too few registers for a 9-row tile of whole panels; half panels instead.
    const WIDE_ROWS: usize = 0;
    // 12 rows × one half panel = 12 accumulators, one converted weight vector, the
    // row's x and the block's scale.
    const HALF_ROWS: usize = 12;
    type Lo = Avx2Half<false>;
    type Hi = Avx2Half<true>;
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
        Pair(widen_bf16_8(at), widen_bf16_8(at.add(8)))
    }
    #[inline(always)]
    unsafe fn widen_f16(at: *const u16) -> Pair {
        Pair(widen_f16_8(at), widen_f16_8(at.add(8)))
    }
    #[inline(always)]
    unsafe fn q4_pair<const OFFSET: bool>(at: *const u8, d: Pair, m: Pair) -> (Pair, Pair) {
        let (a0, b0) = q4_pair_8::<OFFSET>(at, d.0, m.0);
        let (a1, b1) = q4_pair_8::<OFFSET>(at.add(8), d.1, m.1);
        (Pair(a0, a1), Pair(b0, b1))
    }
    #[inline(always)]
    unsafe fn q8(at: *const u8, d: Pair) -> Pair {
        Pair(q8_8(at, d.0), q8_8(at.add(8), d.1))
    }
}

/// Half a panel: outputs 0–7 (`HI = false`) or 8–15 (`HI = true`) in one register.
/// Every address names the whole panel's start, as for [`Avx2`]; the half adds its
/// offset of eight elements. A tile of half panels holds twice the rows of a whole
/// panel's tile in the same registers, so each converted weight serves twice the rows
/// without being written to scratch; each lane's operations are the same as in the
/// whole panel, in the same order.
pub(super) struct Avx2Half<const HI: bool>;

impl<const HI: bool> Avx2Half<HI> {
    const AT: usize = if HI { 8 } else { 0 };
}

impl<const HI: bool> Lanes for Avx2Half<HI> {
    type V = __m256;
    // Only the tiles of `tile::half_tiles` use these lanes.
    const ROW_TILE: usize = 12;
    const PANEL_GROUP: usize = 1;
    const WIDE_ROWS: usize = 0;
    const HALF_ROWS: usize = 0;
    type Lo = Self;
    type Hi = Self;
    #[inline(always)]
    unsafe fn zero() -> __m256 {
        _mm256_setzero_ps()
    }
    #[inline(always)]
    unsafe fn load(at: *const f32) -> __m256 {
        _mm256_loadu_ps(at.add(Self::AT))
    }
    #[inline(always)]
    unsafe fn store(at: *mut f32, v: __m256) {
        _mm256_storeu_ps(at.add(Self::AT), v)
    }
    #[inline(always)]
    unsafe fn splat(x: f32) -> __m256 {
        _mm256_set1_ps(x)
    }
    #[inline(always)]
    unsafe fn fmadd(a: __m256, b: __m256, c: __m256) -> __m256 {
        _mm256_fmadd_ps(a, b, c)
    }
    #[inline(always)]
    unsafe fn mul_add_twice(a: __m256, b: __m256, c: __m256) -> __m256 {
        _mm256_add_ps(_mm256_mul_ps(a, b), c)
    }
    #[inline(always)]
    unsafe fn widen_bf16(at: *const u16) -> __m256 {
        widen_bf16_8(at.add(Self::AT))
    }
    #[inline(always)]
    unsafe fn widen_f16(at: *const u16) -> __m256 {
        widen_f16_8(at.add(Self::AT))
    }
    #[inline(always)]
    unsafe fn q4_pair<const OFFSET: bool>(at: *const u8, d: __m256, m: __m256) -> (__m256, __m256) {
        q4_pair_8::<OFFSET>(at.add(Self::AT), d, m)
    }
    #[inline(always)]
    unsafe fn q8(at: *const u8, d: __m256) -> __m256 {
        q8_8(at.add(Self::AT), d)
    }
}

/// Eight bf16 values widened to f32 (exact: bf16 is f32's upper half).
#[inline(always)]
unsafe fn widen_bf16_8(at: *const u16) -> __m256 {
    let bits = _mm256_cvtepu16_epi32(_mm_loadu_si128(at as *const __m128i));
    _mm256_castsi256_ps(_mm256_slli_epi32(bits, 16))
}

/// Eight f16 values widened to f32 (exact).
#[inline(always)]
unsafe fn widen_f16_8(at: *const u16) -> __m256 {
    _mm256_cvtph_ps(_mm_loadu_si128(at as *const __m128i))
}

/// Eight bytes of Q4 nibble pairs (eight outputs) as the weights at k and k + 1.
#[inline(always)]
unsafe fn q4_pair_8<const OFFSET: bool>(at: *const u8, d: __m256, m: __m256) -> (__m256, __m256) {
    let v = _mm256_cvtepu8_epi32(_mm_loadl_epi64(at as *const __m128i));
    let mut lo = _mm256_and_si256(v, _mm256_set1_epi32(0x0F));
    let mut hi = _mm256_srli_epi32(v, 4);
    if !OFFSET {
        lo = _mm256_sub_epi32(lo, _mm256_set1_epi32(8));
        hi = _mm256_sub_epi32(hi, _mm256_set1_epi32(8));
    }
    // `q·d` is exact (a 4-bit integer times an f16 scale fits f32's 24 bits), so one
    // fma rounds `q·d + m` exactly as a multiply and an add would.
    let (lo, hi) = (_mm256_cvtepi32_ps(lo), _mm256_cvtepi32_ps(hi));
    if OFFSET {
        (_mm256_fmadd_ps(lo, d, m), _mm256_fmadd_ps(hi, d, m))
    } else {
        (_mm256_mul_ps(lo, d), _mm256_mul_ps(hi, d))
    }
}

/// Eight signed bytes as `q·d`.
#[inline(always)]
unsafe fn q8_8(at: *const u8, d: __m256) -> __m256 {
    let v = _mm256_cvtepi8_epi32(_mm_loadl_epi64(at as *const __m128i));
    _mm256_mul_ps(_mm256_cvtepi32_ps(v), d)
}

/// [`super::rows::dot_fixed`] of `q` with `row_j[offset..]` into `out[j]`: the
/// one-head case of [`dot_rows_heads`].
///
/// # Safety
/// As [`dot_rows_heads`] with one head.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn dot_rows(q: &[f32], rows: Rows, offset: usize, out: &mut [f32]) {
    dot_rows_heads::<f32>(q, 1, rows, offset, out)
}

/// [`super::rows::dot_fixed`] of `heads` queries (`qs`: `heads × dim`, grouped-query
/// attention's heads sharing one KV head) with `row_j[offset..]`, head `h`'s scores
/// into `out[h * rows.len()..]`, four rows at a time: the four keys' lane sums are
/// reduced together by shuffles that add exactly the pairs `dot_fixed` adds, so each
/// result is bit-identical to it. Every head takes its turn on the same four rows
/// before the next four, so a key row comes from memory once for all heads and from
/// L1 for the others (eight accumulators per head fill half the 16 registers, so the
/// heads cannot share one pass as on AVX-512).
///
/// # Safety
/// The CPU supports AVX2 and FMA; `qs.len() == heads * dim` with `dim` a multiple of
/// 16, every row holds `offset + dim` values; `out.len() == heads * rows.len()`.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn dot_rows_heads<T: KvElem>(
    qs: &[f32],
    heads: usize,
    rows: Rows<T>,
    offset: usize,
    out: &mut [f32],
) {
    let (n, dim) = (rows.len(), qs.len() / heads);
    let chunks = dim / 16;
    let mut j = 0;
    while j + 4 <= n {
        let p: [*const T; 4] = std::array::from_fn(|i| rows.ptr(j + i).add(offset));
        for ahead in (j + super::prefetch::PREFETCH_ROWS..n).take(4) {
            kv_elem::prefetch(rows.ptr(ahead).add(offset), dim);
        }
        for h in 0..heads {
            let qp = qs.as_ptr().add(h * dim);
            let mut lo = [_mm256_setzero_ps(); 4];
            let mut hi = [_mm256_setzero_ps(); 4];
            for c in 0..chunks {
                let (q0, q1) = (
                    _mm256_loadu_ps(qp.add(16 * c)),
                    _mm256_loadu_ps(qp.add(16 * c + 8)),
                );
                for i in 0..4 {
                    lo[i] = _mm256_fmadd_ps(q0, kv_elem::m256(p[i].add(16 * c)), lo[i]);
                    hi[i] = _mm256_fmadd_ps(q1, kv_elem::m256(p[i].add(16 * c + 8)), hi[i]);
                }
            }
            // 16 → 8: lane l += lane l + 8.
            let s: [__m256; 4] = std::array::from_fn(|i| _mm256_add_ps(lo[i], hi[i]));
            out[h * n + j..h * n + j + 4].copy_from_slice(&reduce_four(s));
        }
        j += 4;
    }
    super::rows::dot_rows_tail(qs, heads, rows, offset, j, out);
}

/// Most query heads [`weighted_sum_heads`] takes at once: three heads' 32-lane
/// accumulators are 12 of the 16 registers.
pub(super) const MAX_SUM_HEADS: usize = 3;

/// [`super::rows::weighted_sum_heads`] for `heads` (1 to 3) heads, 32 lanes at
/// a time.
///
/// # Safety
/// The CPU supports AVX2 and FMA; shapes as `rows::weighted_sum_heads` asks.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn weighted_sum_heads<T: KvElem>(
    rows: Rows<T>,
    heads: usize,
    weights: &[f32],
    out: &mut [f32],
) {
    use super::rows::weighted_sum_heads as sum;
    match heads {
        1 => sum::<Avx2, T, 1, 2>(rows, weights, out),
        2 => sum::<Avx2, T, 2, 2>(rows, weights, out),
        3 => sum::<Avx2, T, 3, 2>(rows, weights, out),
        h => unreachable!("{h} heads at once"),
    }
}

/// The last three halvings of [`super::rows::dot_fixed`] for four keys at once: each
/// `s[i]` holds key `i`'s eight lane sums (lanes 0..8 after `l += l + 8`); returns the
/// four dot products. Shared by the AVX2 and AVX-512 `dot_rows`, so both add exactly
/// the same pairs.
///
/// # Safety
/// The CPU supports AVX2.
#[inline]
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn reduce_four(s: [__m256; 4]) -> [f32; 4] {
    // 8 → 4: [s0 low half + s0 high half | s1 …], and the same for s2, s3.
    let ab = _mm256_add_ps(
        _mm256_permute2f128_ps(s[0], s[1], 0x20),
        _mm256_permute2f128_ps(s[0], s[1], 0x31),
    );
    let cd = _mm256_add_ps(
        _mm256_permute2f128_ps(s[2], s[3], 0x20),
        _mm256_permute2f128_ps(s[2], s[3], 0x31),
    );
    // 4 → 2: per 128-bit half, [x0 + x2, x1 + x3] of ab, then of cd.
    let y = _mm256_add_ps(
        _mm256_shuffle_ps(ab, cd, 0b01_00_01_00),
        _mm256_shuffle_ps(ab, cd, 0b11_10_11_10),
    );
    // 2 → 1: [a, c, a, c | b, d, b, d].
    let z = _mm256_add_ps(
        _mm256_permute_ps(y, 0b10_00_10_00),
        _mm256_permute_ps(y, 0b11_01_11_01),
    );
    let mut lanes = [0f32; 8];
    _mm256_storeu_ps(lanes.as_mut_ptr(), z);
    // `+ 0.0`: dot_fixed's (empty) tail, which turns a −0 sum into +0 as it does.
    [
        lanes[0] + 0.0,
        lanes[4] + 0.0,
        lanes[1] + 0.0,
        lanes[5] + 0.0,
    ]
}

super::entry_points::entry_points!(Avx2, "avx2,fma,f16c");
