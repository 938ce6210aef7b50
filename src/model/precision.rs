//! The arithmetic the engine serves a model with: exact (the default) or fast.
//!
//! - **Exact**: f32 activations against each weight's exact value (a quantised matrix
//!   gives exactly what its dequantised f32 copy gives), one fixed order per output:
//!   the logits match candle-transformers within 1e-3 and the trainer's dense weights
//!   start where the engine left off.
//! - **Fast**: Q4_0, Q4_1 and Q8_0 layers take 8-bit activations (one scale per block
//!   of 32) and integer dot products (`kernels::int8`), as llama.cpp computes; other
//!   formats stay exact. Still deterministic and batch-invariant, but logits move
//!   (docs/numerics-and-precision.md gives the measured drift), so a trainer that
//!   takes the engine's logprobs as the old policy's should use the exact mode or
//!   recompute them.

use std::fmt;
use std::str::FromStr;

/// See the module docs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Hash, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Precision {
    /// f32 activations against each weight's exact value (see the module docs).
    #[default]
    Exact,
    /// 8-bit activations on the Q4_0, Q4_1 and Q8_0 layers, as llama.cpp computes.
    Fast,
}

impl Precision {
    /// `exact` or `fast`, as `--precision` takes it.
    pub fn name(self) -> &'static str {
        match self {
            Precision::Exact => "exact",
            Precision::Fast => "fast",
        }
    }
}

impl fmt::Display for Precision {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// An unknown precision name.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown precision `{0}` (expected exact or fast)")]
pub struct UnknownPrecision(pub String);

impl FromStr for Precision {
    type Err = UnknownPrecision;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "exact" => Ok(Precision::Exact),
            "fast" => Ok(Precision::Fast),
            other => Err(UnknownPrecision(other.to_string())),
        }
    }
}
