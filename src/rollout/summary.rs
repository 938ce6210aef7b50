//! `summary.json`: what a run computed and kept, in total and per prompt's forest.
//!
//! Every token the engine computed is attributed to exactly one forest or to the
//! run's shared prefix, so the forests' figures plus the shared prefix's are the run's.

use serde::Serialize;

use crate::advantage::AdvantageMode;
use crate::engine::WeightVersion;
use crate::model::Precision;

use super::config::TreeConfig;
use super::cost::ForestCost;
use super::forest::FailedBranch;

/// Token figures of a run or of one forest.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct TokenSummary {
    /// Prompt tokens computed (each prompt once with prefix reuse).
    pub prompt_prefilled: u64,
    /// Observation tokens computed.
    pub observation_prefilled: u64,
    /// Sampled tokens fed back through the model.
    pub decoded: u64,
    /// Tokens needed but not computed (forks and the prefix cache).
    pub reused: u64,
    /// Of `reused`: prompt tokens found in the prefix cache (prompts sharing a
    /// system prompt prefill it once).
    pub reused_prefix_cache: u64,
    /// Tokens computed again because a prefix was re-sent (`prefix_reuse` off).
    pub recomputed: u64,
    /// Tokens computed again because their KV was dropped under memory pressure
    /// (preemption); the trajectories are the same as without it.
    pub recomputed_preempted: u64,
    /// Times a sequence's KV was dropped under memory pressure.
    pub preemptions: u64,
    /// Everything the model computed.
    pub computed: u64,
}

impl TokenSummary {
    /// The figures of a forest (or of the run's shared prefix) from its cost.
    pub fn from_cost(c: &ForestCost) -> Self {
        let u = &c.usage;
        TokenSummary {
            prompt_prefilled: u
                .prefilled
                .saturating_sub(c.observation_tokens + c.recomputed),
            observation_prefilled: c.observation_tokens,
            decoded: u.decoded,
            reused: u.reused(),
            reused_prefix_cache: u.reused_prefix_cache,
            recomputed: c.recomputed,
            recomputed_preempted: u.recomputed_preempted,
            preemptions: u.preemptions,
            computed: u.computed(),
        }
    }

    /// Adds `other` into `self`.
    pub fn add(&mut self, other: &TokenSummary) {
        self.prompt_prefilled += other.prompt_prefilled;
        self.observation_prefilled += other.observation_prefilled;
        self.decoded += other.decoded;
        self.reused += other.reused;
        self.reused_prefix_cache += other.reused_prefix_cache;
        self.recomputed += other.recomputed;
        self.recomputed_preempted += other.recomputed_preempted;
        self.preemptions += other.preemptions;
        self.computed += other.computed;
    }
}

/// One prompt's forest in `summary.json`.
#[derive(Debug, Clone, Serialize)]
pub struct ForestSummary {
    pub prompt_index: usize,
    pub prompt_uid: String,
    pub trees: usize,
    pub rollouts: usize,
    pub mean_reward: f64,
    pub tokens: TokenSummary,
    pub tool_calls: u64,
    /// Branches not started because the token budget was spent.
    pub skipped_branches: u64,
    /// Branches that could not fit the KV pool or the context window.
    pub failed_branches: Vec<FailedBranch>,
    pub wall_seconds: f64,
}

/// `summary.json`.
#[derive(Debug, Clone, Serialize)]
pub struct RunSummary {
    /// Prompts asked for.
    pub prompts: usize,
    /// Prompts whose forest finished (fewer after an interrupt).
    pub prompts_finished: usize,
    pub rollouts: usize,
    pub mean_reward: f64,
    /// Totals: the forests' figures plus the run's shared prefix.
    pub tokens: TokenSummary,
    pub tokens_computed_per_rollout: f64,
    /// Tokens the model computed (prefilled + decoded) per second of wall time: the
    /// rollout's own throughput, tool waits and scheduling included.
    pub computed_tokens_per_second: f64,
    pub tool_calls: u64,
    /// Branches that failed (each listed in its forest's `failed_branches`).
    pub failed_branches: usize,
    pub wall_seconds: f64,
    pub peak_kv_bytes: u64,
    /// The KV pool's size in bytes.
    pub kv_pool_bytes: u64,
    /// The version of the weights the engine served when the run started (0: those
    /// it started with); every token was sampled under it unless weights were
    /// swapped during the run.
    pub weight_version: WeightVersion,
    /// `exact` or `fast` (`--precision`): the arithmetic the served weights computed
    /// the logprobs with when the run started.
    pub precision: Precision,
    pub config: TreeConfig,
    pub advantage: AdvantageMode,
    pub token_budget: Option<u64>,
    /// The token budget stopped some branches from starting.
    pub budget_exhausted: bool,
    /// The run was interrupted (SIGINT): only finished forests are in the output.
    pub interrupted: bool,
    /// Tokens of the prefix all prompts share (the system prompt), computed once for
    /// the run before any forest starts, so every prompt finds it in the prefix cache
    /// and the token counts do not depend on which prompt starts first.
    pub shared_prefix: TokenSummary,
    pub forests: Vec<ForestSummary>,
}
