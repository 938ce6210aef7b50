//! [`LoopConfig`]: how a training run runs — its steps, each step's prompts and search,
//! the advantage, the update, evaluations, checkpoints, the served weights' format and
//! the KL reference. A leaf of the layer: the loop (`run.rs`) and the run record
//! (`record.rs`) both read it.

use super::samples::BoostedTokens;
use crate::advantage::AdvantageMode;
use crate::model::kernels::WeightFormat;
use crate::rollout::TreeConfig;
use crate::train::{KlReference, UpdateConfig};

/// How the loop runs.
#[derive(Debug, Clone)]
pub struct LoopConfig {
    /// Steps to reach (a resumed run continues to the same number).
    pub steps: u64,
    /// Training prompts each step's rollouts run (taken in order from the training
    /// split, cycling); must be at least 1.
    pub prompts_per_step: usize,
    /// The search's shape and sampling; its seed is the run's (each step derives its own).
    pub tree: TreeConfig,
    /// How trajectories' advantages are computed from their rewards.
    pub advantage: AdvantageMode,
    /// Most prompts whose forests grow at once (0: all).
    pub concurrent_prompts: usize,
    /// The update (its temperature is taken from `tree.sampling`).
    pub update: UpdateConfig,
    /// Evaluate every this many steps (and after the last; 0: only before the first and
    /// after the last step).
    pub eval_every: u64,
    /// Test prompts each evaluation runs greedily (the first this many of the test
    /// split; 0: no evaluations).
    pub eval_prompts: usize,
    /// Checkpoint every this many steps (and after the last; 0: only after the last).
    pub checkpoint_every: u64,
    /// How the engine holds the trainer's weights after an update (f32, bf16, f16).
    pub serve_format: WeightFormat,
    /// The KL term's reference: the policy before each update, or the weights the run
    /// started from (kept frozen in `reference/` of the run folder, so a resumed run
    /// compares with the same weights).
    pub kl_reference: KlReference,
    /// Computed tokens each step's rollouts spend: trees are added to the step's
    /// prompts in waves until it is spent, and what a step overran or fell short by
    /// is carried to the next, so step `k` ends near `k ×` this many cumulative
    /// tokens (`None`: the configured trees, once).
    pub step_budget: Option<u64>,
    /// Also evaluate after each step that crosses a multiple of this many cumulative
    /// computed tokens (0: off).
    pub eval_every_tokens: u64,
    /// Evaluate before the first step (a comparison of runs from one start evaluates
    /// it once instead).
    pub eval_before: bool,
    /// What the update does with tokens drawn from the tree's branch sampling
    /// (importance-corrected, or masked out of the loss).
    pub boosted_tokens: BoostedTokens,
}
