//! [`LoopConfig`]: how a training run runs — its steps, each step's prompts and search,
//! the advantage, the update, evaluations, checkpoints, the served weights' format and
//! the KL reference. A leaf of the layer: the loop (`run.rs`) and the run record
//! (`record.rs`) both read it.

use super::samples::BoostedTokens;
use crate::advantage::AdvantageMode;
use crate::model::kernels::WeightFormat;
use crate::rollout::{TreeConfig, TreeOptions};
use crate::train::{KlReference, UpdateConfig};

/// How the loop runs. Serialised as the settings every way in resolved (`treegrpo
/// train --print-config`, Python's `Trainer.config`), so their defaults can be
/// compared with [`LoopConfig::default`].
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
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
    #[serde(serialize_with = "format_name")]
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

impl LoopConfig {
    /// A run of `tree`'s search with `update`, every other setting at its default
    /// ([`LoopConfig::default`]): the advantage the search implies (step-level for
    /// trees, group-relative for chains), and the update scoring under the search's
    /// sampling temperature — the one place that temperature is copied, so the
    /// trainer's logprobs are the rollout's.
    pub fn new(tree: TreeConfig, update: UpdateConfig) -> Self {
        let update = UpdateConfig {
            temperature: tree.sampling.logprob_temperature(),
            ..update
        };
        LoopConfig {
            advantage: tree.default_advantage(),
            tree,
            update,
            ..Self::default()
        }
    }

    /// Refuses a run that cannot train, in the library's words (each way in names
    /// the field its own way: [`LoopConfigError::field`]).
    pub fn check(&self) -> Result<(), LoopConfigError> {
        if self.prompts_per_step == 0 {
            return Err(LoopConfigError::NoPromptsPerStep);
        }
        Ok(())
    }
}

impl Default for LoopConfig {
    /// The defaults of every way in (`treegrpo train` without flags, Python's
    /// `Trainer` without keywords): four steps of eight prompts on the reference
    /// scripts' (2, 2, 1) trees ([`TreeOptions::default`]), the default update,
    /// evaluations before and after on 20 test prompts, a checkpoint every step,
    /// f32 served weights, the KL against the previous policy.
    fn default() -> Self {
        let tree = TreeOptions::default()
            .config()
            .expect("the default search is valid");
        LoopConfig {
            steps: 4,
            prompts_per_step: 8,
            advantage: tree.default_advantage(),
            update: UpdateConfig {
                temperature: tree.sampling.logprob_temperature(),
                ..UpdateConfig::default()
            },
            tree,
            concurrent_prompts: 16,
            eval_every: 0,
            eval_prompts: 20,
            checkpoint_every: 1,
            serve_format: WeightFormat::F32,
            kl_reference: KlReference::Previous,
            step_budget: None,
            eval_every_tokens: 0,
            eval_before: true,
            boosted_tokens: BoostedTokens::Corrected,
        }
    }
}

/// A served format by the name every way in spells it (`f32`, `bf16`; see
/// [`served_format`](crate::train::serving::served_format)).
fn format_name<S: serde::Serializer>(format: &WeightFormat, s: S) -> Result<S::Ok, S::Error> {
    s.collect_str(&format_args!("{format:?}").to_string().to_lowercase())
}

/// A training run that cannot train, named by its field.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum LoopConfigError {
    /// No prompts per step.
    #[error("prompts_per_step must be at least 1")]
    NoPromptsPerStep,
}

impl LoopConfigError {
    /// The setting at fault (the field's name; the CLI spells it as a flag).
    pub fn field(&self) -> &'static str {
        match self {
            LoopConfigError::NoPromptsPerStep => "prompts_per_step",
        }
    }
}
