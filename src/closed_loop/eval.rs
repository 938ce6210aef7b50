//! Evaluation: the policy the engine serves, greedy, one chain per held-out prompt;
//! the figure is the mean reward.

use std::sync::Arc;
use std::time::Instant;

use super::error::LoopError;
use crate::advantage::AdvantageMode;
use crate::engine::{Engine, Sampling};
use crate::env::{Environment, QaSample};
use crate::rollout::{run_rollout, RolloutRequest, RunHooks, RunOptions, TreeConfig};

/// A finished evaluation.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Evaluation {
    /// Mean over the prompts of the reward their greedy answer earned, in the
    /// environment's reward units.
    pub mean_reward: f64,
    /// Number of held-out prompts evaluated, one greedy chain each.
    pub prompts: usize,
    /// Wall-clock seconds the evaluation took.
    pub seconds: f64,
}

/// Greedy mean reward of `samples` in `env`, `max_step_tokens` a step.
pub async fn evaluate(
    engine: &Engine,
    env: &Arc<dyn Environment>,
    samples: &[QaSample],
    max_step_tokens: usize,
) -> Result<Evaluation, LoopError> {
    let t0 = Instant::now();
    let mut tree = TreeConfig::chains(1, Sampling::Greedy, 0);
    tree.max_step_tokens = max_step_tokens;
    let request = RolloutRequest {
        env: env.clone(),
        samples: samples.to_vec(),
        config: tree,
        options: RunOptions::new(AdvantageMode::Grpo),
    };
    let result = run_rollout(engine.clone(), request, RunHooks::default()).await?;
    Ok(Evaluation {
        mean_reward: result.summary.mean_reward,
        prompts: samples.len(),
        seconds: t0.elapsed().as_secs_f64(),
    })
}
