//! Errors of the env layer.
//!
//! Only misuse is an error: unreadable or malformed data files, an invalid
//! configuration, stepping an episode that already ended. Everything an agent
//! can cause during an episode (an invalid action, the turn limit, a tool that
//! fails or hangs) is data in the episode, never an `Err`, because the rollout
//! layer must be able to score any trajectory the model produces.

use std::path::PathBuf;

use crate::env::ids::SampleId;

/// Misuse of the env layer.
#[derive(Debug, thiserror::Error)]
pub enum EnvError {
    /// A data file could not be read or written (the cause is the `source`, printed
    /// once by a chain-printing caller).
    #[error("cannot {op} {}", .path.display())]
    Io {
        /// What was being done (`"read"`, `"create"`, `"write"`).
        op: &'static str,
        /// The data file (or folder) at fault.
        path: PathBuf,
        /// The operating system's error.
        #[source]
        source: std::io::Error,
    },
    /// One line of a JSONL data file is a record whose values are unusable (`reason`
    /// says which).
    #[error("{}:{line}: {reason}", .path.display())]
    BadRecord {
        /// The data file.
        path: PathBuf,
        /// 1-based line number of the record.
        line: usize,
        /// What is wrong with it (a duplicate id, an empty field, ...).
        reason: String,
    },
    /// One line of a JSONL data file is not JSON of the record's shape.
    #[error("{}:{line}: not a valid record", .path.display())]
    JsonLine {
        /// The data file.
        path: PathBuf,
        /// 1-based line number.
        line: usize,
        /// serde_json's reason.
        #[source]
        source: serde_json::Error,
    },
    /// A configuration value (tags, sizes, limits) is unusable.
    #[error("invalid configuration: {0}")]
    Config(String),
    /// `step` was called on an episode that already ended.
    #[error("episode of sample {0} is already finished")]
    EpisodeFinished(SampleId),
    /// An environment's own code failed for one episode: a user-defined environment
    /// (a Python class) raised, returned something unusable, or ran past its
    /// timeout. Only that episode's branch ends, with this recorded; the run goes on.
    #[error("environment failed: {0}")]
    EpisodeFailed(String),
}

impl EnvError {
    /// Whether the error is one episode's failure (its branch ends, the run goes on)
    /// rather than misuse that stops the run.
    pub fn is_episode_failure(&self) -> bool {
        matches!(self, EnvError::EpisodeFailed(_))
    }
}

/// A tool's own failure. The environment turns it into observation text: the
/// message and its causes (see [`crate::env::run_tool`]).
#[derive(Debug, thiserror::Error)]
pub enum ToolError {
    /// The input (query, expression) was rejected; the message says why.
    #[error("invalid input: {0}")]
    InvalidInput(String),
    /// The calculator's expression does not evaluate (its error is the source).
    #[error("invalid input")]
    Calc(#[from] super::calc_eval::CalcError),
    /// The tool failed for its own reasons (backend down, ...), told by its message.
    #[error("{0}")]
    Failed(String),
    /// The task a tool ran its work on panicked or was cancelled.
    #[error("the {tool} task failed")]
    Task {
        /// The tool's name (`"search"`, ...).
        tool: &'static str,
        /// tokio's join error (a panic or a cancellation).
        #[source]
        source: tokio::task::JoinError,
    },
}
