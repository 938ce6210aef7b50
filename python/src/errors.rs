//! The library's errors as Python exceptions, each carrying the library's message:
//! `ValueError` for what the caller gave (bad ids, an empty prompt, a bad option or
//! file), `FileNotFoundError` / `OSError` for files, `RuntimeError` for failures of
//! the engine itself. No error crosses into Python as a panic. Each message is the
//! error's whole chain ([`error_chain`]): a library error keeps its cause as its
//! `source`, not in its own message.

use pyo3::exceptions::{PyFileNotFoundError, PyOSError, PyRuntimeError, PyValueError};
use pyo3::PyErr;
use treegrpo::engine::EngineError;
use treegrpo::env::EnvError;
use treegrpo::model::ModelError;
use treegrpo::rollout::RolloutError;
use treegrpo::train::TrainError;

/// A caller's bad input.
pub fn value_error(message: impl Into<String>) -> PyErr {
    PyValueError::new_err(message.into())
}

fn io_error(e: &std::io::Error, message: String) -> PyErr {
    if e.kind() == std::io::ErrorKind::NotFound {
        PyFileNotFoundError::new_err(message)
    } else {
        PyOSError::new_err(message)
    }
}

pub fn model_error(e: ModelError) -> PyErr {
    let message = error_chain(&e);
    match &e {
        ModelError::Io { source, .. } => io_error(source, message),
        ModelError::CorruptGguf { .. }
        | ModelError::GgufTensor { .. }
        | ModelError::UnsupportedArchitecture { .. }
        | ModelError::Config { .. }
        | ModelError::ConfigJson { .. }
        | ModelError::Safetensors { .. }
        | ModelError::Rope { .. }
        | ModelError::MissingTensor { .. }
        | ModelError::ShapeMismatch { .. }
        | ModelError::MissingTokenizer { .. }
        | ModelError::TokenizerFile { .. }
        | ModelError::Tokenizer { .. }
        | ModelError::TokenOutOfVocab { .. }
        | ModelError::EmptyEncoding
        | ModelError::Template(_)
        | ModelError::NoChatTemplate { .. }
        | ModelError::ContextOverflow { .. }
        | ModelError::UnusableTensor { .. } => PyValueError::new_err(message),
        _ => PyRuntimeError::new_err(message),
    }
}

pub fn engine_error(e: EngineError) -> PyErr {
    match e {
        EngineError::Model(m) => model_error(m),
        e @ (EngineError::EmptyPrompt
        | EngineError::BadToken { .. }
        | EngineError::UnknownSequence(_)
        | EngineError::Busy(_)
        | EngineError::EmptySequence(_)
        | EngineError::Sampling(_)
        | EngineError::NeverFits { .. }
        | EngineError::WeightShape { .. }
        | EngineError::StaleWeightVersion { .. }) => PyValueError::new_err(error_chain(&e)),
        e => PyRuntimeError::new_err(error_chain(&e)),
    }
}

pub fn env_error(e: EnvError) -> PyErr {
    let message = error_chain(&e);
    match &e {
        EnvError::Io { source, .. } => io_error(source, message),
        EnvError::BadRecord { .. } | EnvError::JsonLine { .. } | EnvError::Config(_) => {
            PyValueError::new_err(message)
        }
        _ => PyRuntimeError::new_err(message),
    }
}

pub fn rollout_error(e: RolloutError) -> PyErr {
    match e {
        RolloutError::Engine(e) => engine_error(e),
        RolloutError::Env(e) => env_error(e),
        RolloutError::Model(e) => model_error(e),
        RolloutError::Io(path, e) => io_error(&e, format!("{}: {e}", path.display())),
        e @ (RolloutError::Advantage(_)
        | RolloutError::ForestLine { .. }
        | RolloutError::Config(_)) => PyValueError::new_err(error_chain(&e)),
        e => PyRuntimeError::new_err(error_chain(&e)),
    }
}

pub fn train_error(e: TrainError) -> PyErr {
    match e {
        TrainError::Model(e) => model_error(e),
        TrainError::Io(path, e) => io_error(&e, format!("{}: {e}", path.display())),
        e @ (TrainError::BadInput { .. }
        | TrainError::Json { .. }
        | TrainError::Safetensors { .. }
        | TrainError::BadBatch(_)) => PyValueError::new_err(error_chain(&e)),
        e => PyRuntimeError::new_err(error_chain(&e)),
    }
}

/// The error's message followed by its causes (an engine failure's message alone,
/// "forward failed", would hide what failed): the library's one rule.
pub use treegrpo::error_chain;
