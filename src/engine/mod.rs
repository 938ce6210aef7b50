//! The engine layer: turns model forwards into generated sequences.
//!
//! - [`rng`]: a small, stable per-sequence RNG (results must not change with crate versions).
//! - [`sampling`]: temperature / top-k / top-p sampling with the sampled token's logprob.
//! - [`generate`]: single-sequence generation over a dense KV store (the `generate` command).

pub mod generate;
pub mod rng;
pub mod sampling;

pub use generate::{generate, GenerateRequest, Generation, StopReason};
pub use rng::SeqRng;
pub use sampling::{SampledToken, Sampling};
