//! Evaluation: the policy the engine serves, greedy, one chain per held-out prompt;
//! the figure is the mean reward, and each question's reward is kept so that two
//! runs evaluated on the same questions can be compared question by question.

use std::sync::Arc;
use std::time::Instant;

use super::error::LoopError;
use crate::advantage::AdvantageMode;
use crate::engine::{Engine, Sampling};
use crate::env::{Environment, QaSample};
use crate::rollout::{run_rollout, RolloutRequest, RunHooks, RunOptions, TreeConfig};

/// One held-out question's greedy reward.
#[derive(Debug, Clone, PartialEq)]
pub struct QuestionReward {
    /// The sample's id (its `prompt_uid`).
    pub id: String,
    /// The reward its greedy answer earned (0 when its chain failed: it did not fit
    /// the KV pool or the context window, so it gave no answer).
    pub reward: f64,
}

/// A finished evaluation.
#[derive(Debug, Clone, PartialEq)]
pub struct Evaluation {
    /// Mean over the prompts of the reward their greedy answer earned, in the
    /// environment's reward units (over the trajectories there are: a failed chain
    /// is left out here, and counts 0 in `per_question`).
    pub mean_reward: f64,
    /// Number of held-out prompts evaluated, one greedy chain each.
    pub prompts: usize,
    /// Wall-clock seconds the evaluation took.
    pub seconds: f64,
    /// Each question's reward, in the order evaluated (the samples' order): what a
    /// comparison pairs two runs' evaluations by.
    pub per_question: Vec<QuestionReward>,
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
    // Without an interrupt every prompt's forest finishes, in prompt order; a forest
    // of one greedy chain has that chain's reward as its mean (0 without a leaf).
    let per_question = result
        .summary
        .forests
        .iter()
        .map(|f| QuestionReward {
            id: f.prompt_uid.clone(),
            reward: f.mean_reward,
        })
        .collect();
    Ok(Evaluation {
        mean_reward: result.summary.mean_reward,
        prompts: samples.len(),
        seconds: t0.elapsed().as_secs_f64(),
        per_question,
    })
}
