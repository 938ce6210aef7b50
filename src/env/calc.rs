//! The `calc` environment: multi-step arithmetic word problems, a
//! `<calc>expression</calc>` tool backed by the safe evaluator in
//! [`crate::env::calc_eval`], and exact match on the normalised number.

use std::sync::Arc;

use async_trait::async_trait;

use crate::env::action_kind::ActionKind;
use crate::env::calc_eval::calculate;
use crate::env::config::EnvConfig;
use crate::env::episode::Episode;
use crate::env::error::{EnvError, ToolError};
use crate::env::normalize::numeric_match;
use crate::env::protocol::oracle_text;
use crate::env::reward::RewardMetric;
use crate::env::tags::Tags;
use crate::env::tool::Tool;
use crate::env::tool_env::{ToolEnv, ToolTask};

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
        Ok(calculate(input)?)
    }
}

/// The calculator task: `<calc>` calls the tool, the answer is graded by numeric
/// exact match, and the oracle calls the sample's reference expression.
#[derive(Debug, Clone, Copy, Default)]
pub struct Calc;

/// The calculator environment.
pub type CalcEnv = ToolEnv<Calc>;

impl CalcEnv {
    /// With the built-in calculator.
    pub fn new(cfg: EnvConfig) -> Result<Self, EnvError> {
        Self::with_tool(Arc::new(CalcTool), cfg)
    }

    /// With another tool behind `<calc>` (tests, a remote evaluator).
    pub fn with_tool(tool: Arc<dyn Tool>, cfg: EnvConfig) -> Result<Self, EnvError> {
        Self::with_task(Calc, tool, cfg)
    }
}

impl ToolTask for Calc {
    const NAME: &'static str = "calc";
    const ACTION: ActionKind = ActionKind::Calc;

    /// One calculator call with the sample's reference expression, then its value.
    fn oracle_step(&self, tags: &Tags, episode: &Episode) -> Option<String> {
        let sample = episode.sample();
        let answer = sample.golden_answers.first()?;
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

    /// Numeric exact match only: F1 over digits means nothing, so the configured
    /// metric is ignored and the levels are used as for EM.
    fn metric(&self, _configured: RewardMetric) -> RewardMetric {
        RewardMetric::ExactMatch
    }

    fn judge(&self, answer: &str, golden: &[String]) -> (bool, f64) {
        let ok = numeric_match(answer, golden);
        (ok, f64::from(u8::from(ok)))
    }
}
