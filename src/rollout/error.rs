//! The rollout layer's error type.

use std::path::PathBuf;

use crate::advantage::AdvantageError;
use crate::engine::EngineError;
use crate::env::EnvError;
use crate::model::ModelError;

#[derive(Debug, thiserror::Error)]
pub enum RolloutError {
    #[error(transparent)]
    Engine(#[from] EngineError),
    #[error(transparent)]
    Env(#[from] EnvError),
    #[error(transparent)]
    Model(#[from] ModelError),
    /// The search's options, refused before it starts.
    #[error(transparent)]
    Config(#[from] super::config::TreeConfigError),
    #[error("advantages: {0}")]
    Advantage(#[from] AdvantageError),
    /// A file of the run's output; the cause is the `source` (printed once by a
    /// chain-printing caller: `path: cause`).
    #[error("{}", .0.display())]
    Io(PathBuf, #[source] std::io::Error),
    #[error("a rollout task failed: {0}")]
    Task(String),
    /// A line of a forest file (`forest.jsonl`) that is not one JSON tree.
    #[error("{path}, line {line}: not a forest tree: {message}")]
    ForestLine {
        path: PathBuf,
        /// 1-based line number.
        line: usize,
        message: String,
    },
}
