//! The protocol's tag names, configurable so a model trained with other
//! names (say `<tool>` instead of `<search>`) can be served.
//!
//! Defaults are Search-R1's: `think`, `search`, `answer`, `information`,
//! plus `calc` for the calculator environment.

use serde::{Deserialize, Serialize};

use crate::env::action_kind::ActionKind;
use crate::env::error::EnvError;

/// Tag names, without the angle brackets.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Tags {
    /// The model's reasoning block (`think`); the action parser skips past its close.
    pub think: String,
    /// The search action (`search`).
    pub search: String,
    /// The final-answer action (`answer`).
    pub answer: String,
    /// The calculator action (`calc`).
    pub calc: String,
    /// What the environment wraps a tool's result in (`information`).
    pub information: String,
}

impl Default for Tags {
    fn default() -> Self {
        Self {
            think: "think".into(),
            search: "search".into(),
            answer: "answer".into(),
            calc: "calc".into(),
            information: "information".into(),
        }
    }
}

impl Tags {
    /// `<name>`.
    pub fn open(name: &str) -> String {
        format!("<{name}>")
    }

    /// `</name>`.
    pub fn close(name: &str) -> String {
        format!("</{name}>")
    }

    /// The tag name of an action kind.
    pub fn action(&self, kind: ActionKind) -> &str {
        match kind {
            ActionKind::Search => &self.search,
            ActionKind::Answer => &self.answer,
            ActionKind::Calc => &self.calc,
        }
    }

    fn names(&self) -> [&str; 5] {
        [
            &self.think,
            &self.search,
            &self.answer,
            &self.calc,
            &self.information,
        ]
    }

    /// Every opening and closing tag of the protocol. Text inside a think
    /// block or an action must contain none of them to be well formed.
    pub fn markers(&self) -> Vec<String> {
        self.names()
            .iter()
            .flat_map(|n| [Self::open(n), Self::close(n)])
            .collect()
    }

    /// Rejects empty names, names with characters that could make tags
    /// ambiguous, and duplicates (two actions sharing one tag could not be
    /// told apart).
    pub fn validate(&self) -> Result<(), EnvError> {
        let names = self.names();
        for (i, name) in names.iter().enumerate() {
            let ok_chars = name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
            if name.is_empty() || !ok_chars {
                return Err(EnvError::Config(format!(
                    "tag name {name:?} must be non-empty ASCII letters, digits, '_' or '-'"
                )));
            }
            if names[..i].contains(name) {
                return Err(EnvError::Config(format!("tag name {name:?} is used twice")));
            }
        }
        Ok(())
    }
}
