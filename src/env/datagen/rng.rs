//! The data generators' seeded stream: SplitMix64 ([`crate::random`]), so generated
//! data is the same on every machine and every version of every dependency.

pub use crate::random::{SplitMix64 as Rng, Uniform};
