//! The tokio runtime every Python call runs its engine work on, and the one way a
//! blocking Python call waits for that work: with the GIL released, checking for
//! Ctrl-C every few milliseconds. On Ctrl-C the work is dropped (its `OwnedSeq`s
//! release their sequences) and `KeyboardInterrupt` is raised; the engine goes on.
//! Work that has a stopping point of its own (a rollout, a training run) is told to
//! stop instead, waited for, and then the interrupt is raised ([`wait_stopping`]).

use std::future::Future;
use std::sync::OnceLock;
use std::time::Duration;

use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;
use tokio::runtime::Runtime;
use tokio::task::JoinHandle;

/// How often a waiting call looks for a pending Ctrl-C.
const SIGNAL_POLL: Duration = Duration::from_millis(50);

static RUNTIME: OnceLock<Runtime> = OnceLock::new();

/// The process's runtime: environments' tools and rollouts' branches are its tasks
/// (the engine itself runs on a thread of its own).
pub fn runtime() -> &'static Runtime {
    RUNTIME.get_or_init(|| {
        tokio::runtime::Builder::new_multi_thread()
            .thread_name("treegrpo-py")
            .enable_all()
            .build()
            .expect("cannot start the tokio runtime")
    })
}

/// Runs `work` to its end with the GIL released. Ctrl-C (any exception from the
/// signal handlers) aborts it and is raised.
pub fn wait<T, F>(py: Python<'_>, work: F) -> PyResult<T>
where
    T: Send + 'static,
    F: Future<Output = PyResult<T>> + Send + 'static,
{
    let mut task = runtime().spawn(work);
    loop {
        let polled = py.detach(|| {
            // The timer is made inside the runtime: tokio's timers need its context.
            runtime().block_on(async { tokio::time::timeout(SIGNAL_POLL, &mut task).await })
        });
        match polled {
            Ok(Ok(result)) => return result,
            Ok(Err(join)) => {
                return Err(PyRuntimeError::new_err(format!(
                    "treegrpo engine work failed: {join}"
                )))
            }
            Err(_still_running) => {
                if let Err(signal) = py.check_signals() {
                    task.abort();
                    return Err(signal);
                }
            }
        }
    }
}

/// Waits for `task` with the GIL released. On Ctrl-C, `stop` is called once (the work
/// winds down at its next safe point) and the task is still waited for; its result
/// comes back with the interrupt, for the caller to raise once it has put its state
/// back in order.
pub fn wait_stopping<T: Send + 'static>(
    py: Python<'_>,
    mut task: JoinHandle<T>,
    stop: impl FnOnce(),
) -> PyResult<(T, Option<PyErr>)> {
    let mut stop = Some(stop);
    let mut interrupted = None;
    loop {
        let polled = py.detach(|| {
            runtime().block_on(async { tokio::time::timeout(SIGNAL_POLL, &mut task).await })
        });
        match polled {
            Ok(joined) => {
                let value = joined.map_err(|e| {
                    PyRuntimeError::new_err(format!("treegrpo engine work failed: {e}"))
                })?;
                return Ok((value, interrupted));
            }
            Err(_still_running) => {
                if interrupted.is_none() {
                    if let Err(signal) = py.check_signals() {
                        if let Some(stop) = stop.take() {
                            stop();
                        }
                        interrupted = Some(signal);
                    }
                }
            }
        }
    }
}
