//! [`Lanes`] in portable Rust: sixteen f32 lanes as an array, one `mul_add` each. The
//! fallback for CPUs without AVX2, and the plainest statement of the arithmetic the
//! vector kernels must reproduce bit for bit.

use half::{bf16, f16};

use super::lanes::Lanes;

pub(super) struct Scalar;

type V = [f32; 16];

impl Lanes for Scalar {
    type V = V;
    const ROW_TILE: usize = 8;
    const PANEL_GROUP: usize = 2;
    // The plain tiles only (there are no registers to fit).
    const WIDE_ROWS: usize = 0;
    const HALF_ROWS: usize = 0;
    type Lo = Self;
    type Hi = Self;
    #[inline(always)]
    unsafe fn zero() -> V {
        [0.0; 16]
    }
    #[inline(always)]
    unsafe fn load(at: *const f32) -> V {
        std::ptr::read_unaligned(at as *const V)
    }
    #[inline(always)]
    unsafe fn store(at: *mut f32, v: V) {
        std::ptr::write_unaligned(at as *mut V, v)
    }
    #[inline(always)]
    unsafe fn splat(x: f32) -> V {
        [x; 16]
    }
    #[inline(always)]
    unsafe fn fmadd(a: V, b: V, c: V) -> V {
        std::array::from_fn(|l| a[l].mul_add(b[l], c[l]))
    }
    #[inline(always)]
    unsafe fn mul_add_twice(a: V, b: V, c: V) -> V {
        std::array::from_fn(|l| a[l] * b[l] + c[l])
    }
    #[inline(always)]
    unsafe fn widen_bf16(at: *const u16) -> V {
        std::array::from_fn(|l| bf16::from_bits(*at.add(l)).to_f32())
    }
    #[inline(always)]
    unsafe fn widen_f16(at: *const u16) -> V {
        std::array::from_fn(|l| f16::from_bits(*at.add(l)).to_f32())
    }
    #[inline(always)]
    unsafe fn q4_pair<const OFFSET: bool>(at: *const u8, d: V, m: V) -> (V, V) {
        let w = |q: u8, l: usize| {
            if OFFSET {
                q as f32 * d[l] + m[l]
            } else {
                (q as i32 - 8) as f32 * d[l]
            }
        };
        (
            std::array::from_fn(|l| w(*at.add(l) & 0x0F, l)),
            std::array::from_fn(|l| w(*at.add(l) >> 4, l)),
        )
    }
    #[inline(always)]
    unsafe fn q8(at: *const u8, d: V) -> V {
        std::array::from_fn(|l| (*at.add(l) as i8) as f32 * d[l])
    }
}

super::entry_points::entry_points!(Scalar);
