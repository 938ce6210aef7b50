//! Runs one agent episode through the engine: each step generates until a closing
//! action tag (or the end of turn), the environment answers, and its observation is
//! appended to the sequence as prompt tokens with loss mask 0.

use crate::engine::{Engine, GenParams, Sampling};
use crate::env::{Environment, Episode, QaSample};
use crate::model::TokenId;

use super::error::RolloutError;
use super::trajectory::Trajectory;

/// Sampling settings of an episode.
#[derive(Debug, Clone, PartialEq)]
pub struct EpisodeParams {
    pub sampling: Sampling,
    /// Most tokens the model may write in one step.
    pub max_step_tokens: usize,
    /// Seed words; the step index is appended so each step has its own RNG stream.
    pub seed: Vec<u64>,
}

impl Default for EpisodeParams {
    fn default() -> Self {
        EpisodeParams {
            sampling: Sampling::Greedy,
            max_step_tokens: 256,
            seed: Vec::new(),
        }
    }
}

/// Runs `sample` to the end in `env`; returns the trajectory and the environment's
/// record of the episode (step texts, actions, observations).
pub async fn run_episode(
    engine: &Engine,
    env: &dyn Environment,
    sample: &QaSample,
    params: &EpisodeParams,
) -> Result<(Trajectory, Episode), RolloutError> {
    let model = engine.model().clone();
    let mut episode = env.start(sample);
    let prompt_ids = model.chat_prompt(episode.prompt())?;
    let seq = engine.add_sequence(prompt_ids.clone()).await?;
    let mut traj = Trajectory::new(prompt_ids);
    let stop_strings = env.stop_strings();
    let stop_tokens: Vec<TokenId> = model.tokenizer.eos_ids().to_vec();
    let result = async {
        while !episode.is_done() {
            let mut seed = params.seed.clone();
            seed.push(traj.num_turns as u64);
            let gen = engine
                .generate(
                    seq,
                    GenParams {
                        sampling: params.sampling,
                        max_new_tokens: params.max_step_tokens,
                        stop_tokens: stop_tokens.clone(),
                        stop_strings: stop_strings.clone(),
                        seed,
                    },
                )
                .await?;
            traj.push_model(&gen.tokens, &gen.logprobs);
            traj.num_turns += 1;
            let text = model.tokenizer.decode(&gen.tokens)?;
            let outcome = env.step(&mut episode, &text).await?;
            if let Some(obs) = outcome.observation.filter(|_| !outcome.done) {
                // Observations are untrusted text: special-token markers stay text.
                let ids = model.tokenizer.encode(&obs, false)?;
                engine.append(seq, ids.clone()).await?;
                traj.push_observation(&ids);
            }
        }
        Ok::<(), RolloutError>(())
    }
    .await;
    engine.free(seq).await?;
    result?;
    let score = env.score(&episode);
    traj.reward = score.reward;
    traj.score = Some(score);
    Ok((traj, episode))
}
