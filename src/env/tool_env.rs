//! The one environment of the tool-using tasks (`calc`, `search-qa`): the Search-R1
//! step protocol of [`crate::env::protocol`] around one [`Tool`]. What differs between
//! the tasks — the action that calls the tool, the oracle, the grading — is a
//! [`ToolTask`]; the tool itself is any [`Tool`] (the built-in one, a remote service,
//! a test double).

use std::sync::Arc;

use async_trait::async_trait;

use crate::env::action_kind::ActionKind;
use crate::env::config::EnvConfig;
use crate::env::environment::{Environment, Score, StepOutcome};
use crate::env::episode::Episode;
use crate::env::error::EnvError;
use crate::env::prompts::initial_messages;
use crate::env::protocol::{protocol_step, score_episode, stop_strings, ToolSlot};
use crate::env::reward::RewardMetric;
use crate::env::sample::QaSample;
use crate::env::tags::Tags;
use crate::env::tool::Tool;

/// What one tool-using task adds to the shared protocol.
pub trait ToolTask: Send + Sync {
    /// Short task name, e.g. `calc` (see [`Environment::name`]).
    const NAME: &'static str;
    /// The action that calls the task's tool.
    const ACTION: ActionKind;

    /// The next step of a demonstration in the protocol's format, or `None` where
    /// the task has no oracle for this sample (see [`Environment::oracle_step`]).
    fn oracle_step(&self, tags: &Tags, episode: &Episode) -> Option<String>;

    /// The metric that sets the reward, given the configured one.
    fn metric(&self, configured: RewardMetric) -> RewardMetric {
        configured
    }

    /// Grades an answer against the golden answers: (exact match, F1).
    fn judge(&self, answer: &str, golden: &[String]) -> (bool, f64);
}

/// A tool-using task's environment: the protocol, its configuration and its tool.
#[derive(Clone)]
pub struct ToolEnv<T> {
    cfg: EnvConfig,
    slot: ToolSlot,
    task: T,
}

impl<T: ToolTask> ToolEnv<T> {
    /// `task` with `tool` behind its action, after checking `cfg`.
    pub fn with_task(task: T, tool: Arc<dyn Tool>, cfg: EnvConfig) -> Result<Self, EnvError> {
        cfg.validate()?;
        Ok(Self {
            cfg,
            slot: ToolSlot {
                kind: T::ACTION,
                tool,
            },
            task,
        })
    }
}

#[async_trait]
impl<T: ToolTask> Environment for ToolEnv<T> {
    fn name(&self) -> &str {
        T::NAME
    }

    fn config(&self) -> &EnvConfig {
        &self.cfg
    }

    fn stop_strings(&self) -> Vec<String> {
        stop_strings(&self.cfg.tags, T::ACTION)
    }

    fn start(&self, sample: &QaSample) -> Result<Episode, EnvError> {
        let prompt = initial_messages(
            T::ACTION,
            &self.cfg.tags,
            self.cfg.max_turns,
            &sample.question,
        );
        Ok(Episode::new(sample.clone(), prompt, self.cfg.max_turns))
    }

    async fn step(&self, episode: &mut Episode, step_text: &str) -> Result<StepOutcome, EnvError> {
        protocol_step(&self.cfg, &self.slot, episode, step_text).await
    }

    fn oracle_step(&self, episode: &Episode) -> Option<String> {
        self.task.oracle_step(&self.cfg.tags, episode)
    }

    fn score(&self, episode: &Episode) -> Score {
        let reward = &self.cfg.reward;
        score_episode(
            episode,
            reward,
            self.task.metric(reward.metric),
            |answer, golden| self.task.judge(answer, golden),
        )
    }
}
