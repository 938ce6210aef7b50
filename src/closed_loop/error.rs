//! The closed loop's error type.

use std::path::PathBuf;

use crate::engine::EngineError;
use crate::env::EnvError;
use crate::rollout::RolloutError;
use crate::train::TrainError;

/// Errors of the closed loop (rollouts, advantages and updates in turn): a failure
/// of one of the layers it drives, shown as that layer's error, or a problem with the
/// run folder it writes and resumes from.
#[derive(Debug, thiserror::Error)]
pub enum LoopError {
    /// Collecting a step's rollouts failed.
    #[error(transparent)]
    Rollout(#[from] RolloutError),
    /// The policy update (or loading, saving a checkpoint) failed.
    #[error(transparent)]
    Train(#[from] TrainError),
    /// The inference engine failed (loading it, or swapping in the new weights).
    #[error(transparent)]
    Engine(#[from] EngineError),
    /// The run's settings cannot train ([`LoopConfig::check`](super::LoopConfig::check)).
    #[error(transparent)]
    Settings(#[from] super::config::LoopConfigError),
    /// The environment or its data could not be built.
    #[error(transparent)]
    Env(#[from] EnvError),
    /// The cause is the `source` (printed once by a chain-printing caller).
    #[error("{}", .0.display())]
    Io(PathBuf, #[source] std::io::Error),
    /// A fresh run asked to write where a run already is: its history is kept.
    #[error(
        "{} already holds a training run (its log.jsonl or checkpoint): resume it to \
         continue (treegrpo train --resume; Python: Trainer.resume()), or start over \
         explicitly (treegrpo train --overwrite; Python: overwrite=True)",
        .0.display()
    )]
    RunExists(PathBuf),
    /// A run folder that cannot be resumed (`message` says what it lacks).
    #[error("cannot resume from {path}: {message}")]
    Resume {
        /// The run folder (or the file in it) that was read.
        path: PathBuf,
        /// What it lacks or why it does not match the run.
        message: String,
    },
    /// A line of a run's `log.jsonl` that is not a step line.
    #[error("{}, line {line}: not a step line", .path.display())]
    LogLine {
        /// The `log.jsonl` file.
        path: PathBuf,
        /// 1-based line number.
        line: usize,
        /// serde_json's reason.
        #[source]
        source: serde_json::Error,
    },
    /// A checkpoint's `loop_state.json` that is not the loop's state.
    #[error("cannot resume from {}: not the loop's state", .path.display())]
    LoopState {
        /// The `loop_state.json` file.
        path: PathBuf,
        /// serde_json's reason.
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
        /// The record file.
        path: PathBuf,
        /// serde_json's reason.
        #[source]
        source: serde_json::Error,
    },
}
