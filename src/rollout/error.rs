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
    #[error("advantages")]
    Advantage(#[from] AdvantageError),
    /// A file of the run's output; the cause is the `source` (printed once by a
    /// chain-printing caller: `path: cause`).
    #[error("{}", .0.display())]
    Io(PathBuf, #[source] std::io::Error),
    /// A task of the rollout (a branch, a prompt's forest) panicked or was cancelled.
    #[error("a rollout task failed ({task})")]
    Task {
        task: &'static str,
        #[source]
        source: tokio::task::JoinError,
    },
    /// A branch was to fork a node whose KV snapshot is gone (a bug of the sampler's
    /// bookkeeping, reported instead of panicking).
    #[error("tree {tree}: node {node} has no snapshot to branch from")]
    NoSnapshot { tree: usize, node: usize },
    /// A line of a forest file (`forest.jsonl`) that is not one JSON tree.
    #[error("{path}, line {line}: not a forest tree")]
    ForestLine {
        path: PathBuf,
        /// 1-based line number.
        line: usize,
        #[source]
        source: LineJsonError,
    },
}

/// serde_json's error for one line of a JSONL file, parsed on its own: its message
/// without the "at line 1 column N" (always line 1 there), the column kept. serde's
/// error is inside, whole; its message is this one's, so it is not a second `source`.
#[derive(Debug)]
pub struct LineJsonError(pub serde_json::Error);

impl std::fmt::Display for LineJsonError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let text = self.0.to_string();
        let text = text
            .rfind(" at line ")
            .map_or(&text[..], |pos| &text[..pos]);
        f.write_str(text)?;
        if self.0.column() > 0 {
            write!(f, " (column {})", self.0.column())?;
        }
        Ok(())
    }
}

impl std::error::Error for LineJsonError {}
