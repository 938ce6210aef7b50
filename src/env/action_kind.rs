//! The kinds of action a step can take (search, answer, calc): what the parser
//! recognises, the tag names map, and an environment offers.

use serde::{Deserialize, Serialize};

/// The kinds of action a step can take.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ActionKind {
    Search,
    Answer,
    Calc,
}

impl ActionKind {
    /// Every kind: the parser looks for each one's tags.
    pub const ALL: [ActionKind; 3] = [ActionKind::Search, ActionKind::Answer, ActionKind::Calc];
}
