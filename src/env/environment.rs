//! The `Environment` trait every agent task implements, and what it returns.
//!
//! An environment is shared (`Arc<dyn Environment>`) by every rollout; all
//! per-episode state lives in the [`Episode`] value the caller owns. Tree
//! rollouts fork a trajectory by cloning its `Episode`, so environments must
//! keep nothing per episode themselves.

use async_trait::async_trait;
use serde::{Deserialize, Serialize};

use crate::env::action::Action;
use crate::env::config::EnvConfig;
use crate::env::episode::{Episode, StepRecord};
use crate::env::error::EnvError;
use crate::env::reward::RewardMetric;
use crate::env::sample::QaSample;

/// What one step produced.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StepOutcome {
    /// Observation text to append after the step's text, as prompt tokens
    /// (loss mask 0): a tool result in `\n\n<information>...</information>\n\n`,
    /// or the invalid-action feedback, possibly followed by the turn-limit
    /// notice. `None` when the episode ended.
    pub observation: Option<String>,
    /// Whether the episode is over (answered, or failed its forced answer turn).
    pub done: bool,
    /// The action as the environment understood it (an action not allowed
    /// in this environment or turn is `Invalid`).
    pub action: Action,
}

impl StepOutcome {
    /// Records a step of an environment outside the built-in step protocol (a Python
    /// environment, a custom Rust one): `text` as the model wrote it, `observation`
    /// appended unless the episode is `done`, the action [`Action::External`]. What
    /// such an environment's [`Environment::step`] returns.
    pub fn external(
        episode: &mut Episode,
        text: &str,
        observation: Option<String>,
        done: bool,
    ) -> Self {
        let observation = if done { None } else { observation };
        let action = Action::External { continues: !done };
        let record = StepRecord {
            text: text.to_owned(),
            action: action.clone(),
            observation: observation.clone(),
            format_issue: None,
            tool_status: None,
            answer_only_turn: false,
        };
        episode.push(record, done);
        StepOutcome {
            observation,
            done,
            action,
        }
    }
}

/// The grade of a trajectory.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Score {
    /// The trajectory's reward: one of the [`RewardLevels`](crate::env::RewardLevels)
    /// (or between two of them with the F1 metric); what advantages are computed from.
    pub reward: f64,
    /// How the reward came about.
    pub details: ScoreDetails,
}

/// Why a trajectory got its reward, for logs and metrics.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ScoreDetails {
    /// The final answer, if the trajectory gave one.
    pub answer: Option<String>,
    /// Normalised exact match (numeric match for calc).
    pub exact_match: bool,
    /// Best token F1 over golden answers (for calc: 1 if correct, else 0).
    pub f1: f64,
    /// The metric that set the reward.
    pub metric: RewardMetric,
    /// See [`crate::env::format`].
    pub well_formed: bool,
    /// The first format problem, as `step N: issue`, when malformed.
    pub format_issue: Option<String>,
    /// Steps the model took, the final answer's included.
    pub steps: usize,
    /// Steps that ran the tool.
    pub tool_calls: usize,
    /// Tool calls that failed or timed out (their error text was the observation).
    pub tool_errors: usize,
    /// Steps that were not a valid action.
    pub invalid_actions: usize,
}

/// An agent task: prompts, step handling and grading.
#[async_trait]
pub trait Environment: Send + Sync {
    /// Short task name, e.g. `search-qa`.
    fn name(&self) -> &str;

    /// The environment's configuration (tags, turn limit, timeouts, reward).
    fn config(&self) -> &EnvConfig;

    /// Strings at which the engine should stop a step's generation: the
    /// closing tags of the actions this environment offers. The step text
    /// given to [`Environment::step`] must include the stop string.
    fn stop_strings(&self) -> Vec<String>;

    /// Starts an episode: its prompt is the system message (tools and
    /// protocol) and the user message (the question). Built-in tasks always
    /// start; a user-defined environment may fail
    /// ([`EnvError::EpisodeFailed`]: that prompt fails, the run goes on).
    fn start(&self, sample: &QaSample) -> Result<Episode, EnvError>;

    /// Takes one model step. Invalid actions, tool failures and the turn
    /// limit are reported in the outcome; `Err` only for stepping an episode
    /// that already ended.
    async fn step(&self, episode: &mut Episode, step_text: &str) -> Result<StepOutcome, EnvError>;

    /// Grades a trajectory (an unfinished one has no answer and scores as such).
    fn score(&self, episode: &Episode) -> Score;

    /// The next step of a demonstration — what an oracle that knows the sample's
    /// solution writes, in the exact step format [`Environment::step`] parses — or
    /// `None` where the task has no oracle for this sample. Supervised warm-starts
    /// are trained on these (`treegrpo sft`).
    fn oracle_step(&self, _episode: &Episode) -> Option<String> {
        None
    }
}
