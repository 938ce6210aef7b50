//! The rollout layer: agent trajectories and trees of them, driven through the engine
//! and an environment, scored and exported.
//!
//! - [`trajectory`]: one finished trajectory in the trainer's shape (token ids, loss
//!   mask, logprobs, reward).
//! - [`episode`]: runs one agent episode step by step.
//! - [`demo`]: an episode played by the environment's oracle (SFT demonstrations).
//! - [`forest`]: trees of agent steps as plain data, and a prompt's finished forest.
//! - [`select`]: which nodes grow branches (`paper` / `reference`).
//! - [`config`]: the search's shape ([`TreeShape`]: M, N, L, K, selection) and
//!   sampling settings ([`TreeConfig`]); the bench's modes are shapes too.
//! - [`cost`]: what a prompt's forest cost the engine ([`ForestCost`]).
//! - `context`: what every task of a run shares (engine, environment, budget, live
//!   sequences).
//! - `branch`: one branch of a tree through the shared agent loop.
//! - [`branching`]: where a step's branches fork and how far apart they end
//!   ([`BranchingStats`]).
//! - [`sampler`]: the tree sampler (M trees, N branches, L rounds, K kept) and the
//!   chain baseline, with fork-based prefix reuse or reference-style recomputation.
//! - [`export`]: advantages and per-leaf records from finished trees.
//! - [`run`]: a whole run over many prompts: progress, ordered output, per-forest
//!   accounting, token budget, interruption, summary.
//! - `in_order`: finished prompts written in prompt order as they come.
//! - [`summary`]: `summary.json`'s types ([`RunSummary`], per forest, token figures).
//! - [`output`]: the run's files written as prompts finish, and `forest.jsonl` read back.

mod branch;
pub mod branch_sampling;
pub mod branching;
pub mod config;
mod context;
pub mod cost;
pub mod demo;
pub mod episode;
pub mod error;
pub mod export;
pub mod forest;
mod in_order;
pub mod output;
pub mod run;
pub mod sampler;
pub mod select;
pub mod summary;
pub mod trajectory;

pub use branch_sampling::{BranchSampling, BranchSamplingError, BranchSpan};
pub use branching::BranchingStats;
pub use config::{RolloutLimits, TreeConfig, TreeConfigError, TreeOptions, TreeShape};
pub use cost::ForestCost;
pub use demo::{demonstrate, demonstrations};
pub use episode::{run_episode, EpisodeParams};
pub use error::{LineJsonError, RolloutError};
pub use forest::{FailedBranch, Node, NodeId, Tree};
pub use output::{parse_forest, read_forest, Output};
pub use run::{
    run_rollout, Interrupt, Progress, ProgressFn, RolloutRequest, RolloutResult, RunHooks,
    RunOptions,
};
pub use select::Selection;
pub use summary::{ForestSummary, RunSummary, TokenSummary};
pub use trajectory::Trajectory;
