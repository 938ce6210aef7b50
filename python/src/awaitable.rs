//! Engine work as an asyncio awaitable: the work runs on the tokio runtime and
//! resolves an `asyncio.Future` of the calling event loop through
//! `call_soon_threadsafe`, so `await` never blocks the loop and many coroutines'
//! calls run in the same engine batches. Cancelling the future aborts the work.

use std::future::Future;

use pyo3::prelude::*;
use tokio::task::AbortHandle;

use crate::runtime::runtime;

/// Spawns `work` and returns a future of the running event loop that resolves to
/// `convert(work's result)` (or raises its error). Must be called from a coroutine.
pub fn spawn_awaitable<'py, T, F, C>(
    py: Python<'py>,
    work: F,
    convert: C,
) -> PyResult<Bound<'py, PyAny>>
where
    T: Send + 'static,
    F: Future<Output = PyResult<T>> + Send + 'static,
    C: for<'a> FnOnce(Python<'a>, T) -> PyResult<Bound<'a, PyAny>> + Send + 'static,
{
    // Raises RuntimeError ("no running event loop") outside a coroutine.
    let event_loop = py.import("asyncio")?.call_method0("get_running_loop")?;
    let future = event_loop.call_method0("create_future")?;
    let loop_ref = event_loop.unbind();
    let future_ref = future.clone().unbind();
    let task = runtime().spawn(async move {
        let result = work.await;
        Python::attach(|py| {
            let (ok, value) = match result.and_then(|v| convert(py, v)) {
                Ok(v) => (true, v.unbind()),
                Err(e) => (false, e.into_value(py).into_any()),
            };
            let resolve = match wrap_pyfunction!(resolve_future, py) {
                Ok(f) => f,
                Err(e) => return e.print(py),
            };
            // A loop closed meanwhile has nobody left to tell.
            let _ = loop_ref.bind(py).call_method1(
                "call_soon_threadsafe",
                (resolve, future_ref.bind(py), ok, value),
            );
        });
    });
    let canceller = Canceller {
        task: task.abort_handle(),
    };
    future.call_method1("add_done_callback", (Py::new(py, canceller)?,))?;
    Ok(future)
}

/// Sets the future's result or exception unless it is already done (cancelled).
#[pyfunction]
fn resolve_future(future: &Bound<'_, PyAny>, ok: bool, value: &Bound<'_, PyAny>) -> PyResult<()> {
    if future.call_method0("done")?.extract::<bool>()? {
        return Ok(());
    }
    let method = if ok { "set_result" } else { "set_exception" };
    future.call_method1(method, (value,))?;
    Ok(())
}

/// The future's done-callback: a cancelled future aborts its work.
#[pyclass(module = "treegrpo._treegrpo", frozen)]
struct Canceller {
    task: AbortHandle,
}

#[pymethods]
impl Canceller {
    fn __call__(&self, future: &Bound<'_, PyAny>) -> PyResult<()> {
        if future.call_method0("cancelled")?.extract::<bool>()? {
            self.task.abort();
        }
        Ok(())
    }
}
