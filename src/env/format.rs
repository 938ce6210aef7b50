//! Well-formedness of a step and of a trajectory: the format part of the
//! reward.
//!
//! A **step** is well formed iff its text, with surrounding whitespace
//! trimmed, is exactly
//!
//! ```text
//! <think>THOUGHT</think> <ACTION>CONTENT</ACTION>
//! ```
//!
//! where whitespace (only) may separate the two blocks, THOUGHT and CONTENT
//! contain no protocol tag (think, search, answer, calc, information; opening
//! or closing), CONTENT is non-empty after trimming, ACTION is an action the
//! environment accepts in that turn, and nothing but whitespace follows the
//! closing action tag. This is Search-R1's `is_valid_sequence` state machine
//! applied to one step: no stray text between tags, one think then one action.
//!
//! A **trajectory** is well formed iff it has at least one step, every step
//! is well formed, and the last step is an answer (so an episode cut short,
//! or one that ended on an invalid step in the forced answer turn, is not).

use serde::{Deserialize, Serialize};

use crate::env::action::{locate, Action, InvalidReason};
use crate::env::tags::Tags;

/// The first rule a step breaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "issue", rename_all = "snake_case")]
pub enum FormatIssue {
    /// The step does not start with `<think>`.
    MissingThink,
    /// `<think>` is never closed.
    UnclosedThink,
    /// A protocol tag inside the think block.
    TagInThink,
    /// The step's action is invalid (this includes actions not allowed now).
    InvalidAction(InvalidReason),
    /// Text other than whitespace between `</think>` and the action tag.
    TextBeforeAction,
    /// Text after the closing action tag (a second action, or chatter).
    TextAfterAction,
    /// The trajectory's last step is not an answer.
    NoFinalAnswer,
    /// The trajectory has no step.
    Empty,
}

/// Checks one step against the rule in the module doc. `action` is the
/// action as the environment classified it (so an action not allowed in this
/// turn is already `Invalid`).
pub fn check_step_format(text: &str, tags: &Tags, action: &Action) -> Result<(), FormatIssue> {
    if let Action::Invalid(reason) = action {
        return Err(FormatIssue::InvalidAction(*reason));
    }
    let text = text.trim();
    let open = Tags::open(&tags.think);
    let close = Tags::close(&tags.think);
    let Some(after_open) = text.strip_prefix(open.as_str()) else {
        return Err(FormatIssue::MissingThink);
    };
    let Some(close_at) = after_open.find(&close) else {
        return Err(FormatIssue::UnclosedThink);
    };
    let markers = tags.markers();
    if markers
        .iter()
        .any(|m| after_open[..close_at].contains(m.as_str()))
    {
        return Err(FormatIssue::TagInThink);
    }
    let body = &after_open[close_at + close.len()..];
    // The action was parsed from this same body, so `locate` finds it again.
    let Ok(found) = locate(body, tags) else {
        return Err(FormatIssue::InvalidAction(InvalidReason::NoAction));
    };
    if !body[..found.open_start].trim().is_empty() {
        return Err(FormatIssue::TextBeforeAction);
    }
    if !body[found.close_end..].trim().is_empty() {
        return Err(FormatIssue::TextAfterAction);
    }
    Ok(())
}
