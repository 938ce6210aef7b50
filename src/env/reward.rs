//! Reward levels: correctness crossed with format, as in Search-R1's
//! `qa_em_format` scorer.
//!
//! | answer    | well formed | malformed |
//! |-----------|-------------|-----------|
//! | correct   | 1.0         | 0.8       |
//! | wrong     | 0.2         | 0.1       |
//! | none      | 0.0         | 0.0       |
//!
//! "Well formed" is defined in [`crate::env::format`]. With the F1 metric
//! the correctness `c` in [0, 1] interpolates between the wrong and correct
//! levels of the same format column (`wrong + c * (correct - wrong)`), so F1
//! = 1 and F1 = 0 give exactly the EM levels.

use serde::{Deserialize, Serialize};

/// What "correct" means for a QA answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum RewardMetric {
    /// Normalised exact match against any golden answer (Search-R1).
    #[default]
    ExactMatch,
    /// Best token-level SQuAD F1 over the golden answers.
    F1,
    /// The environment's own reward: a user-defined environment (a Python class)
    /// grades its episodes itself. The QA tasks treat it as exact match.
    Environment,
}

/// The five reward levels (defaults in the module doc).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct RewardLevels {
    /// A correct answer in a well-formed trajectory (default 1.0).
    pub correct_well_formed: f64,
    /// A correct answer in a malformed trajectory (default 0.8).
    pub correct_malformed: f64,
    /// A wrong answer in a well-formed trajectory (default 0.2).
    pub wrong_well_formed: f64,
    /// A wrong answer in a malformed trajectory (default 0.1).
    pub wrong_malformed: f64,
    /// No answer at all, whatever the format (default 0.0).
    pub no_answer: f64,
}

impl Default for RewardLevels {
    fn default() -> Self {
        Self {
            correct_well_formed: 1.0,
            correct_malformed: 0.8,
            wrong_well_formed: 0.2,
            wrong_malformed: 0.1,
            no_answer: 0.0,
        }
    }
}

/// Metric plus levels.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize, Default)]
pub struct RewardConfig {
    /// What counts as a correct answer.
    pub metric: RewardMetric,
    /// The reward of each outcome.
    pub levels: RewardLevels,
}

/// The reward for an answer of correctness `correctness` (`None`: no
/// answer) given the trajectory's format.
pub fn reward_from(correctness: Option<f64>, well_formed: bool, levels: &RewardLevels) -> f64 {
    let Some(c) = correctness else {
        return levels.no_answer;
    };
    let c = c.clamp(0.0, 1.0);
    let (wrong, correct) = if well_formed {
        (levels.wrong_well_formed, levels.correct_well_formed)
    } else {
        (levels.wrong_malformed, levels.correct_malformed)
    };
    wrong + c * (correct - wrong)
}
