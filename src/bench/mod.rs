//! `treegrpo bench`: what tree rollouts save, measured. The same prompts and seed run
//! through every mode one after another in one process, each on a fresh engine (so no
//! mode inherits another's prefix cache), and every figure comes from the engine's
//! counters and the wall clock.
//!
//! - [`modes`]: the modes (chain G=4, trees at the paper's budgets, the reference
//!   selection, and prefix recomputation) and running one.
//! - [`decode`]: aggregate decode tokens/s of our engine (and the peer's) at a given
//!   batch size.
//! - [`report`]: the markdown table and the JSON document.
//!
//! This layer sits above `rollout` (and the `peer` module when the `mistralrs` feature
//! is on); nothing imports it but the CLI.

pub mod decode;
pub mod modes;
pub mod report;

#[cfg(feature = "mistralrs")]
pub use decode::peer_decode_tokens_per_second;
pub use decode::{decode_prompt, engine_decode_tokens_per_second, DecodeSpeed};
#[cfg(feature = "mistralrs")]
pub use modes::run_mistralrs_chain;
pub use modes::{default_modes, run_mode, BenchMode, BenchRun, BenchSettings, ModeKind};
pub use report::{machine_info, markdown, BenchReport, MachineInfo};
