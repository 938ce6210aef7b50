//! The rollout layer's error type.

use std::path::PathBuf;

use crate::advantage::AdvantageError;
use crate::engine::EngineError;
use crate::env::EnvError;
use crate::model::ModelError;

/// Errors of the rollout layer. What a branch's agent does (an invalid action, the
/// turn limit, a tool failure) is data in its trajectory, not an error; these are the
/// failures that stop a run: the engine, environment or model failing, options the
/// search refuses, or the run's output that cannot be written.
#[derive(Debug, thiserror::Error)]
pub enum RolloutError {
    /// The engine failed while a branch generated (its thread stopped, a sequence
    /// never fits the KV pool, a forward failed); shown as the engine error itself.
    #[error(transparent)]
    Engine(#[from] EngineError),
    /// The environment was misused or its data could not be loaded; shown as the
    /// environment error itself.
    #[error(transparent)]
    Env(#[from] EnvError),
    /// The model failed outside the engine (applying the chat template to a prompt,
    /// encoding an observation, decoding a turn); shown as the model error itself.
    #[error(transparent)]
    Model(#[from] ModelError),
    /// The search's options, refused before it starts.
    #[error(transparent)]
    Config(#[from] super::config::TreeConfigError),
    /// Computing the advantages of the finished forests failed (a leaf without a
    /// finite reward); the advantage error is the source.
    #[error("advantages")]
    Advantage(#[from] AdvantageError),
    /// A file of the run's output; the cause is the `source` (printed once by a
    /// chain-printing caller: `path: cause`).
    #[error("{}", .0.display())]
    Io(PathBuf, #[source] std::io::Error),
    /// A task of the rollout (a branch, a prompt's forest) panicked or was cancelled.
    #[error("a rollout task failed ({task})")]
    Task {
        /// Which task (`"branch"` or `"prompt"`).
        task: &'static str,
        /// tokio's join error (a panic or a cancellation).
        #[source]
        source: tokio::task::JoinError,
    },
    /// A branch was to fork a node whose KV snapshot is gone (a bug of the sampler's
    /// bookkeeping, reported instead of panicking).
    #[error("tree {tree}: node {node} has no snapshot to branch from")]
    NoSnapshot {
        /// The tree's index within its prompt's forest.
        tree: usize,
        /// The node's index within the tree.
        node: usize,
    },
    /// A line of a forest file (`forest.jsonl`) that is not one JSON tree.
    #[error("{path}, line {line}: not a forest tree")]
    ForestLine {
        /// The forest file.
        path: PathBuf,
        /// 1-based line number.
        line: usize,
        /// Why the line does not parse.
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
