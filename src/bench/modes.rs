//! The benchmark's modes and how one is run.

use std::sync::Arc;

use serde::Serialize;

use crate::engine::{Engine, EngineConfig, Sampling};
use crate::env::{Environment, QaSample};
use crate::model::LoadedModel;
use crate::rollout::{
    run_rollout, ProgressFn, RolloutError, RolloutRequest, RunHooks, RunOptions, RunSummary,
    Selection, TokenSummary, TreeConfig, TreeShape,
};

/// The shape of one mode's rollouts: the rollout's [`TreeShape`], serialised flat,
/// plus G for chain modes.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ModeConfig {
    /// The tree shape (M, N, L and the selection) every prompt's rollouts grow by.
    #[serde(flatten)]
    pub shape: TreeShape,
    /// G for chain modes (`None` for trees).
    pub chains: Option<usize>,
}

/// The kind of a benchmark row (serialised as `chain`, `tree`, `tree-recompute`,
/// `mistralrs-chain`: what `--only` takes besides labels).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum ModeKind {
    /// G independent chains per prompt (GRPO), the baseline.
    Chain,
    /// Tree-GRPO, branches forking cached prefixes.
    Tree,
    /// Tree-GRPO re-sending every branch's prefix, as the reference implementation.
    TreeRecompute,
    /// The peer engine's chains.
    MistralrsChain,
}

impl ModeKind {
    /// The name `--only` and the JSON use.
    pub fn name(self) -> &'static str {
        match self {
            ModeKind::Chain => "chain",
            ModeKind::Tree => "tree",
            ModeKind::TreeRecompute => "tree-recompute",
            ModeKind::MistralrsChain => "mistralrs-chain",
        }
    }
}

/// One row of the benchmark.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct BenchMode {
    /// Which kind of row this is (chain, tree, tree recomputing prefixes, peer chain).
    pub mode: ModeKind,
    /// A unique name (what `--only` takes): the mode with its shape, e.g.
    /// `tree-2-2-1` or `tree-2-2-1-reference`.
    pub label: String,
    /// The rollout shape this row runs.
    pub config: ModeConfig,
    /// Branches fork cached prefixes (off: every prefix is re-sent and recomputed).
    pub prefix_reuse: bool,
}

impl BenchMode {
    /// The GRPO baseline: `g` independent chains per prompt, labelled `chain-{g}`.
    pub fn chain(g: usize) -> Self {
        BenchMode {
            mode: ModeKind::Chain,
            label: format!("chain-{g}"),
            config: ModeConfig {
                shape: TreeShape::chains(g),
                chains: Some(g),
            },
            prefix_reuse: true,
        }
    }

    /// A Tree-GRPO row of shape (M, N, L) with branches forking cached prefixes, labelled
    /// `tree-{m}-{n}-{l}` (with `-reference` for [`Selection::Reference`]).
    pub fn tree(m: usize, n: usize, l: usize, select: Selection) -> Self {
        let sel = match select {
            Selection::Paper => "",
            Selection::Reference => "-reference",
            Selection::Entropy => "-entropy",
        };
        BenchMode {
            mode: ModeKind::Tree,
            label: format!("tree-{m}-{n}-{l}{sel}"),
            config: ModeConfig {
                shape: TreeShape::tree(m, n, l, select),
                chains: None,
            },
            prefix_reuse: true,
        }
    }

    /// (M,N,L) with every branch's prefix re-sent, as the reference implementation does.
    pub fn tree_recompute(m: usize, n: usize, l: usize) -> Self {
        let mut mode = Self::tree(m, n, l, Selection::Paper);
        mode.mode = ModeKind::TreeRecompute;
        mode.label = format!("tree-recompute-{m}-{n}-{l}");
        mode.prefix_reuse = false;
        mode
    }

    /// The rollout configuration this row runs with: its shape and prefix reuse, the
    /// shared sampling, step cap and seed from `settings`.
    pub fn tree_config(&self, settings: &BenchSettings) -> TreeConfig {
        TreeConfig {
            shape: self.config.shape,
            sampling: settings.sampling,
            max_step_tokens: settings.max_step_tokens,
            seed: settings.seed,
            prefix_reuse: self.prefix_reuse,
            branch_sampling: None,
        }
    }
}

/// The default modes, cheapest comparisons first: chain G=4 (the baseline every ratio
/// is against), (2,2,1) with both selections and recomputing prefixes, then trees at
/// the paper's budgets of about 2, 8 and 16 chains.
pub fn default_modes() -> Vec<BenchMode> {
    vec![
        BenchMode::chain(4),
        BenchMode::tree(2, 2, 1, Selection::Paper),
        BenchMode::tree(2, 2, 1, Selection::Reference),
        BenchMode::tree_recompute(2, 2, 1),
        BenchMode::tree(1, 2, 1, Selection::Paper),
        BenchMode::tree(2, 6, 1, Selection::Paper),
        BenchMode::tree(4, 5, 1, Selection::Paper),
    ]
}

/// What every mode shares.
#[derive(Debug, Clone, Serialize)]
pub struct BenchSettings {
    /// Prompts every mode rolls out (the same ones, in the same order).
    pub prompts: usize,
    /// Rollout seed, the same for every mode.
    pub seed: u64,
    /// How every mode samples its steps.
    pub sampling: Sampling,
    /// Most tokens one step (one assistant turn) may generate.
    pub max_step_tokens: usize,
    /// Bytes of KV cache each mode's fresh engine may hold.
    pub kv_budget_bytes: usize,
    /// Most prompts whose forests grow at once (0: all).
    pub max_concurrent_prompts: usize,
}

/// One mode's measured figures (a row of the table, an entry of `runs` in the JSON).
#[derive(Debug, Clone, Serialize)]
pub struct BenchRun {
    /// The kind of the row measured.
    pub mode: ModeKind,
    /// The row's unique label (see [`BenchMode::label`]).
    pub label: String,
    /// The rollout shape the row ran.
    pub config: ModeConfig,
    /// Finished rollouts (leaves) over all prompts.
    pub rollouts: usize,
    /// Where the row's tokens went: prefilled, decoded, reused and computed.
    pub tokens: TokenSummary,
    /// Tokens the model computed divided by `rollouts`: the cost of one rollout.
    pub tokens_computed_per_rollout: f64,
    /// Rollouts per 10,000 computed tokens (see [`per_10k`]); higher is cheaper.
    pub rollouts_per_10k_tokens: f64,
    /// `rollouts_per_10k_tokens` over the chain baseline's (filled in by the report).
    pub ratio_to_chain: Option<f64>,
    /// Wall-clock seconds of the whole rollout run.
    pub wall_seconds: f64,
    /// `rollouts` over `wall_seconds`.
    pub rollouts_per_second: f64,
    /// `rollouts_per_second` over the chain baseline's (filled in by the report).
    pub speed_ratio_to_chain: Option<f64>,
    /// `None` for the peer, which reports no KV figure.
    pub peak_kv_bytes: Option<u64>,
    /// Mean reward over the row's rollouts.
    pub mean_reward: f64,
    /// Tool calls the rollouts made.
    pub tool_calls: u64,
    /// How token counts were obtained (ours: the engine's counters; a peer may differ).
    pub token_source: String,
}

impl BenchRun {
    /// The figures of a finished rollout run.
    pub fn from_summary(mode: &BenchMode, s: &RunSummary) -> Self {
        let computed = s.tokens.computed;
        BenchRun {
            mode: mode.mode,
            label: mode.label.clone(),
            config: mode.config.clone(),
            rollouts: s.rollouts,
            tokens: s.tokens,
            tokens_computed_per_rollout: s.tokens_computed_per_rollout,
            rollouts_per_10k_tokens: per_10k(s.rollouts, computed),
            ratio_to_chain: None,
            wall_seconds: s.wall_seconds,
            rollouts_per_second: s.rollouts as f64 / s.wall_seconds.max(1e-9),
            speed_ratio_to_chain: None,
            peak_kv_bytes: Some(s.peak_kv_bytes),
            mean_reward: s.mean_reward,
            tool_calls: s.tool_calls,
            token_source: "engine counters".into(),
        }
    }
}

/// Rollouts per 10,000 computed tokens.
pub fn per_10k(rollouts: usize, computed: u64) -> f64 {
    if computed == 0 {
        0.0
    } else {
        rollouts as f64 * 10_000.0 / computed as f64
    }
}

/// Runs one mode on a fresh engine over `samples`.
pub async fn run_mode(
    model: &Arc<LoadedModel>,
    env: Arc<dyn Environment>,
    samples: &[QaSample],
    mode: &BenchMode,
    settings: &BenchSettings,
    progress: Option<ProgressFn>,
) -> Result<BenchRun, RolloutError> {
    let engine = Engine::start(
        model.clone(),
        EngineConfig {
            kv_budget_bytes: settings.kv_budget_bytes,
            prefix_cache: mode.prefix_reuse,
            ..EngineConfig::default()
        },
    )?;
    let config = mode.tree_config(settings);
    let advantage = config.default_advantage();
    let options = RunOptions {
        max_concurrent_prompts: settings.max_concurrent_prompts,
        ..RunOptions::new(advantage)
    };
    let request = RolloutRequest {
        env,
        samples: samples.to_vec(),
        config,
        options,
    };
    let hooks = RunHooks {
        progress,
        ..RunHooks::default()
    };
    let result = run_rollout(engine, request, hooks).await?;
    Ok(BenchRun::from_summary(mode, &result.summary))
}

impl BenchRun {
    /// A row measured on the peer engine (its token figures are needed, not computed).
    pub fn is_peer(&self) -> bool {
        self.mode == ModeKind::MistralrsChain
    }
}

/// The peer's chain workload (G chains per prompt on mistral.rs, same GGUF, prompts,
/// sampling, stop strings and tools) as a row of the table. Its token figures are our
/// tokenizer's counts of the texts — what the rollouts needed, not what mistral.rs
/// computed (its prefix cache decides that and does not report it): see
/// `token_source`.
#[cfg(feature = "mistralrs")]
pub async fn run_mistralrs_chain(
    model_path: &std::path::Path,
    model: &Arc<LoadedModel>,
    env: Arc<dyn Environment>,
    samples: &[QaSample],
    chains: usize,
    settings: &BenchSettings,
) -> Result<BenchRun, crate::peer::PeerError> {
    use crate::peer::{run_mistralrs_chains, ChainWorkload};
    let workload = ChainWorkload::new(
        chains,
        settings.sampling,
        settings.max_step_tokens,
        settings.seed,
    );
    let s =
        run_mistralrs_chains(model_path, model.clone(), env, samples.to_vec(), workload).await?;
    let needed = s.prompt_tokens + s.observation_tokens + s.generated_tokens;
    let mut mode = BenchMode::chain(chains);
    mode.mode = ModeKind::MistralrsChain;
    mode.label = format!("mistralrs-chain-{chains}");
    Ok(BenchRun {
        mode: mode.mode,
        label: mode.label,
        config: mode.config,
        rollouts: s.rollouts,
        tokens: TokenSummary {
            prompt_prefilled: s.prompt_tokens,
            observation_prefilled: s.observation_tokens,
            decoded: s.generated_tokens,
            reused: 0,
            reused_prefix_cache: 0,
            computed: needed,
            ..TokenSummary::default()
        },
        tokens_computed_per_rollout: needed as f64 / s.rollouts.max(1) as f64,
        rollouts_per_10k_tokens: per_10k(s.rollouts, needed),
        ratio_to_chain: None,
        wall_seconds: s.wall_seconds,
        rollouts_per_second: s.rollouts_per_second,
        speed_ratio_to_chain: None,
        peak_kv_bytes: None,
        mean_reward: s.mean_reward,
        tool_calls: s.tool_calls,
        token_source: format!(
            "our tokenizer's count of every rollout's prompt, observations and steps \
             (tokens needed, not computed: mistral.rs reports {} prompt tokens sent and \
             {} generated over {} requests, and its prefix cache decides what is computed)",
            s.peer_prompt_tokens, s.peer_completion_tokens, s.requests
        ),
    })
}
