//! The number format a model's keys and values are kept in between steps: f32, or
//! f16 under `--precision fast` (as llama.cpp keeps its cache), which halves the bytes
//! attention reads — at rollout contexts the larger part of a step's time — and the
//! memory a cached position takes.
//!
//! The format belongs to the model's arithmetic, not to a store: under
//! [`KvFormat::F16`] the forward rounds each new key and value to f16 before handing
//! it to the [`KvStore`](super::KvStore), so a store that keeps them in f16 (the paged
//! cache) and one that keeps them in f32 (the dense store of `generate` and the
//! oracles) hold the same values and give the same logits, bit for bit.

use half::f16;

/// How keys and values are kept between steps.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, serde::Serialize)]
pub enum KvFormat {
    /// As computed (the exact path).
    #[default]
    F32,
    /// Rounded to nearest-even f16, saturating at f16's largest finite value (an
    /// overflow to infinity would turn a whole softmax into NaN).
    F16,
}

impl KvFormat {
    /// Bytes one stored value takes.
    pub fn bytes(self) -> usize {
        match self {
            KvFormat::F32 => 4,
            KvFormat::F16 => 2,
        }
    }

    /// `f32` or `f16`, as reports print it.
    pub fn name(self) -> &'static str {
        match self {
            KvFormat::F32 => "f32",
            KvFormat::F16 => "f16",
        }
    }

    /// Rounds `values` to what this format holds (nothing for f32).
    pub fn round(self, values: &mut [f32]) {
        if self == KvFormat::F16 {
            for v in values {
                *v = to_f16(*v).to_f32();
            }
        }
    }

    /// Whether every one of `values` is held exactly (a store in this format then
    /// keeps them unchanged).
    pub fn holds(self, values: &[f32]) -> bool {
        match self {
            KvFormat::F32 => true,
            KvFormat::F16 => values
                .iter()
                .all(|&v| v.is_nan() || to_f16(v).to_f32() == v),
        }
    }
}

/// `v` as f16, rounded to nearest-even, saturating at ±65504 (NaN stays NaN).
pub fn to_f16(v: f32) -> f16 {
    f16::from_f32(v.clamp(-f16::MAX.to_f32(), f16::MAX.to_f32()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn f16_rounds_to_nearest_even_and_saturates() {
        // f16's unit in the last place at 1 is 2^-10: half of one past 1 is a tie that
        // goes to the even 1, one and a half past it a tie that goes to the even 2.
        let ulp = 1.0 / 1024.0;
        let mut v = [1.0, 1.0 + ulp / 2.0, 1.0 + 1.5 * ulp, 1e6, -1e6, 0.1];
        KvFormat::F16.round(&mut v);
        assert_eq!(v[0], 1.0);
        assert_eq!(v[1], 1.0);
        assert_eq!(v[2], 1.0 + 2.0 * ulp);
        assert_eq!(v[3], 65504.0);
        assert_eq!(v[4], -65504.0);
        assert_eq!(v[5], f16::from_f32(0.1).to_f32());
        assert!(KvFormat::F16.holds(&v));
        assert!(!KvFormat::F16.holds(&[0.1]));
        let mut exact = [0.1f32];
        KvFormat::F32.round(&mut exact);
        assert_eq!(exact, [0.1]);
    }
}
