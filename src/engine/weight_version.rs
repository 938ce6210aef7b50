//! [`WeightVersion`]: which weights a token was sampled under. A leaf file, so the
//! core, its counters and the weight swap (`weights`) name it without importing
//! each other.

/// The weights' version: 0 for the weights the engine started with, then one more per
/// swap.
pub type WeightVersion = u64;
