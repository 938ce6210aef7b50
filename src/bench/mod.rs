//! `treegrpo bench`: what tree rollouts save, measured. The same prompts and seed run
//! through every mode one after another in one process, each on a fresh engine (so no
//! mode inherits another's prefix cache), and every figure comes from the engine's
//! counters and the wall clock.
//!
//! - [`modes`]: the modes (chain G=4, trees at the paper's budgets, the reference
//!   selection, and prefix recomputation) and running one.
//! - [`decode`]: aggregate decode tokens/s of our engine (and a peer's) at a given
//!   batch size.
//! - [`prefill`]: prefill tokens/s of one prompt into an empty cache (ours and
//!   llama.cpp's).
//! - [`report`]: the markdown table and the JSON document.
//! - [`plan`]: which rows a run measures (`--only`), in their order.
//!
//! This layer sits above `rollout` (and the `peer` module when the `mistralrs` or
//! `llamacpp` feature is on); nothing imports it but the CLI.

pub mod decode;
pub mod modes;
pub mod plan;
pub mod prefill;
pub mod report;

#[cfg(feature = "llamacpp")]
pub use decode::llamacpp_decode_tokens_per_second;
#[cfg(feature = "mistralrs")]
pub use decode::peer_decode_tokens_per_second;
pub use decode::{decode_prompt, engine_decode_tokens_per_second, DecodeSpeed};
#[cfg(feature = "mistralrs")]
pub use modes::run_mistralrs_chain;
pub use modes::{default_modes, run_mode, BenchMode, BenchRun, BenchSettings, ModeKind};
pub use plan::{bench_rows, BenchRow};
#[cfg(feature = "llamacpp")]
pub use prefill::llamacpp_prefill_tokens_per_second;
pub use prefill::{engine_prefill_tokens_per_second, prefill_prompt, PrefillSpeed};
pub use report::{machine_info, markdown, BenchReport, MachineInfo};
