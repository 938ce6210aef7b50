//! What a prompt's forest cost the engine: the usage of its sequences plus what only
//! the sampler knows (observation tokens, recomputed prefixes, tool calls, skipped
//! branches).

use serde::{Deserialize, Serialize};

use crate::engine::SeqUsage;

/// What one prompt's forest cost: the usage of every sequence it ran (summed as each is
/// freed) plus what only the sampler knows. Summed over forests it gives the run's
/// figures, so every token the engine computed is attributed to exactly one forest
/// (or to the run's shared prefix, see `run`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ForestCost {
    /// Engine usage of the sequences that consumed tokens (node snapshots, which only
    /// hold a prefix for later branches, are not counted as reusing it).
    pub usage: SeqUsage,
    /// Observation tokens appended to sequences.
    pub observation_tokens: u64,
    /// Prefix tokens re-sent because prefix reuse was off.
    pub recomputed: u64,
    /// Steps that called the environment's tool.
    pub tool_calls: u64,
    /// Branches not started because the run's token budget was spent.
    pub skipped_branches: u64,
}

impl ForestCost {
    /// Adds `other` into `self`.
    pub fn add(&mut self, other: &ForestCost) {
        self.usage.add(&other.usage);
        self.observation_tokens += other.observation_tokens;
        self.recomputed += other.recomputed;
        self.tool_calls += other.tool_calls;
        self.skipped_branches += other.skipped_branches;
    }

    /// Adds a freed snapshot's usage. A snapshot only holds a prefix for later
    /// branches: it computes nothing (a fork of it does the computing, even a
    /// recompute after it was preempted), but its preemptions are counted.
    pub(super) fn add_snapshot_usage(&mut self, usage: &SeqUsage) {
        debug_assert_eq!(usage.computed(), 0, "a snapshot computed tokens");
        self.usage.preemptions += usage.preemptions;
    }
}
