//! Runs one agent episode through the engine: the agent loop of `env` with our engine
//! as its model — each step generates until a closing action tag (or the end of turn),
//! the environment answers, and its observation is appended to the sequence as prompt
//! tokens with loss mask 0.

use async_trait::async_trait;

use crate::engine::{BoostedStart, Engine, GenParams, Sampling};
use crate::env::{run_agent_loop, Environment, Episode, ModelStep, QaSample, StepDone, StepModel};
use crate::kv::SeqId;
use crate::model::TokenId;

use super::error::RolloutError;
use super::trajectory::Trajectory;

/// Sampling settings of an episode.
#[derive(Debug, Clone, PartialEq)]
pub struct EpisodeParams {
    /// How each token is sampled.
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

/// One engine sequence producing an agent's steps: what the episode and the tree
/// branch share (each keeps its own record of the steps).
pub(crate) struct EngineSteps<'a> {
    pub engine: &'a Engine,
    pub seq: SeqId,
    pub sampling: Sampling,
    pub max_step_tokens: usize,
    /// Seed words; the step index is appended so each step has its own RNG stream.
    pub seed: Vec<u64>,
    pub stop_strings: Vec<String>,
    pub stop_tokens: Vec<TokenId>,
    /// The step (by index) whose first tokens are drawn from a boost: a tree
    /// branch's first step, under its branch sampling.
    pub boost: Option<(usize, BoostedStart)>,
}

impl EngineSteps<'_> {
    /// Generates the `index`-th step.
    pub async fn step(&self, index: usize) -> Result<ModelStep, RolloutError> {
        let mut seed = self.seed.clone();
        seed.push(index as u64);
        let params = GenParams {
            sampling: self.sampling,
            max_new_tokens: self.max_step_tokens,
            stop_tokens: self.stop_tokens.clone(),
            stop_strings: self.stop_strings.clone(),
            seed,
            boost: self
                .boost
                .filter(|(at, _)| *at == index)
                .map(|(_, boost)| boost),
            ..GenParams::greedy(0)
        };
        let gen = self.engine.generate(self.seq, params).await?;
        let text = self.engine.model().tokenizer.decode(&gen.tokens)?;
        Ok(ModelStep {
            tokens: gen.tokens,
            logprobs: gen.logprobs,
            behaviour_logprobs: gen.behaviour_logprobs,
            boosted: gen.boosted,
            text,
        })
    }

    /// Appends an observation to the sequence (special-token markers stay text).
    pub async fn observe(&self, observation: &str) -> Result<Vec<TokenId>, RolloutError> {
        let ids = self.engine.model().tokenizer.encode(observation, false)?;
        self.engine.append(self.seq, ids.clone()).await?;
        Ok(ids)
    }
}

/// Our engine as the agent loop's model, building the trajectory as it goes.
struct EpisodeModel<'a> {
    steps: EngineSteps<'a>,
    traj: Trajectory,
}

#[async_trait]
impl StepModel for EpisodeModel<'_> {
    type Error = RolloutError;

    async fn step(&mut self, index: usize) -> Result<ModelStep, RolloutError> {
        self.steps.step(index).await
    }

    async fn observe(&mut self, observation: &str) -> Result<Vec<TokenId>, RolloutError> {
        self.steps.observe(observation).await
    }

    async fn step_done(&mut self, done: StepDone, _episode: &Episode) -> Result<(), RolloutError> {
        self.traj.push_step(&done.step);
        self.traj.num_turns += 1;
        if !done.observation.is_empty() {
            self.traj.push_observation(&done.observation);
        }
        Ok(())
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
    let mut episode = env.start(sample)?;
    let prompt_ids = model.chat_prompt(episode.prompt())?;
    let seq = engine.add_sequence(prompt_ids.clone()).await?;
    let mut agent = EpisodeModel {
        steps: EngineSteps {
            engine,
            seq,
            sampling: params.sampling,
            max_step_tokens: params.max_step_tokens,
            seed: params.seed.clone(),
            stop_strings: env.stop_strings(),
            stop_tokens: model.tokenizer.eos_ids().to_vec(),
            boost: None,
        },
        traj: Trajectory::new(prompt_ids),
    };
    let result = run_agent_loop(env, &mut episode, &mut agent, 0).await;
    engine.free(seq).await?;
    result?;
    let mut traj = agent.traj;
    let score = env.score(&episode);
    traj.reward = score.reward;
    traj.score = Some(score);
    Ok((traj, episode))
}
