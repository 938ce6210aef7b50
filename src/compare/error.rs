//! The comparison's error type.

use std::path::PathBuf;

use crate::closed_loop::LoopError;
use crate::engine::EngineError;
use crate::env::EnvError;
use crate::model::ModelError;
use crate::train::TrainError;
use crate::view::plot::PlotError;

/// Errors of `treegrpo compare`: an arm that does not parse, a folder that holds
/// another comparison, or a failure of a layer the runs drive.
#[derive(Debug, thiserror::Error)]
pub enum CompareError {
    /// An arm name outside the grammar (see [`super::Arm`]).
    #[error(transparent)]
    Arm(#[from] ArmError),
    /// The plan asks for nothing (no arms, no seeds, no steps, no budget).
    #[error("{0}")]
    Plan(&'static str),
    /// The output folder holds a comparison planned otherwise: resuming it with other
    /// settings would mix two experiments.
    #[error(
        "{} holds a comparison with other settings ({field} differs); \
         use another --out or the same flags",
        .path.display()
    )]
    PlanChanged {
        /// The folder's `compare.json`.
        path: PathBuf,
        /// The first setting that differs.
        field: String,
    },
    /// A file of the comparison could not be read or written.
    #[error("{}", .0.display())]
    Io(PathBuf, #[source] std::io::Error),
    /// A JSON file of the comparison does not read.
    #[error("{}: not the comparison's JSON", .0.display())]
    Json(PathBuf, #[source] serde_json::Error),
    /// A training run (or the warm-start) failed.
    #[error(transparent)]
    Loop(#[from] LoopError),
    /// Loading the model failed.
    #[error(transparent)]
    Model(#[from] ModelError),
    /// Starting the engine failed.
    #[error(transparent)]
    Engine(#[from] EngineError),
    /// The task's data could not be read.
    #[error(transparent)]
    Env(#[from] EnvError),
    /// Preparing trainer weights failed.
    #[error(transparent)]
    Train(#[from] TrainError),
    /// The plot could not be drawn.
    #[error(transparent)]
    Plot(#[from] PlotError),
}

/// An arm name that does not parse.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum ArmError {
    /// Not `tree…` or `chain…`.
    #[error(
        "unknown arm '{0}': arms are tree[-inter|-intra|-2norm][-M-N-L][-entropy][-b<spec>|-treerl][-mask] or chain[-G]"
    )]
    Unknown(String),
    /// A `-b<spec>` suffix whose branch sampling spec does not read.
    #[error("arm '{arm}': {source}")]
    BranchSampling {
        /// The arm's name.
        arm: String,
        /// Why the spec is refused.
        source: crate::rollout::BranchSamplingError,
    },
    /// A chain arm with a branch sampling or boosted-token suffix (chains have no
    /// branches).
    #[error("arm '{0}': chains have no branches, so no branch sampling (-b…, -treerl, -mask)")]
    ChainBranches(String),
    /// A shape part that is not a positive number.
    #[error("arm '{0}': the shape must be positive numbers (tree-M-N-L, chain-G)")]
    Shape(String),
    /// The same arm twice.
    #[error("arm '{0}' is listed twice")]
    Twice(String),
}
