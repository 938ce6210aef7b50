//! The kinds of action a step can take (search, answer, calc): what the parser
//! recognises, the tag names map, and an environment offers.

use serde::{Deserialize, Serialize};

/// The kinds of action a step can take.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ActionKind {
    /// Query the search engine (tag `search` by default).
    Search,
    /// Give the final answer, ending the episode (tag `answer` by default).
    Answer,
    /// Evaluate an arithmetic expression (tag `calc` by default).
    Calc,
}

impl ActionKind {
    /// Every kind: the parser looks for each one's tags.
    pub const ALL: [ActionKind; 3] = [ActionKind::Search, ActionKind::Answer, ActionKind::Calc];
}
