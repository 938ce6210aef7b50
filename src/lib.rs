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

pub mod advantage;
pub mod bench;
pub mod closed_loop;
pub mod engine;
pub mod env;
pub mod kv;
pub mod model;
/// Peer engines (mistral.rs, llama.cpp) running the same workloads, for comparison
/// (features `mistralrs`, `llamacpp`).
#[cfg(any(feature = "mistralrs", feature = "llamacpp"))]
pub mod peer;
pub mod rollout;
#[cfg(feature = "serve")]
pub mod serve;
pub mod train;
pub mod view;
