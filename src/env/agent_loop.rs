//! The one agent loop: think → act → tool → observe, until the episode ends.
//!
//! Everything that runs an agent — a single episode, a tree branch, the peer engine's
//! chains — drives the same loop and differs only in how a step's text is produced and
//! where the observation goes, which is what [`StepModel`] abstracts. The loop asks
//! the model for a step, lets the environment act on it, hands a non-final step's
//! observation back to the model, and reports each finished step.

use async_trait::async_trait;

use super::environment::{Environment, StepOutcome};
use super::episode::Episode;
use super::error::EnvError;
use crate::model::TokenId;

/// What the model wrote in one step.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelStep {
    /// The step's token ids (loss mask 1).
    pub tokens: Vec<TokenId>,
    /// Natural-log probability of each token under the policy at the sampling
    /// temperature (empty where the producer reports none).
    pub logprobs: Vec<f32>,
    /// Each token's log-probability under the distribution it was drawn from (see
    /// `engine::sampling`; empty where the producer reports none — then it is
    /// `logprobs`).
    pub behaviour_logprobs: Vec<f32>,
    /// How many of the first tokens were drawn from a tree branch's boost (0: none).
    pub boosted: usize,
    /// The step's text, as the environment reads it.
    pub text: String,
}

/// One finished step, as the loop reports it.
#[derive(Debug, Clone)]
pub struct StepDone {
    /// The step's index: the episode's first step is the caller's `first_index`.
    pub index: usize,
    /// What the model wrote.
    pub step: ModelStep,
    /// What the environment made of it: the parsed action, its observation, and
    /// whether the episode ended.
    pub outcome: StepOutcome,
    /// The observation's token ids, when the episode goes on (empty otherwise).
    pub observation: Vec<TokenId>,
    /// Whether the step called a tool (see [`Action::is_tool_call`](super::Action::is_tool_call)).
    pub tool_call: bool,
}

/// Whatever produces an agent's steps: our engine, a tree branch, a peer engine.
#[async_trait]
pub trait StepModel: Send {
    /// The producer's own error; the loop's environment errors convert into it, so
    /// [`run_agent_loop`] returns one error type.
    type Error: From<EnvError> + Send;

    /// The next step, the `index`-th of the episode (seeds derive from it).
    async fn step(&mut self, index: usize) -> Result<ModelStep, Self::Error>;

    /// Puts an observation into the model's context after the step just taken, and
    /// returns its token ids. Observations are untrusted text: special-token markers
    /// in them must stay text.
    async fn observe(&mut self, observation: &str) -> Result<Vec<TokenId>, Self::Error>;

    /// A step is finished (its observation, if any, already observed); `episode` is
    /// the episode's state after it (a tree keeps it to branch from this step).
    async fn step_done(&mut self, done: StepDone, episode: &Episode) -> Result<(), Self::Error>;
}

/// Runs `episode` in `env` to its end, numbering steps from `first_index`.
pub async fn run_agent_loop<M: StepModel>(
    env: &dyn Environment,
    episode: &mut Episode,
    model: &mut M,
    first_index: usize,
) -> Result<(), M::Error> {
    let mut index = first_index;
    while !episode.is_done() {
        let step = model.step(index).await?;
        let outcome = env.step(episode, &step.text).await?;
        let observation = match (&outcome.observation, outcome.done) {
            (Some(text), false) => model.observe(text).await?,
            _ => Vec::new(),
        };
        let tool_call = outcome.action.is_tool_call();
        let done = StepDone {
            index,
            step,
            outcome,
            observation,
            tool_call,
        };
        model.step_done(done, episode).await?;
        index += 1;
    }
    Ok(())
}
