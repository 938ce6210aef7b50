//! The action parser: what a model step asks for.
//!
//! Search-R1 reads a step with `re.search(r'<(search|answer)>(.*?)</\1>')`:
//! the first opening tag that has its closing tag somewhere after it wins,
//! lazily matched. This parser does the same (with `calc` as a third action)
//! after skipping the think block, trims the content, and rejects an empty
//! content or one that itself contains protocol tags (nested tags). It never
//! panics and runs in linear time in the text length for a fixed tag set,
//! because the engine may hand it anything.

use serde::{Deserialize, Serialize};

use crate::env::action_kind::ActionKind;
use crate::env::tags::Tags;

/// Why a step is not a valid action. The environment answers every one of
/// them with the same invalid-action feedback; the reason is kept for logs
/// and statistics.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "reason", rename_all = "snake_case")]
pub enum InvalidReason {
    /// No action tag at all.
    NoAction,
    /// An opening tag whose closing tag never comes (and no complete action).
    Unclosed {
        /// The action whose opening tag is unclosed.
        kind: ActionKind,
    },
    /// The content is empty or whitespace.
    Empty {
        /// The action whose tag was found.
        kind: ActionKind,
    },
    /// The content contains protocol tags, e.g. `<search><answer>x</answer></search>`.
    NestedTag {
        /// The outer action.
        kind: ActionKind,
    },
    /// A complete action this environment does not offer (calc in search-qa).
    NotAllowed {
        /// The action asked for.
        kind: ActionKind,
    },
    /// A tool call in the forced answer turn after the turn limit.
    ToolAfterTurnLimit {
        /// The tool action asked for instead of an answer.
        kind: ActionKind,
    },
}

/// A parsed step.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", content = "content", rename_all = "snake_case")]
pub enum Action {
    /// A search-engine query (the trimmed text between the search tags); the
    /// environment answers with the top documents as an observation.
    Search(String),
    /// The final answer (trimmed); it ends the episode and is graded against the
    /// sample's golden answers.
    Answer(String),
    /// An arithmetic expression for the calculator (trimmed); the environment
    /// answers with its value as an observation.
    Calc(String),
    /// A step that is not a well-formed action; the environment answers with its
    /// invalid-action feedback and the episode goes on (in the forced answer turn
    /// after the turn limit, it ends without an answer).
    Invalid(InvalidReason),
    /// A step of an environment that reads its own steps (one written in Python):
    /// this crate parses nothing; `continues` is whether the environment answered with
    /// an observation and went on (counted as a tool call).
    External {
        /// Whether the environment went on with an observation (`false`: the step
        /// ended the episode).
        continues: bool,
    },
}

impl Action {
    /// The kind of a valid action; `None` for an invalid one.
    pub fn kind(&self) -> Option<ActionKind> {
        match self {
            Action::Search(_) => Some(ActionKind::Search),
            Action::Answer(_) => Some(ActionKind::Answer),
            Action::Calc(_) => Some(ActionKind::Calc),
            Action::Invalid(_) | Action::External { .. } => None,
        }
    }

    /// Whether the action calls a tool (whose result becomes an observation). A new
    /// tool is added here, with its variant, and nowhere else.
    pub fn is_tool_call(&self) -> bool {
        matches!(
            self,
            Action::Search(_) | Action::Calc(_) | Action::External { continues: true }
        )
    }

    /// The trimmed content of a valid action.
    pub fn content(&self) -> Option<&str> {
        match self {
            Action::Search(s) | Action::Answer(s) | Action::Calc(s) => Some(s),
            Action::Invalid(_) | Action::External { .. } => None,
        }
    }

    /// Whether the step was a well-formed action: anything but [`Action::Invalid`]
    /// (an [`Action::External`] step counts as valid: its environment judged it).
    pub fn is_valid(&self) -> bool {
        !matches!(self, Action::Invalid(_))
    }

    fn of(kind: ActionKind, content: String) -> Action {
        match kind {
            ActionKind::Search => Action::Search(content),
            ActionKind::Answer => Action::Answer(content),
            ActionKind::Calc => Action::Calc(content),
        }
    }
}

/// The part of a step after its think block: after the first `</think>`, or
/// the whole text when there is none. Skipping to the closing tag (rather
/// than requiring `<think>` first) also handles chat templates that prefill
/// `<think>` into the prompt. Whether the think block is well formed is the
/// format check's business, not the parser's.
pub fn after_think<'a>(text: &'a str, tags: &Tags) -> &'a str {
    let close = Tags::close(&tags.think);
    match text.find(&close) {
        Some(pos) => &text[pos + close.len()..],
        None => text,
    }
}

/// The byte range of the first complete action after the think block, as
/// `(kind, start of opening tag, content range, end of closing tag)`, all
/// relative to `body`. Shared with the format check so both agree on which
/// tag is "the" action.
pub(crate) struct Located {
    pub kind: ActionKind,
    pub open_start: usize,
    pub content: std::ops::Range<usize>,
    pub close_end: usize,
}

/// Finds the leftmost opening tag that has a matching closing tag after it.
/// `Err(Some(kind))` when only unclosed opening tags exist (the first one's
/// kind), `Err(None)` when there is no opening tag at all.
pub(crate) fn locate(body: &str, tags: &Tags) -> Result<Located, Option<ActionKind>> {
    let opens = ActionKind::ALL.map(|k| Tags::open(tags.action(k)));
    let closes = ActionKind::ALL.map(|k| Tags::close(tags.action(k)));
    // An opening tag at `i` is complete iff some closing tag starts at or
    // after its end, i.e. iff the LAST closing tag does. Knowing that
    // position up front keeps the scan linear on noise full of open tags.
    let last_close = closes.clone().map(|c| body.rfind(&c));
    let mut first_unclosed = None;
    for (i, _) in body.match_indices('<') {
        let rest = &body[i..];
        for (k, kind) in ActionKind::ALL.into_iter().enumerate() {
            if !rest.starts_with(&opens[k]) {
                continue;
            }
            let start = i + opens[k].len();
            let complete = matches!(last_close[k], Some(lc) if lc >= start);
            if let (true, Some(rel)) = (complete, body[start..].find(&closes[k])) {
                let end = start + rel;
                return Ok(Located {
                    kind,
                    open_start: i,
                    content: start..end,
                    close_end: end + closes[k].len(),
                });
            }
            first_unclosed.get_or_insert(kind);
        }
    }
    Err(first_unclosed)
}

/// Parses one model step into an action (see the module doc for the rule).
pub fn parse_action(text: &str, tags: &Tags) -> Action {
    let body = after_think(text, tags);
    let found = match locate(body, tags) {
        Ok(found) => found,
        Err(Some(kind)) => return Action::Invalid(InvalidReason::Unclosed { kind }),
        Err(None) => return Action::Invalid(InvalidReason::NoAction),
    };
    let content = body[found.content].trim();
    if content.is_empty() {
        return Action::Invalid(InvalidReason::Empty { kind: found.kind });
    }
    if tags.markers().iter().any(|m| content.contains(m.as_str())) {
        return Action::Invalid(InvalidReason::NestedTag { kind: found.kind });
    }
    Action::of(found.kind, content.to_owned())
}
