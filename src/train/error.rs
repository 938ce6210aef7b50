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
    /// A line of a trajectories file the update cannot train on.
    #[error("{path}, line {line}: {message}")]
    BadInput {
        path: PathBuf,
        /// 1-based line number (0: the file as a whole).
        line: usize,
        message: String,
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
