//! What a tree search is asked to do: its shape ([`TreeShape`]: M, N, L, K and the
//! node selection) and how it samples ([`TreeConfig`]). The bench's modes and the
//! rollout share the shape, so a mode is a shape and nothing is copied field by field.

use serde::{Deserialize, Serialize};

use super::branch_sampling::{BranchSampling, BranchSamplingError};
use super::select::Selection;
use crate::engine::{Sampling, SamplingError};

/// A search that cannot run as asked: refused before anything is computed, with the
/// same words whichever way it came in (CLI, server, Python, Ray).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum TreeConfigError {
    /// `trees` (M) is 0 and no chains were asked for.
    #[error("trees must be at least 1 (or chains, for the GRPO baseline)")]
    NoTrees,
    /// `chains` (G) is 0.
    #[error("chains must be at least 1")]
    NoChains,
    /// `keep` (K) is 0: a tree must keep at least one leaf (leave it unset to keep
    /// every leaf).
    #[error("keep must be at least 1 (or absent: every leaf)")]
    KeepZero,
    /// `max_step_tokens` is 0: a step must be allowed at least one token.
    #[error("max_step_tokens must be at least 1")]
    NoStepTokens,
    /// The sampling settings (temperature, ...) are refused by the engine's rule;
    /// shown as that error itself.
    #[error(transparent)]
    Sampling(#[from] SamplingError),
    /// The branch sampling spec is refused (see [`BranchSampling`]).
    #[error(transparent)]
    BranchSampling(#[from] BranchSamplingError),
    /// A request larger than the bound its way in sets (the server's limits on
    /// what one request may grow; see [`RolloutLimits`]).
    #[error("{field}: {got} is more than the {limit} one request may ask for{hint}")]
    Limit {
        /// The field at fault.
        field: &'static str,
        /// What the request asked for (leaves: over every prompt).
        got: u64,
        /// The bound.
        limit: u64,
        /// Where the bound is set, if it can be (" (--max-rollout-leaves)").
        hint: &'static str,
    },
    /// Branch sampling was asked for a search that grows no branches (chains).
    #[error("branch_sampling needs branches: it applies to trees with rounds and expand of at least 1, not chains")]
    BranchSamplingWithoutBranches,
}

impl TreeConfigError {
    /// The option at fault, by its request-field name.
    pub fn field(&self) -> &'static str {
        match self {
            TreeConfigError::NoTrees => "trees",
            TreeConfigError::NoChains => "chains",
            TreeConfigError::KeepZero => "keep",
            TreeConfigError::NoStepTokens => "max_step_tokens",
            TreeConfigError::Limit { field, .. } => field,
            TreeConfigError::Sampling(e) => e.field(),
            TreeConfigError::BranchSampling(_) | TreeConfigError::BranchSamplingWithoutBranches => {
                "branch_sampling"
            }
        }
    }
}

/// The shape of a search: M trees per prompt, N branches per tree per round, L
/// rounds, K leaves kept, and how expansion nodes are chosen.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct TreeShape {
    /// M: trees per prompt.
    pub trees: usize,
    /// N: branches grown per tree per round.
    pub expand: usize,
    /// L: expansion rounds.
    pub rounds: usize,
    /// K: leaves kept per tree at random (all when `None`).
    pub keep: Option<usize>,
    /// How the nodes to branch from are chosen in each round.
    pub selection: Selection,
}

impl TreeShape {
    /// G independent chains per prompt: the GRPO baseline.
    pub fn chains(g: usize) -> Self {
        TreeShape {
            trees: g,
            expand: 0,
            rounds: 0,
            keep: None,
            selection: Selection::Paper,
        }
    }

    /// (M, N, L) trees keeping every leaf.
    pub fn tree(m: usize, n: usize, l: usize, selection: Selection) -> Self {
        TreeShape {
            trees: m,
            expand: n,
            rounds: l,
            keep: None,
            selection,
        }
    }

    /// Whether the search grows no branches (G chains): the GRPO baseline.
    pub fn is_chains(&self) -> bool {
        self.rounds == 0 || self.expand == 0
    }

    /// The most leaves one prompt's search may grow: M chains, or M trees of one root
    /// chain and N branches per round for L rounds (`None`: past `u64`).
    pub fn max_leaves(&self) -> Option<u64> {
        let trees = self.trees as u64;
        if self.is_chains() {
            return Some(trees);
        }
        let branches = (self.expand as u64).checked_mul(self.rounds as u64)?;
        trees.checked_mul(branches.checked_add(1)?)
    }
}

/// What one request may grow, for a way in that takes requests from others (the
/// server): checked by [`RolloutLimits::check`] before anything is allocated, each
/// broken bound a [`TreeConfigError::Limit`] naming its field.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RolloutLimits {
    /// Most leaves over every prompt of the request (prompts × leaves per prompt).
    pub max_leaves: u64,
    /// Most tokens per step (the context window bounds it anyway).
    pub max_step_tokens: usize,
    /// Most tool turns.
    pub max_turns: usize,
}

impl RolloutLimits {
    /// Checks a search of `config` over `prompts` prompts with `turns` tool turns.
    pub fn check(
        &self,
        config: &TreeConfig,
        prompts: usize,
        turns: usize,
    ) -> Result<(), TreeConfigError> {
        let limit = |field, got: u64, limit: u64, hint| TreeConfigError::Limit {
            field,
            got,
            limit,
            hint,
        };
        let field = if config.is_chains() {
            "chains"
        } else {
            "trees"
        };
        let leaves = config
            .shape
            .max_leaves()
            .and_then(|l| l.checked_mul(prompts as u64))
            .unwrap_or(u64::MAX);
        if leaves > self.max_leaves {
            return Err(limit(
                field,
                leaves,
                self.max_leaves,
                " (leaves over every prompt; --max-rollout-leaves)",
            ));
        }
        if config.max_step_tokens > self.max_step_tokens {
            let got = config.max_step_tokens as u64;
            return Err(limit(
                "max_step_tokens",
                got,
                self.max_step_tokens as u64,
                " (the context window)",
            ));
        }
        if turns > self.max_turns {
            return Err(limit("turns", turns as u64, self.max_turns as u64, ""));
        }
        Ok(())
    }
}

/// A search as every way in spells it, before it is checked: the CLI's flags, the
/// server's `/v1/rollouts` body and Python's keyword arguments fill this and call
/// [`TreeOptions::config`], so one value gets one answer, in the same words,
/// whichever way it came in. `chains`, when set, asks for G independent chains
/// instead of trees (the GRPO baseline).
#[derive(Debug, Clone, PartialEq)]
pub struct TreeOptions {
    /// M: trees per prompt (at least 1 unless `chains` is set).
    pub trees: usize,
    /// N: branches grown per tree per round.
    pub expand: usize,
    /// L: expansion rounds (0: the trees stay single chains).
    pub rounds: usize,
    /// K: leaves kept per tree at random (`None`: every leaf; 0 is refused).
    pub keep: Option<usize>,
    /// G: independent chains per prompt instead of trees (overrides the tree
    /// options; 0 is refused).
    pub chains: Option<usize>,
    /// How the nodes to branch from are chosen in each round.
    pub selection: Selection,
    /// Sampling temperature of every step: finite and at least 0 (0: greedy; 1.0
    /// samples the model's own distribution).
    pub temperature: f32,
    /// Most tokens one step may generate before it is cut (at least 1).
    pub max_step_tokens: usize,
    /// The run's seed: every branch's sampling and every random choice (expansion
    /// nodes, kept leaves) derives from it and the prompt, tree and branch indices,
    /// so the same seed and inputs grow the same trees.
    pub seed: u64,
    /// How a branch's first tokens are drawn, as a [`BranchSampling`] spec (`t2`,
    /// `treerl`, …); `None`: as every other token.
    pub branch_sampling: Option<String>,
}

impl Default for TreeOptions {
    /// The reference scripts' (2, 2, 1) trees at temperature 1, 256-token steps.
    fn default() -> Self {
        TreeOptions {
            trees: 2,
            expand: 2,
            rounds: 1,
            keep: None,
            chains: None,
            selection: Selection::Paper,
            temperature: 1.0,
            max_step_tokens: 256,
            seed: 0,
            branch_sampling: None,
        }
    }
}

impl TreeOptions {
    /// The checked search: a sampling [`Sampling::new`] accepts, then
    /// [`TreeConfig::validate`]. Nothing is coerced.
    pub fn config(&self) -> Result<TreeConfig, TreeConfigError> {
        if self.chains == Some(0) {
            return Err(TreeConfigError::NoChains);
        }
        let sampling = Sampling::new(self.temperature, None, None, None)?;
        let shape = TreeShape {
            trees: self.trees,
            expand: self.expand,
            rounds: self.rounds,
            keep: self.keep,
            selection: self.selection,
        };
        let mut config = TreeConfig::chains_or_tree(self.chains, shape, sampling, self.seed);
        config.max_step_tokens = self.max_step_tokens;
        config.branch_sampling = self
            .branch_sampling
            .as_deref()
            .map(str::parse)
            .transpose()?;
        config.validate()?;
        Ok(config)
    }
}

/// Shape of the search and how to sample. Serialised flat (the shape's fields beside
/// the sampling ones), as `summary.json` has always had it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TreeConfig {
    /// M, N, L, K and the node selection.
    #[serde(flatten)]
    pub shape: TreeShape,
    /// How each step's tokens are sampled (greedy, or a temperature with optional
    /// top-k / top-p / min-p cuts).
    pub sampling: Sampling,
    /// Most tokens one step may generate before it is cut (at least 1).
    pub max_step_tokens: usize,
    /// The run's seed: every branch's sampling and every random choice (expansion
    /// nodes, kept leaves) derives from it and the prompt, tree and branch indices,
    /// so the same seed and inputs grow the same trees.
    pub seed: u64,
    /// Fork branches from cached prefixes (on) or re-send every prefix (off).
    pub prefix_reuse: bool,
    /// How a branch's first tokens are drawn (`None`: as every other token). Root
    /// chains never see it. Absent in files written before it existed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub branch_sampling: Option<BranchSampling>,
}

impl TreeConfig {
    /// A search of `shape` with 256-token steps, reusing prefixes.
    pub fn new(shape: TreeShape, sampling: Sampling, seed: u64) -> Self {
        TreeConfig {
            shape,
            sampling,
            max_step_tokens: 256,
            seed,
            prefix_reuse: true,
            branch_sampling: None,
        }
    }

    /// G independent chains per prompt: the GRPO baseline.
    pub fn chains(g: usize, sampling: Sampling, seed: u64) -> Self {
        Self::new(TreeShape::chains(g), sampling, seed)
    }

    /// G chains when `chains` says so, else the trees of `tree` (how the CLI's and
    /// the server's options read: `--chains G` overrides the tree flags).
    pub fn chains_or_tree(
        chains: Option<usize>,
        tree: TreeShape,
        sampling: Sampling,
        seed: u64,
    ) -> Self {
        match chains {
            Some(g) => Self::chains(g, sampling, seed),
            None => Self::new(tree, sampling, seed),
        }
    }

    /// Whether the search grows no branches (G chains): the GRPO baseline.
    pub fn is_chains(&self) -> bool {
        self.shape.is_chains()
    }

    /// Checks what a run needs: at least one tree (or chain), `keep` of at least one
    /// leaf, steps of at least one token, a sampling the engine's constructor would
    /// give. `run_rollout` calls it first, so every way in gets the same answer.
    pub fn validate(&self) -> Result<(), TreeConfigError> {
        if self.shape.trees == 0 {
            return Err(TreeConfigError::NoTrees);
        }
        if self.shape.keep == Some(0) {
            return Err(TreeConfigError::KeepZero);
        }
        if self.max_step_tokens == 0 {
            return Err(TreeConfigError::NoStepTokens);
        }
        self.sampling.validate()?;
        if self.branch_sampling.is_some() && self.is_chains() {
            return Err(TreeConfigError::BranchSamplingWithoutBranches);
        }
        Ok(())
    }

    /// The advantage a run of this shape uses unless told otherwise: group-relative
    /// over each prompt's chains (`grpo`), or Tree-GRPO's intra + inter-tree (`tree`).
    pub fn default_advantage(&self) -> crate::advantage::AdvantageMode {
        if self.is_chains() {
            crate::advantage::AdvantageMode::Grpo
        } else {
            crate::advantage::AdvantageMode::Tree
        }
    }
}
