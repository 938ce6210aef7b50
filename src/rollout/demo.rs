//! Demonstrations: an episode played by the environment's oracle
//! ([`Environment::oracle_step`]) through the one agent loop, tokenised as the
//! engine's rollouts are (each step's text as model tokens with loss mask 1, the
//! tool's real observation as mask-0 tokens), so a supervised warm-start teaches the
//! exact step format the environment parses.

use async_trait::async_trait;

use crate::env::{
    run_agent_loop, Environment, Episode, ModelStep, QaSample, StepDone, StepModel, Tags,
};
use crate::model::{LoadedModel, TokenId};

use super::error::RolloutError;
use super::trajectory::Trajectory;

/// The oracle as the agent loop's model: it writes each step from the episode so far.
struct OracleSteps<'a> {
    env: &'a dyn Environment,
    model: &'a LoadedModel,
    /// The episode as of the last finished step (the loop owns the live one).
    episode: Episode,
    traj: Trajectory,
    /// The oracle had nothing to say for this sample.
    missing: bool,
}

#[async_trait]
impl StepModel for OracleSteps<'_> {
    type Error = RolloutError;

    async fn step(&mut self, _index: usize) -> Result<ModelStep, RolloutError> {
        let text = match self.env.oracle_step(&self.episode) {
            Some(text) => text,
            None => {
                // No demonstration: an empty answer ends the episode; the caller
                // drops it.
                self.missing = true;
                let answer = &self.env.config().tags.answer;
                format!("{}{}", Tags::open(answer), Tags::close(answer))
            }
        };
        let tokens = self.model.tokenizer.encode(&text, false)?;
        Ok(ModelStep {
            logprobs: vec![0.0; tokens.len()],
            behaviour_logprobs: Vec::new(),
            boosted: 0,
            tokens,
            text,
        })
    }

    async fn observe(&mut self, observation: &str) -> Result<Vec<TokenId>, RolloutError> {
        Ok(self.model.tokenizer.encode(observation, false)?)
    }

    async fn step_done(&mut self, done: StepDone, episode: &Episode) -> Result<(), RolloutError> {
        self.traj.push_step(&done.step);
        self.traj.num_turns += 1;
        if !done.observation.is_empty() {
            self.traj.push_observation(&done.observation);
        }
        self.episode = episode.clone();
        Ok(())
    }
}

/// The oracle's demonstration of `sample`, scored by the environment; `None` when the
/// environment has no oracle for it. Logprobs are 0 (nothing was sampled).
pub async fn demonstrate(
    model: &LoadedModel,
    env: &dyn Environment,
    sample: &QaSample,
) -> Result<Option<Trajectory>, RolloutError> {
    let mut episode = env.start(sample)?;
    let prompt_ids = model.chat_prompt(episode.prompt())?;
    let mut oracle = OracleSteps {
        env,
        model,
        episode: episode.clone(),
        traj: Trajectory::new(prompt_ids),
        missing: false,
    };
    run_agent_loop(env, &mut episode, &mut oracle, 0).await?;
    if oracle.missing {
        return Ok(None);
    }
    let mut traj = oracle.traj;
    let score = env.score(&episode);
    traj.reward = score.reward;
    traj.score = Some(score);
    Ok(Some(traj))
}

/// Demonstrations of every sample the environment has an oracle for, in order.
pub async fn demonstrations(
    model: &LoadedModel,
    env: &dyn Environment,
    samples: &[QaSample],
) -> Result<Vec<Trajectory>, RolloutError> {
    let mut out = Vec::with_capacity(samples.len());
    for s in samples {
        if let Some(t) = demonstrate(model, env, s).await? {
            out.push(t);
        }
    }
    Ok(out)
}
