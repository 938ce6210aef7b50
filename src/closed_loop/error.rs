//! The closed loop's error type.

use std::path::PathBuf;

use crate::engine::EngineError;
use crate::env::EnvError;
use crate::rollout::RolloutError;
use crate::train::TrainError;

#[derive(Debug, thiserror::Error)]
pub enum LoopError {
    #[error(transparent)]
    Rollout(#[from] RolloutError),
    #[error(transparent)]
    Train(#[from] TrainError),
    #[error(transparent)]
    Engine(#[from] EngineError),
    #[error(transparent)]
    Env(#[from] EnvError),
    /// The cause is the `source` (printed once by a chain-printing caller).
    #[error("{}", .0.display())]
    Io(PathBuf, #[source] std::io::Error),
    /// A run folder that cannot be resumed (`message` says what it lacks).
    #[error("cannot resume from {path}: {message}")]
    Resume { path: PathBuf, message: String },
    /// A line of a run's `log.jsonl` that is not a step line.
    #[error("{}, line {line}: not a step line", .path.display())]
    LogLine {
        path: PathBuf,
        /// 1-based line number.
        line: usize,
        #[source]
        source: serde_json::Error,
    },
    /// A checkpoint's `loop_state.json` that is not the loop's state.
    #[error("cannot resume from {}: not the loop's state", .path.display())]
    LoopState {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
    /// A setting the loop cannot run with.
    #[error("{0}")]
    Config(String),
    /// A run folder without the run record a resume reads (`run.json`).
    #[error("{} is missing: not a training run's folder", .0.display())]
    RecordMissing(PathBuf),
    /// A run record (`run.json`, `warm_start.json`) that is not the record's JSON.
    #[error("{}: not a valid run record", .path.display())]
    Record {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
}
