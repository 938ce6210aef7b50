//! `summary.json`: what a run computed and kept, in total and per prompt's forest.
//!
//! Every token the engine computed is attributed to exactly one forest or to the
//! run's shared prefix, so the forests' figures plus the shared prefix's are the run's.

use serde::Serialize;

use crate::advantage::AdvantageMode;
use crate::engine::WeightVersion;
use crate::model::Precision;

use super::branching::BranchingStats;
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
    /// The prompt's index in the run (offset by
    /// [`RunOptions::prompt_offset`](super::RunOptions::prompt_offset)).
    pub prompt_index: usize,
    /// The sample's id.
    pub prompt_uid: String,
    /// Trees grown for the prompt.
    pub trees: usize,
    /// Trajectories (kept leaves) it gave.
    pub rollouts: usize,
    /// Mean reward of those trajectories (0 when there are none).
    pub mean_reward: f64,
    /// The forest's token counts.
    pub tokens: TokenSummary,
    /// Tool calls its episodes made.
    pub tool_calls: u64,
    /// Branches not started because the token budget was spent.
    pub skipped_branches: u64,
    /// Branches that could not fit the KV pool or the context window.
    pub failed_branches: Vec<FailedBranch>,
    /// Wall-clock seconds the prompt's search took.
    pub wall_seconds: f64,
}

/// `summary.json`.
#[derive(Debug, Clone, Serialize)]
pub struct RunSummary {
    /// Prompts asked for.
    pub prompts: usize,
    /// Prompts whose forest finished (fewer after an interrupt).
    pub prompts_finished: usize,
    /// Trajectories (kept leaves) over all prompts.
    pub rollouts: usize,
    /// Mean reward of every trajectory (0 when there are none).
    pub mean_reward: f64,
    /// Totals: the forests' figures plus the run's shared prefix.
    pub tokens: TokenSummary,
    /// `tokens.computed / rollouts`: what one trajectory cost the model (0 when
    /// there are none); prefix reuse is what lowers it.
    pub tokens_computed_per_rollout: f64,
    /// Tokens the model computed (prefilled + decoded) per second of wall time: the
    /// rollout's own throughput, tool waits and scheduling included.
    pub computed_tokens_per_second: f64,
    /// Tool calls over all prompts.
    pub tool_calls: u64,
    /// Branches that failed (each listed in its forest's `failed_branches`).
    pub failed_branches: usize,
    /// Wall-clock seconds of the whole run.
    pub wall_seconds: f64,
    /// Most bytes of KV blocks the engine had in use at once, as its counter read at
    /// the end of the run (a peak over the engine's life, so it may predate the run).
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
    /// The search the run was asked for.
    pub config: TreeConfig,
    /// The advantage mode of the trajectories' advantages.
    pub advantage: AdvantageMode,
    /// The run's token budget, if it had one (`--token-budget`).
    pub token_budget: Option<u64>,
    /// The token budget stopped some branches from starting.
    pub budget_exhausted: bool,
    /// The run was interrupted (SIGINT): only finished forests are in the output.
    pub interrupted: bool,
    /// Tokens of the prefix all prompts share (the system prompt), computed once for
    /// the run before any forest starts, so every prompt finds it in the prefix cache
    /// and the token counts do not depend on which prompt starts first.
    pub shared_prefix: TokenSummary,
    /// One per finished prompt, in prompt order.
    pub forests: Vec<ForestSummary>,
    /// Where the trees' branches fork and how far apart they end (absent for chains).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub branching: Option<BranchingStats>,
}
