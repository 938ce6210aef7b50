//! `exp` over a slice of f32, sixteen at a time on AVX-512 and eight on AVX2, giving bit for bit what
//! the scalar `f32::exp` gives on glibc, so attention's softmax keeps its values.
//!
//! glibc's `expf` (since 2.28; the FMA build that x86-64 machines with FMA run) works
//! in double precision: `k + r = x·32/ln 2` (k an integer, |r| ≤ 1/2), `2^(k/32)` from
//! a 32-entry table with k's high bits added to the exponent, and a cubic in `r` for
//! `2^(r/32)`, each step one rounding of a fused or plain operation. This file does the
//! same operations in the same order on eight doubles per register (four on AVX2,
//! whose table lookup is a gather). Inputs where glibc
//! leaves that path (|x| ≥ 88, NaN, infinities: over- and underflow handling) go to
//! `f32::exp` one by one; softmax inputs are `score − max ≤ 0`, so that is rare.
//! `tests/kernel_tests` checks the equality against `f32::exp` over every exponent
//! range the path covers.
//!
//! On other instruction sets, or another C library, `f32::exp` is used throughout:
//! the results are then whatever that library gives, as before this kernel existed.

/// `x[i] = x[i].exp()` for every element, on the active variant.
pub fn exp_in_place(x: &mut [f32]) {
    exp_in_place_with(super::Isa::active(), x);
}

/// [`exp_in_place`] on a variant the caller names (tests); one the CPU lacks falls
/// back to `f32::exp`.
pub fn exp_in_place_with(isa: super::Isa, x: &mut [f32]) {
    #[cfg(all(target_arch = "x86_64", target_os = "linux", target_env = "gnu"))]
    if isa == super::Isa::Avx512 && isa.available() {
        // SAFETY: the CPU has AVX-512F (checked just above).
        unsafe { avx512::exp_in_place(x) };
        return;
    }
    #[cfg(all(target_arch = "x86_64", target_os = "linux", target_env = "gnu"))]
    if isa == super::Isa::Avx2 && isa.available() {
        // SAFETY: the CPU has AVX2 and FMA (checked just above).
        unsafe { avx2::exp_in_place(x) };
        return;
    }
    let _ = isa;
    for v in x {
        *v = v.exp();
    }
}

/// glibc's constants for `expf`'s main path, shared by the vector variants.
#[cfg(all(target_arch = "x86_64", target_os = "linux", target_env = "gnu"))]
mod glibc {
    /// `2^(i/32)` as bits, less `i << 47` (glibc's `__exp2f_data.tab`): adding
    /// `k << 47` for `k ≡ i (mod 32)` puts `k / 32` into the exponent.
    pub(super) const TABLE: [u64; 32] = [
        0x3ff0000000000000,
        0x3fefd9b0d3158574,
        0x3fefb5586cf9890f,
        0x3fef9301d0125b51,
        0x3fef72b83c7d517b,
        0x3fef54873168b9aa,
        0x3fef387a6e756238,
        0x3fef1e9df51fdee1,
        0x3fef06fe0a31b715,
        0x3feef1a7373aa9cb,
        0x3feedea64c123422,
        0x3feece086061892d,
        0x3feebfdad5362a27,
        0x3feeb42b569d4f82,
        0x3feeab07dd485429,
        0x3feea47eb03a5585,
        0x3feea09e667f3bcd,
        0x3fee9f75e8ec5f74,
        0x3feea11473eb0187,
        0x3feea589994cce13,
        0x3feeace5422aa0db,
        0x3feeb737b0cdc5e5,
        0x3feec49182a3f090,
        0x3feed503b23e255d,
        0x3feee89f995ad3ad,
        0x3feeff76f2fb5e47,
        0x3fef199bdd85529c,
        0x3fef3720dcef9069,
        0x3fef5818dcfba487,
        0x3fef7c97337b9b5f,
        0x3fefa4afa2a490da,
        0x3fefd0765b6e4540,
    ];
    /// 32 / ln 2.
    pub(super) const INV_LN2_N: f64 = f64::from_bits(0x40471547652b82fe);
    /// 1.5 · 2^52: adding it rounds to an integer held in the low mantissa bits.
    pub(super) const SHIFT: f64 = f64::from_bits(0x4338000000000000);
    /// The cubic's coefficients for `2^(r/32)`, highest power first.
    pub(super) const C0: f64 = f64::from_bits(0x3ebc6af84b912394);
    pub(super) const C1: f64 = f64::from_bits(0x3f2ebfce50fac4f3);
    pub(super) const C2: f64 = f64::from_bits(0x3f962e42ff0c52d6);
    /// |x| from which glibc leaves the main path (88.0's bits, sign cleared).
    pub(super) const SPECIAL_ABS_BITS: u32 = 0x42b0_0000;
}

#[cfg(all(target_arch = "x86_64", target_os = "linux", target_env = "gnu"))]
mod avx512 {
    use std::arch::x86_64::*;

    use super::glibc::{C0, C1, C2, INV_LN2_N, SHIFT, SPECIAL_ABS_BITS, TABLE};

    /// # Safety
    /// The CPU supports AVX-512F.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn exp_in_place(x: &mut [f32]) {
        let mut chunks = x.chunks_exact_mut(16);
        for chunk in &mut chunks {
            let v = _mm512_loadu_ps(chunk.as_ptr());
            let abs = _mm512_and_si512(_mm512_castps_si512(v), _mm512_set1_epi32(0x7fff_ffff));
            let special = _mm512_cmpge_epu32_mask(abs, _mm512_set1_epi32(SPECIAL_ABS_BITS as i32));
            let lo = exp8(_mm512_cvtps_pd(_mm512_castps512_ps256(v)));
            let hi = exp8(_mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(
                _mm512_castps_pd(v),
                1,
            ))));
            let out = _mm512_castpd_ps(_mm512_insertf64x4(
                _mm512_castpd256_pd512(_mm256_castps_pd(_mm512_cvtpd_ps(lo))),
                _mm256_castps_pd(_mm512_cvtpd_ps(hi)),
                1,
            ));
            _mm512_storeu_ps(chunk.as_mut_ptr(), out);
            if special != 0 {
                let original: [f32; 16] = std::mem::transmute(v);
                for (i, o) in chunk.iter_mut().enumerate() {
                    if special & (1 << i) != 0 {
                        *o = original[i].exp();
                    }
                }
            }
        }
        for v in chunks.into_remainder() {
            *v = v.exp();
        }
    }

    /// glibc's main path on eight doubles (each widened exactly from an f32), each
    /// step the operation glibc's FMA build performs.
    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn exp8(xd: __m512d) -> __m512d {
        let inv = _mm512_set1_pd(INV_LN2_N);
        let shift = _mm512_set1_pd(SHIFT);
        // kd = round(x·32/ln2) via the shift, its integer in the low bits of `ki`.
        let kd = _mm512_fmadd_pd(inv, xd, shift);
        let ki = _mm512_castpd_si512(kd);
        let kd = _mm512_sub_pd(kd, shift);
        // r = x·32/ln2 − k, fused (no rounding of the product).
        let r = _mm512_fmsub_pd(inv, xd, kd);
        // s = 2^(k/32): the table entry for k mod 32, k's high bits in the exponent.
        let index = _mm512_and_si512(ki, _mm512_set1_epi64(31));
        let table_lo = _mm512_loadu_si512(TABLE.as_ptr() as *const _);
        let table_hi = _mm512_loadu_si512(TABLE.as_ptr().add(8) as *const _);
        let table_lo2 = _mm512_loadu_si512(TABLE.as_ptr().add(16) as *const _);
        let table_hi2 = _mm512_loadu_si512(TABLE.as_ptr().add(24) as *const _);
        // Entries 0..16 and 16..32 by the index's low four bits, then bit 4 picks.
        let first = _mm512_permutex2var_epi64(table_lo, index, table_hi);
        let second = _mm512_permutex2var_epi64(table_lo2, index, table_hi2);
        let upper = _mm512_test_epi64_mask(index, _mm512_set1_epi64(16));
        let t = _mm512_mask_blend_epi64(upper, first, second);
        let s = _mm512_castsi512_pd(_mm512_add_epi64(t, _mm512_slli_epi64(ki, 47)));
        // y = (C0·r + C1)·r² + (C2·r + 1), then times s.
        let z = _mm512_fmadd_pd(r, _mm512_set1_pd(C0), _mm512_set1_pd(C1));
        let r2 = _mm512_mul_pd(r, r);
        let y = _mm512_fmadd_pd(r, _mm512_set1_pd(C2), _mm512_set1_pd(1.0));
        let y = _mm512_fmadd_pd(z, r2, y);
        _mm512_mul_pd(y, s)
    }
}

#[cfg(all(target_arch = "x86_64", target_os = "linux", target_env = "gnu"))]
mod avx2 {
    use std::arch::x86_64::*;

    use super::glibc::{C0, C1, C2, INV_LN2_N, SHIFT, SPECIAL_ABS_BITS, TABLE};

    /// The AVX-512 variant's loop, eight floats a step as two halves of four doubles.
    ///
    /// # Safety
    /// The CPU supports AVX2 and FMA.
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn exp_in_place(x: &mut [f32]) {
        let mut chunks = x.chunks_exact_mut(8);
        for chunk in &mut chunks {
            let v = _mm256_loadu_ps(chunk.as_ptr());
            // |x|'s bits are a non-negative i32, so a signed compare orders them.
            let abs = _mm256_and_si256(_mm256_castps_si256(v), _mm256_set1_epi32(0x7fff_ffff));
            let special = _mm256_movemask_ps(_mm256_castsi256_ps(_mm256_cmpgt_epi32(
                abs,
                _mm256_set1_epi32(SPECIAL_ABS_BITS as i32 - 1),
            )));
            let lo = exp4(_mm256_cvtps_pd(_mm256_castps256_ps128(v)));
            let hi = exp4(_mm256_cvtps_pd(_mm256_extractf128_ps::<1>(v)));
            let out = _mm256_insertf128_ps::<1>(
                _mm256_castps128_ps256(_mm256_cvtpd_ps(lo)),
                _mm256_cvtpd_ps(hi),
            );
            _mm256_storeu_ps(chunk.as_mut_ptr(), out);
            if special != 0 {
                let original: [f32; 8] = std::mem::transmute(v);
                for (i, o) in chunk.iter_mut().enumerate() {
                    if special & (1 << i) != 0 {
                        *o = original[i].exp();
                    }
                }
            }
        }
        for v in chunks.into_remainder() {
            *v = v.exp();
        }
    }

    /// `avx512::exp8` on four doubles, operation for operation.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn exp4(xd: __m256d) -> __m256d {
        let inv = _mm256_set1_pd(INV_LN2_N);
        let shift = _mm256_set1_pd(SHIFT);
        let kd = _mm256_fmadd_pd(inv, xd, shift);
        let ki = _mm256_castpd_si256(kd);
        let kd = _mm256_sub_pd(kd, shift);
        let r = _mm256_fmsub_pd(inv, xd, kd);
        let index = _mm256_and_si256(ki, _mm256_set1_epi64x(31));
        let t = _mm256_i64gather_epi64::<8>(TABLE.as_ptr() as *const i64, index);
        let s = _mm256_castsi256_pd(_mm256_add_epi64(t, _mm256_slli_epi64::<47>(ki)));
        let z = _mm256_fmadd_pd(r, _mm256_set1_pd(C0), _mm256_set1_pd(C1));
        let r2 = _mm256_mul_pd(r, r);
        let y = _mm256_fmadd_pd(r, _mm256_set1_pd(C2), _mm256_set1_pd(1.0));
        let y = _mm256_fmadd_pd(z, r2, y);
        _mm256_mul_pd(y, s)
    }
}
