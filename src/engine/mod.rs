//! The engine layer: turns model forwards into generated sequences.
//!
//! - [`core`]: [`EngineCore`], sequences over the paged KV cache advanced together one
//!   ragged batch per step (fork, append, generate, pin, free; counters).
//! - [`sequence`]: what the core keeps per sequence and generation; [`Generation`].
//! - [`config`]: [`EngineConfig`], the scheduler's limits and the default KV budget.
//! - `schedule`: one step — admission under the token, sequence and KV limits, the
//!   forward, and what its rows mean for each sequence.
//! - `preempt`: preemption by recompute under memory pressure (victims, restore).
//! - `next_token`: sampling a generation's next token and its stop conditions.
//! - [`handle`]: [`Engine`], the core on its own thread behind an async API;
//!   [`owned`]: [`OwnedSeq`], a sequence freed when the work that owns it ends or is
//!   abandoned.
//! - [`stop`]: generation parameters and stop conditions.
//! - [`weights`]: swapping the served weights; weight versions.
//! - [`counters`]: every computed row counted once (prefilled, decoded, reused).
//! - [`step_log`]: an optional JSON line per step (`TREEGRPO_STEP_LOG=FILE`).
//! - [`rng`]: a small, stable per-sequence RNG (results must not change with crate versions).
//! - [`sampling`]: temperature / top-k / top-p sampling with the sampled token's logprob.
//! - [`sampling_error`]: a sampling option out of range, named by its request field.
//! - [`weight_version`]: which weights a token was sampled under.

pub mod config;
pub mod core;
pub mod counters;
mod death;
pub mod error;
pub mod handle;
mod next_token;
pub mod owned;
pub mod penalties;
mod preempt;
pub mod rng;
pub mod sampling;
pub mod sampling_error;
mod schedule;
pub mod sequence;
pub mod step_log;
pub mod stop;
pub mod weight_version;
pub mod weights;

pub use self::core::{EngineConfig, EngineCore};
pub use counters::{EngineCounters, EngineStats, Histogram, SeqUsage};
pub use error::EngineError;
pub use handle::{Engine, TokenStream};
pub use owned::OwnedSeq;
pub use penalties::Penalties;
pub use rng::SeqRng;
pub use sampling::{BoostedStart, SampledToken, Sampling};
pub use sampling_error::SamplingError;
pub use sequence::Generation;
pub use stop::{GenParams, StopReason};
pub use weight_version::WeightVersion;
