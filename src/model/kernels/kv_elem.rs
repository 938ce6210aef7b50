//! [`KvElem`]: the number formats attention's row loops read keys and values in — f32,
//! or f16 from a pool that keeps them so (see [`crate::model::KvFormat`]). An f16 value
//! widens to f32 exactly as it is loaded, and every loop then computes in f32 as it
//! does for f32 rows, so the same values give the same results in either format, on
//! every variant.

use half::f16;

use super::lanes::Lanes;

mod sealed {
    pub trait Sealed {}
    impl Sealed for f32 {}
    impl Sealed for half::f16 {}
}

/// A stored key or value: f32 or f16.
pub trait KvElem: Copy + Send + Sync + 'static + sealed::Sealed {
    /// f16 (widened as loaded), not f32: a constant, so each loop is compiled per
    /// format with no branch left.
    const IS_F16: bool;

    /// The value as f32 (exact).
    fn widen(self) -> f32;

    /// `row` as f32s: itself for f32, widened into `buf` for f16.
    fn as_f32<'a>(row: &'a [Self], buf: &'a mut Vec<f32>) -> &'a [f32];
}

impl KvElem for f32 {
    const IS_F16: bool = false;

    #[inline(always)]
    fn widen(self) -> f32 {
        self
    }

    #[inline(always)]
    fn as_f32<'a>(row: &'a [f32], _buf: &'a mut Vec<f32>) -> &'a [f32] {
        row
    }
}

impl KvElem for f16 {
    const IS_F16: bool = true;

    #[inline(always)]
    fn widen(self) -> f32 {
        self.to_f32()
    }

    fn as_f32<'a>(row: &'a [f16], buf: &'a mut Vec<f32>) -> &'a [f32] {
        use half::slice::HalfFloatSliceExt;
        buf.clear();
        buf.resize(row.len(), 0.0);
        row.convert_to_f32_slice(buf);
        buf
    }
}

/// `PANEL` values of `T` from `at`, widened, in `L`'s vector.
///
/// # Safety
/// The CPU runs `L`'s instructions; `PANEL` values are readable at `at`.
#[inline(always)]
pub(super) unsafe fn lanes<L: Lanes, T: KvElem>(at: *const T) -> L::V {
    if T::IS_F16 {
        L::widen_f16(at as *const u16)
    } else {
        L::load(at as *const f32)
    }
}

/// Eight values of `T` from `at`, widened.
///
/// # Safety
/// The CPU runs AVX and F16C; eight values are readable at `at`.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub(super) unsafe fn m256<T: KvElem>(at: *const T) -> std::arch::x86_64::__m256 {
    use std::arch::x86_64::*;
    if T::IS_F16 {
        _mm256_cvtph_ps(_mm_loadu_si128(at as *const __m128i))
    } else {
        _mm256_loadu_ps(at as *const f32)
    }
}

/// Asks for `len` values of `T` from `at` (see [`super::prefetch::prefetch_bytes`]).
#[inline(always)]
pub(super) fn prefetch<T>(at: *const T, len: usize) {
    super::prefetch::prefetch_bytes(at as *const u8, len * std::mem::size_of::<T>());
}
