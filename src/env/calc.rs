//! The `calc` environment: multi-step arithmetic word problems, a
//! `<calc>expression</calc>` tool backed by the safe evaluator in
//! [`crate::env::calc_eval`], and exact match on the normalised number.

use std::sync::Arc;

use async_trait::async_trait;

use crate::env::action_kind::ActionKind;
use crate::env::calc_eval::calculate;
use crate::env::config::EnvConfig;
use crate::env::environment::{Environment, Score, StepOutcome};
use crate::env::episode::Episode;
use crate::env::error::{EnvError, ToolError};
use crate::env::normalize::numeric_match;
use crate::env::prompts::initial_messages;
use crate::env::protocol::{oracle_text, protocol_step, score_episode, stop_strings, ToolSlot};
use crate::env::reward::RewardMetric;
use crate::env::sample::QaSample;
use crate::env::tool::Tool;

/// The calculator tool. Evaluation is bounded (200 characters), so it runs
/// inline rather than on the blocking pool.
#[derive(Debug, Clone, Copy, Default)]
pub struct CalcTool;

#[async_trait]
impl Tool for CalcTool {
    fn name(&self) -> &str {
        "calc"
    }

    async fn call(&self, input: &str) -> Result<String, ToolError> {
        calculate(input).map_err(|e| ToolError::InvalidInput(e.to_string()))
    }
}

/// The calculator environment.
#[derive(Clone)]
pub struct CalcEnv {
    cfg: EnvConfig,
    slot: ToolSlot,
}

impl CalcEnv {
    /// With the built-in calculator.
    pub fn new(cfg: EnvConfig) -> Result<Self, EnvError> {
        Self::with_tool(Arc::new(CalcTool), cfg)
    }

    /// With another tool behind `<calc>` (tests, a remote evaluator).
    pub fn with_tool(tool: Arc<dyn Tool>, cfg: EnvConfig) -> Result<Self, EnvError> {
        cfg.validate()?;
        Ok(Self {
            cfg,
            slot: ToolSlot {
                kind: ActionKind::Calc,
                tool,
            },
        })
    }
}

#[async_trait]
impl Environment for CalcEnv {
    fn name(&self) -> &str {
        "calc"
    }

    fn config(&self) -> &EnvConfig {
        &self.cfg
    }

    fn stop_strings(&self) -> Vec<String> {
        stop_strings(&self.cfg.tags, ActionKind::Calc)
    }

    fn start(&self, sample: &QaSample) -> Result<Episode, EnvError> {
        let prompt = initial_messages(
            ActionKind::Calc,
            &self.cfg.tags,
            self.cfg.max_turns,
            &sample.question,
        );
        Ok(Episode::new(sample.clone(), prompt, self.cfg.max_turns))
    }

    async fn step(&self, episode: &mut Episode, step_text: &str) -> Result<StepOutcome, EnvError> {
        protocol_step(&self.cfg, &self.slot, episode, step_text).await
    }

    /// One calculator call with the sample's reference expression, then its value.
    fn oracle_step(&self, episode: &Episode) -> Option<String> {
        let sample = episode.sample();
        let answer = sample.golden_answers.first()?;
        let tags = &self.cfg.tags;
        let expression = sample.metadata.as_ref()?.get("expression")?.as_str()?;
        let step = if episode.steps().is_empty() && !episode.in_answer_only_turn() {
            let thought = "I need to compute the result of the described steps.";
            oracle_text(tags, thought, &tags.calc, expression)
        } else {
            let thought = format!("The result is {answer}.");
            oracle_text(tags, &thought, &tags.answer, answer)
        };
        Some(step)
    }

    /// Numeric exact match only: F1 over digits means nothing, so the
    /// configured metric is ignored and the levels are used as for EM.
    fn score(&self, episode: &Episode) -> Score {
        score_episode(
            episode,
            &self.cfg.reward,
            RewardMetric::ExactMatch,
            |answer, golden| {
                let ok = numeric_match(answer, golden);
                (ok, f64::from(u8::from(ok)))
            },
        )
    }
}
