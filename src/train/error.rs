//! The train layer's error type.

use std::path::PathBuf;

use crate::model::ModelError;

#[derive(Debug, thiserror::Error)]
pub enum TrainError {
    #[error(transparent)]
    Model(#[from] ModelError),
    #[error("tensor op failed")]
    Tensor(#[from] candle_core::Error),
    #[error(transparent)]
    Layout(#[from] super::layout::BadParent),
    /// A batch handed to the decoder that it cannot compute (a caller's bug or bad
    /// data that got past the input checks).
    #[error("bad training batch: {0}")]
    BadBatch(String),
    /// A line of a trajectories file the update cannot train on, or a checkpoint
    /// file that lacks what it should hold (`message` says what is wrong).
    #[error("{path}, line {line}: {message}")]
    BadInput {
        path: PathBuf,
        /// 1-based line number (0: the file as a whole).
        line: usize,
        message: String,
    },
    /// A line of a JSONL file (or a whole JSON file) that is not `what` it should be;
    /// serde's reason is the source.
    #[error("{}: not {what}", place(path, *line))]
    Json {
        path: PathBuf,
        /// 1-based line number (0: the file as a whole).
        line: usize,
        what: &'static str,
        #[source]
        source: serde_json::Error,
    },
    /// A checkpoint's safetensors file that candle cannot read.
    #[error("{}: not a readable safetensors file", path.display())]
    Safetensors {
        path: PathBuf,
        #[source]
        source: candle_core::Error,
    },
    /// The cause is the `source` (printed once by a chain-printing caller).
    #[error("{}", .0.display())]
    Io(PathBuf, #[source] std::io::Error),
    /// Trainer weights are served dense; a quantised format was asked for.
    #[error("trainer weights are served dense (f32, bf16 or f16), not {0:?}")]
    UnservableFormat(crate::model::kernels::WeightFormat),
    /// A gradient that is NaN or infinite: the update is not applied.
    #[error("the gradient of {name} is not finite")]
    NonFiniteGradient { name: String },
}

/// `path, line N`, or the path alone for the file as a whole (line 0).
fn place(path: &std::path::Path, line: usize) -> String {
    match line {
        0 => path.display().to_string(),
        n => format!("{}, line {n}", path.display()),
    }
}
