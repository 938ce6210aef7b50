//! `treegrpo.rollout`: tree (or chain) rollouts on the engine over a built-in task or
//! a Python environment, returned in the export schema of `treegrpo rollout --out`
//! (`trajectories` as the lines of `trajectories.jsonl`, `forests` as those of
//! `forest.jsonl`, and the `summary`).

use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;
use pyo3::types::{PyList, PyString};
use treegrpo::advantage::AdvantageMode;
use treegrpo::engine::Sampling;
use treegrpo::env::{EnvConfig, Environment, QaSample, Task, TaskData};
use treegrpo::rollout::{
    run_rollout, Interrupt, Progress, RolloutRequest, RunHooks, RunOptions, Selection, TreeConfig,
    TreeShape,
};

use crate::convert;
use crate::engine::PyEngine;
use crate::env::{sample_for, PyEnvironment};
use crate::errors::{env_error, rollout_error, value_error};
use crate::runtime::runtime;

/// How often a waiting rollout looks for a pending Ctrl-C.
const SIGNAL_POLL: Duration = Duration::from_millis(50);

fn parse<T: FromStr>(what: &str, s: &str) -> PyResult<T>
where
    T::Err: std::fmt::Display,
{
    T::from_str(s).map_err(|e| value_error(format!("{what}: {e}")))
}

/// The search's shape and sampling, checked.
#[allow(clippy::too_many_arguments)]
fn tree_config(
    trees: usize,
    expand: usize,
    rounds: usize,
    keep: Option<usize>,
    select: &str,
    chains: Option<usize>,
    seed: u64,
    max_step_tokens: usize,
    temperature: f64,
) -> PyResult<TreeConfig> {
    if chains == Some(0) || (chains.is_none() && trees == 0) {
        return Err(value_error(
            "a rollout needs at least one tree (or chain) per prompt",
        ));
    }
    if keep == Some(0) {
        return Err(value_error(
            "keep must be at least 1 (or None for every leaf)",
        ));
    }
    if max_step_tokens == 0 {
        return Err(value_error("max_step_tokens must be at least 1"));
    }
    if !temperature.is_finite() || temperature < 0.0 {
        return Err(value_error("temperature must be a non-negative number"));
    }
    let shape = TreeShape {
        keep,
        ..TreeShape::tree(trees, expand, rounds, parse::<Selection>("select", select)?)
    };
    let mut config = TreeConfig::chains_or_tree(
        chains,
        shape,
        Sampling::from_temperature(Some(temperature as f32)),
        seed,
    );
    config.max_step_tokens = max_step_tokens;
    Ok(config)
}

/// The environment and its samples: a built-in task by name (samples: an int N for
/// its first N training samples, or sample dicts), or a Python class or factory.
fn environment(
    env: &Bound<'_, PyAny>,
    samples: &Bound<'_, PyAny>,
    max_turns: usize,
    env_timeout: f64,
    event_loop: Option<&Bound<'_, PyAny>>,
) -> PyResult<(Arc<dyn Environment>, Vec<QaSample>)> {
    if let Ok(name) = env.cast::<PyString>() {
        let task = parse::<Task>("env", &name.to_cow()?)?;
        let data = TaskData::Embedded;
        let cfg = EnvConfig {
            max_turns,
            ..EnvConfig::default()
        };
        let environment = task.environment(&data, cfg).map_err(env_error)?;
        let samples = if let Ok(n) = samples.extract::<usize>() {
            task.samples(&data, n).map_err(env_error)?
        } else {
            let list = samples
                .cast::<PyList>()
                .map_err(|_| value_error("samples must be an int or a list of sample dicts"))?;
            list.iter()
                .enumerate()
                .map(|(i, s)| {
                    serde_json::from_value(convert::from_python(&s)?).map_err(|e| {
                        value_error(format!(
                            "sample {i}: not a task sample ({{\"id\", \"question\", \
                             \"golden_answers\"}}): {e}"
                        ))
                    })
                })
                .collect::<PyResult<_>>()?
        };
        return Ok((environment, samples));
    }
    let list = samples.cast::<PyList>().map_err(|_| {
        value_error(
            "a Python environment's samples must be a list (there is no data set to count from)",
        )
    })?;
    let Some(event_loop) = event_loop else {
        return Err(value_error(
            "a Python environment needs the rollout's event loop",
        ));
    };
    if !env_timeout.is_finite() || env_timeout <= 0.0 {
        return Err(value_error(
            "env_timeout must be a positive number of seconds",
        ));
    }
    let qa: Vec<QaSample> = list
        .iter()
        .enumerate()
        .map(|(i, s)| sample_for(i, &s))
        .collect();
    let objects = list.iter().map(|s| s.unbind()).collect();
    let environment = PyEnvironment::new(
        env,
        objects,
        max_turns,
        Duration::from_secs_f64(env_timeout),
        event_loop.clone().unbind(),
    )?;
    Ok((Arc::new(environment), qa))
}

/// Runs the rollout; the low-level half of `treegrpo.rollout` (the Python wrapper
/// supplies the event loop a Python environment's coroutines run on).
#[pyfunction]
#[pyo3(signature = (
    engine, env, samples, *, trees=2, expand=2, rounds=1, keep=None, select="paper",
    chains=None, seed=0, advantage=None, max_turns=3, max_step_tokens=256, temperature=1.0,
    token_budget=None, max_concurrent_prompts=16, env_timeout=30.0, event_loop=None,
    progress=None
))]
#[allow(clippy::too_many_arguments)]
pub fn rollout<'py>(
    py: Python<'py>,
    engine: &PyEngine,
    env: &Bound<'py, PyAny>,
    samples: &Bound<'py, PyAny>,
    trees: usize,
    expand: usize,
    rounds: usize,
    keep: Option<usize>,
    select: &str,
    chains: Option<usize>,
    seed: u64,
    advantage: Option<&str>,
    max_turns: usize,
    max_step_tokens: usize,
    temperature: f64,
    token_budget: Option<u64>,
    max_concurrent_prompts: usize,
    env_timeout: f64,
    event_loop: Option<&Bound<'py, PyAny>>,
    progress: Option<&Bound<'py, PyAny>>,
) -> PyResult<Bound<'py, PyAny>> {
    let config = tree_config(
        trees,
        expand,
        rounds,
        keep,
        select,
        chains,
        seed,
        max_step_tokens,
        temperature,
    )?;
    let advantage = match advantage {
        Some(a) => parse::<AdvantageMode>("advantage", a)?,
        None => config.default_advantage(),
    };
    let (environment, samples) = environment(env, samples, max_turns, env_timeout, event_loop)?;
    if samples.is_empty() {
        return Err(value_error("samples is empty"));
    }
    let options = RunOptions {
        advantage,
        token_budget,
        max_concurrent_prompts,
    };
    let request = RolloutRequest {
        env: environment,
        samples,
        config,
        options,
    };
    let progress = progress.map(|p| p.clone().unbind());
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let interrupt: Interrupt = Box::pin(async move {
        // Dropped without a send: the run was not interrupted.
        if stopped.await.is_err() {
            std::future::pending::<()>().await;
        }
    });
    let hooks = RunHooks {
        output: None,
        progress: progress.map(|callback| {
            Box::new(move |p: Progress| report_progress(&callback, p))
                as treegrpo::rollout::ProgressFn
        }),
        interrupt: Some(interrupt),
    };
    let mut task = runtime().spawn(run_rollout(engine.engine.clone(), request, hooks));
    let mut stop = Some(stop);
    let mut interrupted = None;
    let result = loop {
        let polled = py.detach(|| {
            // The timer is made inside the runtime: tokio's timers need its context.
            runtime().block_on(async { tokio::time::timeout(SIGNAL_POLL, &mut task).await })
        });
        match polled {
            Ok(joined) => break joined,
            Err(_still_running) => {
                if interrupted.is_none() {
                    if let Err(signal) = py.check_signals() {
                        // Stop the run (it keeps its finished forests), then raise.
                        if let Some(stop) = stop.take() {
                            let _ = stop.send(());
                        }
                        interrupted = Some(signal);
                    }
                }
            }
        }
    };
    if let Some(signal) = interrupted {
        return Err(signal);
    }
    let result = result
        .map_err(|e| PyRuntimeError::new_err(format!("rollout task failed: {e}")))?
        .map_err(rollout_error)?;
    convert::to_python(
        py,
        &serde_json::json!({
            "summary": result.summary,
            "trajectories": result.records,
            "forests": result.trees,
        }),
    )
}

/// Calls the user's progress callback with a dict; its exceptions are printed, not
/// raised (they must not end the run).
fn report_progress(callback: &Py<PyAny>, p: Progress) {
    Python::attach(|py| {
        let call = || -> PyResult<()> {
            let d = pyo3::types::PyDict::new(py);
            d.set_item("prompts_done", p.prompts_done)?;
            d.set_item("prompts", p.prompts)?;
            d.set_item("rollouts", p.rollouts)?;
            d.set_item("computed_tokens", p.computed_tokens)?;
            d.set_item("seconds", p.seconds)?;
            callback.bind(py).call1((d,))?;
            Ok(())
        };
        if let Err(e) = call() {
            e.print(py);
        }
    });
}
