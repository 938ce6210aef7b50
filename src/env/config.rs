//! The settings every tool environment shares: tag names, the turn limit, tool
//! timeouts and output limits, and the reward.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::env::error::EnvError;
use crate::env::reward::RewardConfig;
use crate::env::tags::Tags;

/// Settings shared by the tool environments.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EnvConfig {
    /// The protocol's tag names (Search-R1's by default).
    pub tags: Tags,
    /// Tool turns before the forced answer turn (Search-R1's `max_turns`).
    /// Zero gives a direct-answer baseline: the first step must answer.
    pub max_turns: usize,
    /// Wall-clock limit for one tool call.
    pub tool_timeout: Duration,
    /// Tool output beyond this many characters is cut.
    pub max_observation_chars: usize,
    /// How a finished episode is scored.
    pub reward: RewardConfig,
}

impl Default for EnvConfig {
    fn default() -> Self {
        Self {
            tags: Tags::default(),
            max_turns: 3,
            tool_timeout: Duration::from_secs(10),
            max_observation_chars: 8000,
            reward: RewardConfig::default(),
        }
    }
}

impl EnvConfig {
    /// Checks the tag names and that the tool timeout and observation limit are positive.
    pub fn validate(&self) -> Result<(), EnvError> {
        self.tags.validate()?;
        if self.tool_timeout.is_zero() {
            return Err(EnvError::Config("tool_timeout must be positive".into()));
        }
        if self.max_observation_chars == 0 {
            return Err(EnvError::Config(
                "max_observation_chars must be positive".into(),
            ));
        }
        Ok(())
    }
}
