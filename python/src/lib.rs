//! `treegrpo._treegrpo`: the compiled half of the Python package `treegrpo` (the
//! pure-Python half, `python/treegrpo/`, adds the rollout wrapper and the trainer
//! adapters).
//!
//! - `engine`: `Engine` (generate, agenerate, sessions, weights, stats) and
//!   `Generation`; `session`: `Session`; `tokenizer`: `Tokenizer`.
//! - `rollout`: tree rollouts over a built-in task or a Python environment (`env`).
//! - `update`: one policy-gradient update into a checkpoint; `trainer`: `Trainer`,
//!   the training loop (rollouts → update → weight swap, step after step).
//! - `state_dict`: `Engine.load_state_dict`'s tensors, read from torch or numpy
//!   memory.
//! - `runtime`: the tokio runtime and the GIL-free, Ctrl-C-aware wait;
//!   `awaitable`: engine work as an asyncio future.
//! - `errors`: the library's errors as Python exceptions; `convert`, `sampling`:
//!   arguments in, results out.

mod awaitable;
mod convert;
mod engine;
mod env;
mod errors;
mod rollout;
mod runtime;
mod sampling;
mod session;
mod state_dict;
mod tokenizer;
mod trainer;
mod update;

use pyo3::prelude::*;

#[pymodule]
fn _treegrpo(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<engine::PyEngine>()?;
    m.add_class::<engine::PyGeneration>()?;
    m.add_class::<session::Session>()?;
    m.add_class::<tokenizer::Tokenizer>()?;
    m.add_class::<trainer::Trainer>()?;
    m.add_function(wrap_pyfunction!(rollout::rollout, m)?)?;
    m.add_function(wrap_pyfunction!(update::update, m)?)?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
