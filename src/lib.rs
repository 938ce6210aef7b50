//! # treegrpo
//!
//! Tree-GRPO rollouts for LLM agents on an inference engine whose KV cache keeps each
//! tree's shared prefix as pinned blocks and forks decoding at step boundaries, so no
//! prefix token is computed twice.
//!
//! The source tree reads in pipeline order, each layer importing only the ones below it:
//!
//! 1. [`model`] — config, GGUF / safetensors weights, tokenizer, chat template, decoder forward.
//! 2. [`kv`] — the paged KV block pool: block tables, forks, pins, the prefix index.
//! 3. [`engine`] — the scheduler (ragged batches over the KV cache), sampling, the
//!    async engine handle.
//! 4. [`env`](mod@env) — agent environments: step protocol, tools, rewards, data sets.
//! 5. [`rollout`] — agent episodes (and trees of them) through engine and environment.
//! 6. [`advantage`] — group-relative advantages over finished forests (pure math, no
//!    imports of its own; the rollout layer calls it).
//! 7. [`train`] — the update: a differentiable decoder with tree attention, verl's
//!    policy loss, optimisers.
//! 8. [`view`] — presentation: a forest drawn as one self-contained HTML page.
//! 9. [`closed_loop`] — `treegrpo sft` and `treegrpo train`: the warm-start, then
//!    rollouts → advantages → update → weight swap, step after step.
//! 10. [`bench`](mod@bench) — `treegrpo bench`: every rollout mode (and the mistral.rs peer with the
//!     `mistralrs` feature) on the same prompts and seed, and decode and prefill speed
//!     (beside llama.cpp's with the `llamacpp` feature), measured.
//!
//! See `ARCHITECTURE.md` for the invariants and where to change what.
//!
//! ## Example
//!
//! (2, 2, 1) Tree-GRPO rollouts of four calculator questions on the default model
//! (fetched on first use), written as `trajectories.jsonl`, `forest.jsonl` and
//! `summary.json` with each leaf's advantage — what `treegrpo rollout --task calc
//! --prompts 4 --out runs/r` does. The options go through the one checked constructor
//! every way in uses ([`rollout::TreeOptions::config`]). `examples/` has more: an
//! embedded engine forking a session, a custom environment, an update.
//!
//! ```no_run
//! use std::sync::Arc;
//! use treegrpo::engine::{Engine, EngineConfig};
//! use treegrpo::env::{Task, TaskData};
//! use treegrpo::model::{fetch, LoadedModel};
//! use treegrpo::rollout::{run_rollout, Output, RolloutRequest, RunHooks, RunOptions, TreeOptions};
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let path = fetch::ensure_default_model(&mut |msg| eprintln!("{msg}"))?;
//! let engine = Engine::start(Arc::new(LoadedModel::load(&path)?), EngineConfig::default())?;
//! // The calculator task with one tool turn, and its first four training questions.
//! let (env, samples) = Task::Calc.setup(&TaskData::Embedded, 1, 4)?;
//! let config = TreeOptions { max_step_tokens: 64, ..TreeOptions::default() }.config()?;
//! let request = RolloutRequest {
//!     env,
//!     samples,
//!     options: RunOptions::new(config.default_advantage()),
//!     config,
//! };
//! let hooks = RunHooks { output: Some(Output::create("runs/r".as_ref())?), ..RunHooks::default() };
//! let result = tokio::runtime::Runtime::new()?.block_on(run_rollout(engine, request, hooks))?;
//! let tokens = &result.summary.tokens;
//! println!("{} rollouts: {} tokens computed, {} reused", result.summary.rollouts, tokens.computed, tokens.reused);
//! # Ok(())
//! # }
//! ```

// Every public item says what it is for: the library is embedded (Rust, Python, the
// server), and its reference is `cargo doc`.
#![warn(missing_docs)]

pub mod advantage;
pub mod bench;
pub mod closed_loop;
pub mod compare;
mod durable;
pub mod engine;
pub mod env;
mod error_chain;
pub mod kv;
pub mod model;
/// Peer engines (mistral.rs, llama.cpp) running the same workloads, for comparison
/// (features `mistralrs`, `llamacpp`).
#[cfg(any(feature = "mistralrs", feature = "llamacpp"))]
pub mod peer;
pub mod random;
pub mod rollout;
#[cfg(feature = "serve")]
pub mod serve;
pub mod train;
pub mod view;

pub use error_chain::error_chain;
