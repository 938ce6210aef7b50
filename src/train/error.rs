//! The train layer's error type.

use std::path::PathBuf;

use crate::model::ModelError;

/// Errors of the train layer: bad input (a trajectories file, a checkpoint, a batch),
/// a tensor or model failure during the update, or an update refused because its
/// gradient is not finite.
#[derive(Debug, thiserror::Error)]
pub enum TrainError {
    /// Loading or building the model failed; shown as the model error itself.
    #[error(transparent)]
    Model(#[from] ModelError),
    /// A candle tensor operation of the forward, backward or optimizer step failed
    /// (a shape or device error); candle's error is the source.
    #[error("tensor op failed")]
    Tensor(#[from] candle_core::Error),
    /// A tree batch whose parent links do not point to earlier rows, so its
    /// attention layout cannot be built.
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
        /// The file at fault.
        path: PathBuf,
        /// 1-based line number (0: the file as a whole).
        line: usize,
        /// What is wrong with it.
        message: String,
    },
    /// A line of a JSONL file (or a whole JSON file) that is not `what` it should be;
    /// serde's reason is the source.
    #[error("{}: not {what}", place(path, *line))]
    Json {
        /// The file at fault.
        path: PathBuf,
        /// 1-based line number (0: the file as a whole).
        line: usize,
        /// What the text should have been (`"a trajectory record"`, `"a trainer
        /// state"`).
        what: &'static str,
        /// serde_json's reason.
        #[source]
        source: serde_json::Error,
    },
    /// A checkpoint's safetensors file that candle cannot read.
    #[error("{}: not a readable safetensors file", path.display())]
    Safetensors {
        /// The checkpoint file at fault.
        path: PathBuf,
        /// candle's error reading it.
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
    NonFiniteGradient {
        /// The first parameter whose gradient is not finite (a name like
        /// `model.layers.0.self_attn.q_proj.weight`).
        name: String,
    },
}

/// `path, line N`, or the path alone for the file as a whole (line 0).
fn place(path: &std::path::Path, line: usize) -> String {
    match line {
        0 => path.display().to_string(),
        n => format!("{}, line {n}", path.display()),
    }
}
