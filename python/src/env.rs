//! A Python environment as the library's `Environment`: a class (or factory) whose
//! instances are one episode each, with `reset(sample) -> messages` and
//! `step(action_text) -> (observation, done, reward)`, plain or `async def`.
//!
//! - Each episode's Python object lives in the library's `Episode` as its external
//!   state; a branch forked at a node continues from `copy.deepcopy` of the node's
//!   object (`ExternalState::fork`).
//! - Plain methods run on tokio's blocking threads and coroutines on the rollout's own
//!   asyncio loop (a thread of the Python wrapper's), so tools run concurrently with
//!   each other (whenever they release the GIL: I/O, sleeps) and with decoding.
//! - An exception, an unusable return value or a call past the timeout ends that
//!   episode's branch with the error recorded (`EnvError::EpisodeFailed`); the run
//!   goes on. A plain method past its timeout cannot be stopped: its thread is left
//!   to finish on its own, its result unused.
//! - An episode ends when `step` says done, or after `max_turns + 1` steps (the
//!   built-in tasks' limit: `max_turns` tool turns, then a last one); its reward is
//!   the one `step` returned last.

use std::time::Duration;

use async_trait::async_trait;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyString, PyTuple};
use treegrpo::env::{
    EnvConfig, EnvError, Environment, Episode, ExternalState, QaSample, RewardMetric, Score,
    ScoreDetails, StepOutcome,
};

use crate::convert;

/// The environment of one rollout call.
pub struct PyEnvironment {
    /// Called with no arguments for each episode's object.
    factory: Py<PyAny>,
    /// The call's samples, by index (`QaSample::metadata` holds the index).
    samples: Vec<Py<PyAny>>,
    name: String,
    config: EnvConfig,
    stop: Vec<String>,
    timeout: Duration,
    /// The asyncio loop `async def` methods run on.
    event_loop: Py<PyAny>,
}

/// One episode's Python object, and what `step` last said.
#[derive(Debug)]
pub struct PyEpisode {
    object: Option<Py<PyAny>>,
    reward: f64,
    /// Why the object is unusable (its deepcopy failed): the next step reports it.
    broken: Option<String>,
}

impl ExternalState for PyEpisode {
    fn fork(&self) -> Box<dyn ExternalState> {
        let copied = self.object.as_ref().map(|object| {
            Python::attach(|py| -> PyResult<Py<PyAny>> {
                let copy = py.import("copy")?;
                Ok(copy.call_method1("deepcopy", (object.bind(py),))?.unbind())
            })
        });
        let (object, broken) = match copied {
            Some(Ok(o)) => (Some(o), self.broken.clone()),
            Some(Err(e)) => (
                None,
                Some(format!("copy.deepcopy of the episode failed: {e}")),
            ),
            None => (None, self.broken.clone()),
        };
        Box::new(PyEpisode {
            object,
            reward: self.reward,
            broken,
        })
    }

    fn as_any(&self) -> &dyn std::any::Any {
        self
    }

    fn as_any_mut(&mut self) -> &mut dyn std::any::Any {
        self
    }
}

fn failed(what: &str, e: impl std::fmt::Display) -> EnvError {
    EnvError::EpisodeFailed(format!("{what}: {e}"))
}

impl PyEnvironment {
    /// `factory` and its optional class attribute `stop` (strings that end a step).
    pub fn new(
        factory: &Bound<'_, PyAny>,
        samples: Vec<Py<PyAny>>,
        max_turns: usize,
        timeout: Duration,
        event_loop: Py<PyAny>,
    ) -> PyResult<Self> {
        if !factory.is_callable() {
            return Err(crate::errors::value_error(
                "env must be a task name or a class (or factory) of episode objects",
            ));
        }
        let name = factory
            .getattr("__name__")
            .and_then(|n| n.extract::<String>())
            .unwrap_or_else(|_| "python".to_string());
        let stop = match factory.getattr("stop") {
            Ok(s) => crate::sampling::stop_strings(&s)?,
            Err(_) => Vec::new(),
        };
        Ok(PyEnvironment {
            factory: factory.clone().unbind(),
            samples,
            name,
            config: EnvConfig {
                max_turns,
                tool_timeout: timeout,
                ..EnvConfig::default()
            },
            stop,
            timeout,
            event_loop,
        })
    }

    /// Calls `call` under the GIL on a blocking thread; a coroutine it returns runs on
    /// the rollout's loop. Either way the result is `extract`ed, within the timeout.
    async fn call<T, C, X>(&self, what: &'static str, call: C, extract: X) -> Result<T, EnvError>
    where
        T: Send + 'static,
        C: for<'py> FnOnce(Python<'py>) -> PyResult<Bound<'py, PyAny>> + Send + 'static,
        X: for<'py> FnOnce(&Bound<'py, PyAny>) -> Result<T, String> + Send + 'static,
    {
        let event_loop = Python::attach(|py| self.event_loop.clone_ref(py));
        let timeout = self.timeout;
        let work = tokio::task::spawn_blocking(move || {
            Python::attach(|py| -> Result<T, EnvError> {
                let value = call(py).map_err(|e| failed(what, e))?;
                let value = await_if_coroutine(py, value, event_loop.bind(py), timeout)
                    .map_err(|e| failed(what, e))?;
                extract(&value).map_err(|e| failed(what, e))
            })
        });
        match tokio::time::timeout(timeout, work).await {
            Ok(Ok(result)) => result,
            Ok(Err(join)) => Err(failed(what, join)),
            Err(_) => Err(failed(
                what,
                format!(
                    "no answer within the {:.1} s timeout",
                    timeout.as_secs_f64()
                ),
            )),
        }
    }
}

/// A coroutine run to its end on `event_loop` (at most `timeout`; cancelled after),
/// anything else as it is.
fn await_if_coroutine<'py>(
    py: Python<'py>,
    value: Bound<'py, PyAny>,
    event_loop: &Bound<'py, PyAny>,
    timeout: Duration,
) -> PyResult<Bound<'py, PyAny>> {
    let inspect = py.import("inspect")?;
    if !inspect
        .call_method1("isawaitable", (&value,))?
        .extract::<bool>()?
    {
        return Ok(value);
    }
    let asyncio = py.import("asyncio")?;
    let coroutine = if inspect
        .call_method1("iscoroutine", (&value,))?
        .extract::<bool>()?
    {
        value
    } else {
        asyncio.call_method1("ensure_future", (&value,))?
    };
    let future = asyncio.call_method1("run_coroutine_threadsafe", (coroutine, event_loop))?;
    // `result` waits with the GIL released.
    let result = future.call_method1("result", (timeout.as_secs_f64(),));
    if result.is_err() {
        let _ = future.call_method0("cancel");
    }
    result
}

#[async_trait]
impl Environment for PyEnvironment {
    fn name(&self) -> &str {
        &self.name
    }

    fn config(&self) -> &EnvConfig {
        &self.config
    }

    fn stop_strings(&self) -> Vec<String> {
        self.stop.clone()
    }

    fn start(&self, sample: &QaSample) -> Result<Episode, EnvError> {
        let index = sample
            .metadata
            .as_ref()
            .and_then(|m| m.get("python_sample"))
            .and_then(serde_json::Value::as_u64)
            .ok_or_else(|| EnvError::Config("not a sample of this rollout".into()))?
            as usize;
        let (factory, py_sample) = Python::attach(|py| {
            (
                self.factory.clone_ref(py),
                self.samples[index].clone_ref(py),
            )
        });
        // `start` is synchronous; the rollout calls it from a runtime thread that may
        // block (a multi-threaded runtime's worker, handed over for the duration).
        let started = tokio::task::block_in_place(|| {
            tokio::runtime::Handle::current().block_on(self.call(
                "reset",
                move |py| {
                    let object = factory.bind(py).call0()?;
                    let messages = object.call_method1("reset", (py_sample.bind(py),))?;
                    Ok(PyTuple::new(py, [object, messages])?.into_any())
                },
                |pair| {
                    let object = pair.get_item(0).map_err(|e| e.to_string())?;
                    let messages = pair.get_item(1).map_err(|e| e.to_string())?;
                    let messages = convert::messages(&messages).map_err(|e| {
                        format!("reset() must return a list of {{'role', 'content'}} dicts: {e}")
                    })?;
                    Ok((object.unbind(), messages))
                },
            ))
        })?;
        let (object, messages) = started;
        let state = PyEpisode {
            object: Some(object),
            reward: 0.0,
            broken: None,
        };
        Ok(Episode::with_external_state(
            sample.clone(),
            messages,
            self.config.max_turns,
            Box::new(state),
        ))
    }

    async fn step(&self, episode: &mut Episode, step_text: &str) -> Result<StepOutcome, EnvError> {
        if episode.is_done() {
            return Err(EnvError::EpisodeFinished(episode.sample().id.clone()));
        }
        let state = episode
            .external_state::<PyEpisode>()
            .ok_or_else(|| EnvError::Config("not an episode of a Python environment".into()))?;
        if let Some(why) = &state.broken {
            return Err(EnvError::EpisodeFailed(why.clone()));
        }
        let object = Python::attach(|py| state.object.as_ref().map(|o| o.clone_ref(py)))
            .ok_or_else(|| EnvError::EpisodeFailed("the episode has no object".into()))?;
        let text = step_text.to_owned();
        let (observation, done, reward) = self
            .call(
                "step",
                move |py| {
                    object
                        .bind(py)
                        .call_method1("step", (PyString::new(py, &text),))
                },
                parse_step,
            )
            .await?;
        // The last allowed step ends the episode whatever the environment said.
        let done = done || episode.steps().len() + 1 > self.config.max_turns;
        if let Some(state) = episode.external_state_mut::<PyEpisode>() {
            state.reward = reward;
        }
        Ok(StepOutcome::external(episode, step_text, observation, done))
    }

    fn score(&self, episode: &Episode) -> Score {
        let reward = episode
            .external_state::<PyEpisode>()
            .map_or(0.0, |s| s.reward);
        let steps = episode.steps();
        Score {
            reward,
            details: ScoreDetails {
                answer: None,
                exact_match: false,
                f1: 0.0,
                metric: RewardMetric::Environment,
                well_formed: true,
                format_issue: None,
                steps: steps.len(),
                tool_calls: steps.iter().filter(|s| s.action.is_tool_call()).count(),
                tool_errors: 0,
                invalid_actions: 0,
            },
        }
    }
}

/// `(observation: str | None, done: bool, reward: float)`.
fn parse_step(value: &Bound<'_, PyAny>) -> Result<(Option<String>, bool, f64), String> {
    let shape = || {
        format!(
            "step() must return (observation: str | None, done: bool, reward: float), got {}",
            value.repr().map_or_else(|_| "?".into(), |r| r.to_string())
        )
    };
    let tuple = value.cast::<PyTuple>().map_err(|_| shape())?;
    if tuple.len() != 3 {
        return Err(shape());
    }
    let item = |i| tuple.get_item(i).map_err(|_| shape());
    let observation = item(0)?;
    let observation = if observation.is_none() {
        None
    } else {
        Some(observation.extract::<String>().map_err(|_| shape())?)
    };
    let done = item(1)?.extract::<bool>().map_err(|_| shape())?;
    let reward = item(2)?.extract::<f64>().map_err(|_| shape())?;
    if !reward.is_finite() {
        return Err(format!(
            "step() returned a reward that is not finite: {reward}"
        ));
    }
    Ok((observation, done, reward))
}

/// A Python sample as the rollout's `QaSample`: its `id` (a dict's `"id"`, else its
/// prompt's index in the run) and `question` when it has them; `metadata` points back
/// at the object (`index`, in the environment's list of sample objects).
pub fn sample_for(index: usize, prompt_index: usize, sample: &Bound<'_, PyAny>) -> QaSample {
    let dict = sample.cast::<PyDict>().ok();
    let field = |name: &str| {
        dict.and_then(|d| d.get_item(name).ok().flatten())
            .and_then(|v| v.str().ok().map(|s| s.to_string()))
    };
    let mut q = QaSample::new(
        field("id").unwrap_or_else(|| prompt_index.to_string()),
        field("question").unwrap_or_default(),
        Vec::new(),
    );
    q.metadata = Some(serde_json::json!({ "python_sample": index }));
    q
}
