//! `treegrpo.rollout`: tree (or chain) rollouts on the engine over a built-in task or
//! a Python environment, returned in the export schema of `treegrpo rollout --out`
//! (`trajectories` as the lines of `trajectories.jsonl`, `forests` as those of
//! `forest.jsonl`, and the `summary`).

use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use pyo3::prelude::*;
use pyo3::types::{PyList, PyString};
use treegrpo::advantage::AdvantageMode;
use treegrpo::env::{EnvConfig, Environment, QaSample, Split, Task, TaskData};
use treegrpo::rollout::{
    run_rollout, Interrupt, Progress, RolloutRequest, RolloutResult, RunHooks, RunOptions,
    Selection, TreeConfig, TreeOptions,
};

use crate::convert;
use crate::engine::PyEngine;
use crate::env::{sample_for, PyEnvironment};
use crate::errors::{env_error, rollout_error, value_error};
use crate::runtime::{runtime, wait_stopping};

pub(crate) fn parse<T: FromStr>(what: &str, s: &str) -> PyResult<T>
where
    T::Err: std::fmt::Display,
{
    T::from_str(s).map_err(|e| value_error(format!("{what}: {e}")))
}

/// The search's shape and sampling, checked by the library's own rule
/// (`TreeConfig::validate`: the CLI's and the server's words).
#[allow(clippy::too_many_arguments)]
pub(crate) fn tree_config(
    trees: usize,
    expand: usize,
    rounds: usize,
    keep: Option<usize>,
    select: &str,
    chains: Option<usize>,
    seed: u64,
    max_step_tokens: usize,
    temperature: f64,
    branch_sampling: Option<&str>,
) -> PyResult<TreeConfig> {
    TreeOptions {
        trees,
        expand,
        rounds,
        keep,
        chains,
        selection: parse::<Selection>("select", select)?,
        temperature: crate::sampling::narrow("temperature", temperature)?,
        max_step_tokens,
        seed,
        branch_sampling: branch_sampling.map(str::to_string),
    }
    .config()
    .map_err(|e| value_error(e.to_string()))
}

/// A set of samples a call names: `Given` as Python passed it (a list of sample
/// dicts, or an int N for N samples of `split` of a built-in task, from the one at
/// `offset`: the set's first prompt's index in a larger run), or `Default`, the first
/// N of `split` (a built-in task's data; nothing for a Python environment).
pub(crate) enum SampleSet<'a, 'py> {
    Given {
        samples: &'a Bound<'py, PyAny>,
        split: Split,
        offset: usize,
    },
    Default(Split, usize),
}

/// An environment and the samples of each set asked for, in order.
type EnvAndSets = (Arc<dyn Environment>, Vec<Vec<QaSample>>);

/// The environment and its sample sets: a built-in task by name, or a Python class or
/// factory (whose samples must be lists; every set's samples are its episodes').
pub(crate) fn environment(
    env: &Bound<'_, PyAny>,
    sets: &[SampleSet<'_, '_>],
    max_turns: usize,
    env_timeout: f64,
    event_loop: Option<&Bound<'_, PyAny>>,
) -> PyResult<EnvAndSets> {
    if let Ok(name) = env.cast::<PyString>() {
        let task = parse::<Task>("env", &name.to_cow()?)?;
        let data = TaskData::Embedded;
        let cfg = EnvConfig {
            max_turns,
            ..EnvConfig::default()
        };
        let environment = task.environment(&data, cfg).map_err(env_error)?;
        let mut out = Vec::with_capacity(sets.len());
        for set in sets {
            out.push(match *set {
                SampleSet::Default(split, n) => task.split(&data, split, n).map_err(env_error)?,
                SampleSet::Given {
                    samples,
                    split,
                    offset,
                } => match samples.extract::<usize>() {
                    Ok(n) => {
                        let mut all = task.split(&data, split, offset + n).map_err(env_error)?;
                        if all.len() < offset + n {
                            return Err(value_error(format!(
                                "samples {offset}..{} asked for, but the task's {split:?} \
                                 split has {} samples",
                                offset + n,
                                all.len()
                            )));
                        }
                        all.split_off(offset)
                    }
                    Err(_) => task_samples(samples)?,
                },
            });
        }
        return Ok((environment, out));
    }
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
    let mut objects = Vec::new();
    let mut out = Vec::with_capacity(sets.len());
    for set in sets {
        let mut qa = Vec::new();
        if let SampleSet::Given {
            samples, offset, ..
        } = *set
        {
            let list = samples.cast::<PyList>().map_err(|_| {
                value_error(
                    "a Python environment's samples must be a list (there is no data set \
                     to count from)",
                )
            })?;
            for (k, s) in list.iter().enumerate() {
                qa.push(sample_for(objects.len(), offset + k, &s));
                objects.push(s.unbind());
            }
        }
        out.push(qa);
    }
    let environment = PyEnvironment::new(
        env,
        objects,
        max_turns,
        Duration::from_secs_f64(env_timeout),
        event_loop.clone().unbind(),
    )?;
    Ok((Arc::new(environment), out))
}

/// A built-in task's samples given as dicts (`{"id", "question", "golden_answers"}`).
fn task_samples(samples: &Bound<'_, PyAny>) -> PyResult<Vec<QaSample>> {
    let list = samples
        .cast::<PyList>()
        .map_err(|_| value_error("samples must be an int or a list of sample dicts"))?;
    list.iter()
        .enumerate()
        .map(|(i, s)| {
            serde_json::from_value(convert::from_python(&s)?).map_err(|e| {
                value_error(format!(
                    "sample {i}: not a task sample ({{\"id\", \"question\", \"golden_answers\"}}): {e}"
                ))
            })
        })
        .collect()
}

/// Runs the rollout; the low-level half of `treegrpo.rollout` (the Python wrapper
/// supplies the event loop a Python environment's coroutines run on).
#[pyfunction]
#[pyo3(signature = (
    engine, env, samples, *, trees=2, expand=2, rounds=1, keep=None, select="paper",
    chains=None, seed=0, advantage=None, max_turns=3, max_step_tokens=256, temperature=1.0,
    branch_sampling=None, token_budget=None, max_concurrent_prompts=16, env_timeout=30.0, prompt_offset=0,
    event_loop=None, progress=None
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
    branch_sampling: Option<&str>,
    token_budget: Option<u64>,
    max_concurrent_prompts: usize,
    env_timeout: f64,
    prompt_offset: usize,
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
        branch_sampling,
    )?;
    let advantage = match advantage {
        Some(a) => parse::<AdvantageMode>("advantage", a)?,
        None => config.default_advantage(),
    };
    let (environment, mut sets) = environment(
        env,
        &[SampleSet::Given {
            samples,
            split: Split::Train,
            offset: prompt_offset,
        }],
        max_turns,
        env_timeout,
        event_loop,
    )?;
    let samples = sets.remove(0);
    if samples.is_empty() {
        return Err(value_error("samples is empty"));
    }
    let options = RunOptions {
        advantage,
        token_budget,
        max_concurrent_prompts,
        prompt_offset,
    };
    let request = RolloutRequest {
        env: environment,
        samples,
        config,
        options,
    };
    let result = run_interruptibly(py, engine, request, progress)?;
    convert::to_python(
        py,
        &serde_json::json!({
            "summary": result.summary,
            "trajectories": result.records,
            "forests": result.trees,
        }),
    )
}

/// Runs `request` on the engine, reporting to `progress` (if given) after each
/// finished prompt. Ctrl-C stops the run (keeping its finished forests, freeing
/// the rest), then the interrupt is raised.
fn run_interruptibly(
    py: Python<'_>,
    engine: &PyEngine,
    request: RolloutRequest,
    progress: Option<&Bound<'_, PyAny>>,
) -> PyResult<RolloutResult> {
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
    let task = runtime().spawn(run_rollout(engine.engine.clone(), request, hooks));
    let (result, interrupted) = wait_stopping(py, task, move || {
        let _ = stop.send(());
    })?;
    if let Some(signal) = interrupted {
        return Err(signal);
    }
    result.map_err(rollout_error)
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
