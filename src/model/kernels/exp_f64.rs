//! `exp` over a slice of f64, eight at a time on AVX-512 and four on AVX2, giving bit
//! for bit what the scalar `f64::exp` gives on glibc: sampling's log-sum-exp and its
//! walk over the vocabulary take an `exp` per logit (49,152 on the default model, one
//! to two passes a drawn token), which through libm one at a time were 2.8% of a
//! rollout.
//!
//! glibc's `exp` (since 2.28; the FMA build that x86-64 machines with FMA run): `k + r
//! = x·128/ln 2` by a shift (k an integer), `r` reduced by `ln 2/128` in two fused
//! steps, `2^(k/128) = H·(1 + T)` from a 128-entry table with k's high bits added to
//! H's exponent, a degree-5 polynomial in `r`, and the scale applied by one fused
//! multiply-add. This file does the same operations in the same order (read from the
//! FMA build's machine code) on eight or four doubles a register. Inputs where glibc
//! leaves that path (|x| < 2^-54, zero included, or |x| ≥ 512, NaN, infinities) go to
//! `f64::exp` one by one. `tests/kernel_tests` checks the equality against `f64::exp`
//! over every exponent range the path covers.
//!
//! On other instruction sets, or another C library, `f64::exp` is used throughout.

/// `x[i] = x[i].exp()` for every element, on the active variant.
pub fn exp_f64_in_place(x: &mut [f64]) {
    exp_f64_in_place_with(super::Isa::active(), x);
}

/// [`exp_f64_in_place`] on a variant the caller names (tests); one the CPU lacks
/// falls back to `f64::exp`.
pub fn exp_f64_in_place_with(isa: super::Isa, x: &mut [f64]) {
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

/// glibc's constants for `exp`'s main path (`__exp_data`), shared by the variants.
#[cfg(all(target_arch = "x86_64", target_os = "linux", target_env = "gnu"))]
mod glibc {
    /// `T[k]` of `2^(k/128) = H[k]·(1 + T[k])`, as bits: `2^(k/128) / H[k] − 1` rounded
    /// to the nearest double (generated at 60 digits; equal to glibc's table).
    #[rustfmt::skip]
    pub(super) const TAIL: [u64; 128] = [
        0x0000000000000000, 0x3c9b3b4f1a88bf6e, 0xbc7160139cd8dc5d, 0xbc905e7a108766d1,
        0x3c8cd2523567f613, 0xbc8bce8023f98efa, 0x3c60f74e61e6c861, 0x3c90a3e45b33d399,
        0x3c979aa65d837b6d, 0x3c8eb51a92fdeffc, 0x3c3ebe3d702f9cd1, 0xbc6a033489906e0b,
        0xbc9556522a2fbd0e, 0xbc5080ef8c4eea55, 0xbc91c923b9d5f416, 0x3c80d3e3e95c55af,
        0xbc801b15eaa59348, 0xbc8f1ff055de323d, 0x3c8b898c3f1353bf, 0xbc96d99c7611eb26,
        0x3c9aecf73e3a2f60, 0xbc8fe782cb86389d, 0x3c8a6f4144a6c38d, 0x3c807a05b0e4047d,
        0x3c968efde3a8a894, 0x3c875e18f274487d, 0x3c80472b981fe7f2, 0xbc96b87b3f71085e,
        0x3c82f7e16d09ab31, 0xbc3d219b1a6fbffa, 0x3c8b3782720c0ab4, 0x3c6e149289cecb8f,
        0x3c834d754db0abb6, 0x3c864201e2ac744c, 0x3c8fdd395dd3f84a, 0xbc86a3803b8e5b04,
        0xbc924aedcc4b5068, 0xbc9907f81b512d8e, 0xbc71d1e83e9436d2, 0xbc991919b3ce1b15,
        0x3c859f48a72a4c6d, 0xbc9312607a28698a, 0xbc58a78f4817895b, 0xbc7c2c9b67499a1b,
        0x3c4363ed60c2ac11, 0x3c9666093b0664ef, 0x3c6ecce1daa10379, 0x3c93ff8e3f0f1230,
        0x3c7690cebb7aafb0, 0x3c931dbdeb54e077, 0xbc8f94340071a38e, 0xbc87deccdc93a349,
        0xbc78dec6bd0f385f, 0xbc861246ec7b5cf6, 0x3c93350518fdd78e, 0x3c7b98b72f8a9b05,
        0x3c9063e1e21c5409, 0x3c34c7855019c6ea, 0x3c9432e62b64c035, 0xbc8ce44a6199769f,
        0xbc8c33c53bef4da8, 0xbc845378892be9ae, 0xbc93cedd78565858, 0x3c5710aa807e1964,
        0xbc93b3efbf5e2228, 0xbc6a12ad8734b982, 0xbc6367efb86da9ee, 0xbc80dc3d54e08851,
        0xbc781f647e5a3ecf, 0xbc86ee4ac08b7db0, 0xbc8619321e55e68a, 0x3c909ccb5e09d4d3,
        0xbc7b32dcb94da51d, 0x3c94ecfd5467c06b, 0x3c65ebe1abd66c55, 0xbc88a1c52fb3cf42,
        0xbc9369b6f13b3734, 0xbc805e843a19ff1e, 0xbc94d450d872576e, 0x3c90ad675b0e8a00,
        0x3c8db72fc1f0eab4, 0xbc65b6609cc5e7ff, 0x3c7bf68359f35f44, 0xbc93091fa71e3d83,
        0xbc5da9b88b6c1e29, 0xbc6c23f97c90b959, 0xbc92434322f4f9aa, 0xbc85ca6cd7668e4b,
        0x3c71affc2b91ce27, 0x3c6dd235e10a73bb, 0xbc87c50422622263, 0x3c8b1c86e3e231d5,
        0xbc91bbd1d3bcbb15, 0x3c90cc319cee31d2, 0x3c8469846e735ab3, 0xbc82dfcd978e9db4,
        0x3c8c1a7792cb3387, 0xbc907b8f4ad1d9fa, 0xbc55c3d956dcaeba, 0xbc90a40e3da6f640,
        0xbc68d6f438ad9334, 0xbc91eee26b588a35, 0x3c74ffd70a5fddcd, 0xbc91bdfbfa9298ac,
        0x3c736eae30af0cb3, 0x3c8ee3325c9ffd94, 0x3c84e08fd10959ac, 0x3c63cdaf384e1a67,
        0x3c676b2c6c921968, 0xbc808a1883ccb5d2, 0xbc8fad5d3ffffa6f, 0xbc900dae3875a949,
        0x3c74a385a63d07a7, 0xbc82919e2040220f, 0x3c8e5a50d5c192ac, 0x3c843a59ac016b4b,
        0xbc82d52107b43e1f, 0xbc892ab93b470dc9, 0x3c74b604603a88d3, 0x3c83c5ec519d7271,
        0xbc8ff7128fd391f0, 0xbc8dae98e223747d, 0x3c8ec3bc41aa2008, 0x3c842b94c3a9eb32,
        0x3c8a64a931d185ee, 0xbc8e37bae43be3ed, 0x3c77893b4d91cd9d, 0x3c5305c14160cc89,
    ];
    /// `H[k]`, `2^(k/128)` rounded to the nearest double, as bits less `k << 45`:
    /// adding `k << 45` for any `k` with that remainder puts `k / 128` into the exponent.
    #[rustfmt::skip]
    pub(super) const HEAD: [u64; 128] = [
        0x3ff0000000000000, 0x3feff63da9fb3335, 0x3fefec9a3e778061, 0x3fefe315e86e7f85,
        0x3fefd9b0d3158574, 0x3fefd06b29ddf6de, 0x3fefc74518759bc8, 0x3fefbe3ecac6f383,
        0x3fefb5586cf9890f, 0x3fefac922b7247f7, 0x3fefa3ec32d3d1a2, 0x3fef9b66affed31b,
        0x3fef9301d0125b51, 0x3fef8abdc06c31cc, 0x3fef829aaea92de0, 0x3fef7a98c8a58e51,
        0x3fef72b83c7d517b, 0x3fef6af9388c8dea, 0x3fef635beb6fcb75, 0x3fef5be084045cd4,
        0x3fef54873168b9aa, 0x3fef4d5022fcd91d, 0x3fef463b88628cd6, 0x3fef3f49917ddc96,
        0x3fef387a6e756238, 0x3fef31ce4fb2a63f, 0x3fef2b4565e27cdd, 0x3fef24dfe1f56381,
        0x3fef1e9df51fdee1, 0x3fef187fd0dad990, 0x3fef1285a6e4030b, 0x3fef0cafa93e2f56,
        0x3fef06fe0a31b715, 0x3fef0170fc4cd831, 0x3feefc08b26416ff, 0x3feef6c55f929ff1,
        0x3feef1a7373aa9cb, 0x3feeecae6d05d866, 0x3feee7db34e59ff7, 0x3feee32dc313a8e5,
        0x3feedea64c123422, 0x3feeda4504ac801c, 0x3feed60a21f72e2a, 0x3feed1f5d950a897,
        0x3feece086061892d, 0x3feeca41ed1d0057, 0x3feec6a2b5c13cd0, 0x3feec32af0d7d3de,
        0x3feebfdad5362a27, 0x3feebcb299fddd0d, 0x3feeb9b2769d2ca7, 0x3feeb6daa2cf6642,
        0x3feeb42b569d4f82, 0x3feeb1a4ca5d920f, 0x3feeaf4736b527da, 0x3feead12d497c7fd,
        0x3feeab07dd485429, 0x3feea9268a5946b7, 0x3feea76f15ad2148, 0x3feea5e1b976dc09,
        0x3feea47eb03a5585, 0x3feea34634ccc320, 0x3feea23882552225, 0x3feea155d44ca973,
        0x3feea09e667f3bcd, 0x3feea012750bdabf, 0x3fee9fb23c651a2f, 0x3fee9f7df9519484,
        0x3fee9f75e8ec5f74, 0x3fee9f9a48a58174, 0x3fee9feb564267c9, 0x3feea0694fde5d3f,
        0x3feea11473eb0187, 0x3feea1ed0130c132, 0x3feea2f336cf4e62, 0x3feea427543e1a12,
        0x3feea589994cce13, 0x3feea71a4623c7ad, 0x3feea8d99b4492ed, 0x3feeaac7d98a6699,
        0x3feeace5422aa0db, 0x3feeaf3216b5448c, 0x3feeb1ae99157736, 0x3feeb45b0b91ffc6,
        0x3feeb737b0cdc5e5, 0x3feeba44cbc8520f, 0x3feebd829fde4e50, 0x3feec0f170ca07ba,
        0x3feec49182a3f090, 0x3feec86319e32323, 0x3feecc667b5de565, 0x3feed09bec4a2d33,
        0x3feed503b23e255d, 0x3feed99e1330b358, 0x3feede6b5579fdbf, 0x3feee36bbfd3f37a,
        0x3feee89f995ad3ad, 0x3feeee07298db666, 0x3feef3a2b84f15fb, 0x3feef9728de5593a,
        0x3feeff76f2fb5e47, 0x3fef05b030a1064a, 0x3fef0c1e904bc1d2, 0x3fef12c25bd71e09,
        0x3fef199bdd85529c, 0x3fef20ab5fffd07a, 0x3fef27f12e57d14b, 0x3fef2f6d9406e7b5,
        0x3fef3720dcef9069, 0x3fef3f0b555dc3fa, 0x3fef472d4a07897c, 0x3fef4f87080d89f2,
        0x3fef5818dcfba487, 0x3fef60e316c98398, 0x3fef69e603db3285, 0x3fef7321f301b460,
        0x3fef7c97337b9b5f, 0x3fef864614f5a129, 0x3fef902ee78b3ff6, 0x3fef9a51fbc74c83,
        0x3fefa4afa2a490da, 0x3fefaf482d8e67f1, 0x3fefba1bee615a27, 0x3fefc52b376bba97,
        0x3fefd0765b6e4540, 0x3fefdbfdad9cbe14, 0x3fefe7c1819e90d8, 0x3feff3c22b8f71f1,
    ];
    /// 128 / ln 2.
    pub(super) const INV_LN2_N: f64 = f64::from_bits(0x40671547652b82fe);
    /// −ln 2 / 128 in two parts: the high part's product with `k` is exact.
    pub(super) const NEG_LN2_HI_N: f64 = f64::from_bits(0xbf762e42fefa0000);
    pub(super) const NEG_LN2_LO_N: f64 = f64::from_bits(0xbd0cf79abc9e3b3a);
    /// 1.5 · 2^52: adding it rounds to an integer held in the low mantissa bits.
    pub(super) const SHIFT: f64 = f64::from_bits(0x4338000000000000);
    /// The polynomial's coefficients of `r²` to `r⁵`.
    pub(super) const C2: f64 = f64::from_bits(0x3fdffffffffffdbd);
    pub(super) const C3: f64 = f64::from_bits(0x3fc555555555543c);
    pub(super) const C4: f64 = f64::from_bits(0x3fa55555cf172b91);
    pub(super) const C5: f64 = f64::from_bits(0x3f81111167a4d017);
    /// The main path's exponents: `top12(|x|) − 0x3c9 ≤ 0x3e`, i.e. 2^-54 ≤ |x| < 512.
    pub(super) const TOP_FIRST: i64 = 0x3c9;
    pub(super) const TOP_SPAN: i64 = 0x3e;
}

#[cfg(all(target_arch = "x86_64", target_os = "linux", target_env = "gnu"))]
mod avx512 {
    use std::arch::x86_64::*;

    use super::glibc::*;

    /// # Safety
    /// The CPU supports AVX-512F.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn exp_in_place(x: &mut [f64]) {
        let mut chunks = x.chunks_exact_mut(8);
        for chunk in &mut chunks {
            let v = _mm512_loadu_pd(chunk.as_ptr());
            let top = _mm512_and_si512(
                _mm512_srli_epi64(_mm512_castpd_si512(v), 52),
                _mm512_set1_epi64(0x7ff),
            );
            // Unsigned: exponents below the range wrap to huge values.
            let main = _mm512_cmple_epu64_mask(
                _mm512_sub_epi64(top, _mm512_set1_epi64(TOP_FIRST)),
                _mm512_set1_epi64(TOP_SPAN),
            );
            _mm512_storeu_pd(chunk.as_mut_ptr(), exp8(v));
            if main != 0xff {
                let original: [f64; 8] = std::mem::transmute(v);
                for (i, o) in chunk.iter_mut().enumerate() {
                    if main & (1 << i) == 0 {
                        *o = original[i].exp();
                    }
                }
            }
        }
        for v in chunks.into_remainder() {
            *v = v.exp();
        }
    }

    /// glibc's main path on eight doubles, each step the operation its FMA build
    /// performs.
    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn exp8(x: __m512d) -> __m512d {
        let shift = _mm512_set1_pd(SHIFT);
        // k = round(x·128/ln2) via the shift, its integer in the low bits of `ki`.
        let kd = _mm512_fmadd_pd(x, _mm512_set1_pd(INV_LN2_N), shift);
        let ki = _mm512_castpd_si512(kd);
        let kd = _mm512_sub_pd(kd, shift);
        // r = x − k·ln2/128, the constant in two parts, each step fused.
        let r = _mm512_fmadd_pd(kd, _mm512_set1_pd(NEG_LN2_HI_N), x);
        let r = _mm512_fmadd_pd(kd, _mm512_set1_pd(NEG_LN2_LO_N), r);
        // The table entry for k mod 128; k's high bits go into H's exponent.
        let index = _mm512_and_si512(ki, _mm512_set1_epi64(127));
        let tail = _mm512_i64gather_pd::<8>(index, TAIL.as_ptr() as *const f64);
        let head = _mm512_i64gather_epi64::<8>(index, HEAD.as_ptr() as *const i64);
        let scale = _mm512_castsi512_pd(_mm512_add_epi64(head, _mm512_slli_epi64(ki, 45)));
        // tmp = (T + r) + r²·(C2 + r·C3) + r⁴·(C4 + r·C5).
        let a = _mm512_fmadd_pd(r, _mm512_set1_pd(C3), _mm512_set1_pd(C2));
        let t0 = _mm512_add_pd(r, tail);
        let r2 = _mm512_mul_pd(r, r);
        let b = _mm512_fmadd_pd(r, _mm512_set1_pd(C5), _mm512_set1_pd(C4));
        let t1 = _mm512_fmadd_pd(a, r2, t0);
        let r4 = _mm512_mul_pd(r2, r2);
        let tmp = _mm512_fmadd_pd(r4, b, t1);
        // scale · (1 + tmp), one fused step.
        _mm512_fmadd_pd(scale, tmp, scale)
    }
}

#[cfg(all(target_arch = "x86_64", target_os = "linux", target_env = "gnu"))]
mod avx2 {
    use std::arch::x86_64::*;

    use super::glibc::*;

    /// The AVX-512 variant's loop on four doubles a step.
    ///
    /// # Safety
    /// The CPU supports AVX2 and FMA.
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn exp_in_place(x: &mut [f64]) {
        let mut chunks = x.chunks_exact_mut(4);
        for chunk in &mut chunks {
            let v = _mm256_loadu_pd(chunk.as_ptr());
            let top = _mm256_and_si256(
                _mm256_srli_epi64::<52>(_mm256_castpd_si256(v)),
                _mm256_set1_epi64x(0x7ff),
            );
            // Outside unless 0 ≤ top − TOP_FIRST ≤ TOP_SPAN (signed: top ≤ 0x7ff).
            let d = _mm256_sub_epi64(top, _mm256_set1_epi64x(TOP_FIRST));
            let outside = _mm256_or_si256(
                _mm256_cmpgt_epi64(d, _mm256_set1_epi64x(TOP_SPAN)),
                _mm256_cmpgt_epi64(_mm256_setzero_si256(), d),
            );
            let outside = _mm256_movemask_pd(_mm256_castsi256_pd(outside));
            _mm256_storeu_pd(chunk.as_mut_ptr(), exp4(v));
            if outside != 0 {
                let original: [f64; 4] = std::mem::transmute(v);
                for (i, o) in chunk.iter_mut().enumerate() {
                    if outside & (1 << i) != 0 {
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
    unsafe fn exp4(x: __m256d) -> __m256d {
        let shift = _mm256_set1_pd(SHIFT);
        let kd = _mm256_fmadd_pd(x, _mm256_set1_pd(INV_LN2_N), shift);
        let ki = _mm256_castpd_si256(kd);
        let kd = _mm256_sub_pd(kd, shift);
        let r = _mm256_fmadd_pd(kd, _mm256_set1_pd(NEG_LN2_HI_N), x);
        let r = _mm256_fmadd_pd(kd, _mm256_set1_pd(NEG_LN2_LO_N), r);
        let index = _mm256_and_si256(ki, _mm256_set1_epi64x(127));
        let tail = _mm256_i64gather_pd::<8>(TAIL.as_ptr() as *const f64, index);
        let head = _mm256_i64gather_epi64::<8>(HEAD.as_ptr() as *const i64, index);
        let scale = _mm256_castsi256_pd(_mm256_add_epi64(head, _mm256_slli_epi64::<45>(ki)));
        let a = _mm256_fmadd_pd(r, _mm256_set1_pd(C3), _mm256_set1_pd(C2));
        let t0 = _mm256_add_pd(r, tail);
        let r2 = _mm256_mul_pd(r, r);
        let b = _mm256_fmadd_pd(r, _mm256_set1_pd(C5), _mm256_set1_pd(C4));
        let t1 = _mm256_fmadd_pd(a, r2, t0);
        let r4 = _mm256_mul_pd(r2, r2);
        let tmp = _mm256_fmadd_pd(r4, b, t1);
        _mm256_fmadd_pd(scale, tmp, scale)
    }
}
