//! `treegrpo.Trainer`: the training loop of `treegrpo train` driven from Python —
//! each step samples rollouts (trees or chains) from the policy the engine serves,
//! computes advantages, makes one update and swaps the new weights into the engine;
//! `log.jsonl`, `run.json` and checkpoints under `out_dir`, resumable (the library's
//! `TrainRun` and run records, as `treegrpo train` uses them).

use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;
use pyo3::types::PyDict;
use treegrpo::closed_loop::{
    LoopConfig, LoopError, LoopEvent, LoopOutcome, RunSource, StopSignal, TrainRun,
};
use treegrpo::env::{Environment, QaSample, Split};
use treegrpo::train::{Optimizer, Params};

use crate::convert;
use crate::engine::PyEngine;
use crate::errors::{engine_error, env_error, rollout_error, train_error, value_error};
use crate::rollout::{environment, parse, tree_config, SampleSet};
use crate::runtime::{runtime, wait_stopping};

fn loop_error(e: LoopError) -> PyErr {
    match e {
        LoopError::Rollout(e) => rollout_error(e),
        LoopError::Train(e) => train_error(e),
        LoopError::Engine(e) => engine_error(e),
        LoopError::Env(e) => env_error(e),
        LoopError::Config(m) => value_error(m),
        LoopError::Settings(e) => value_error(e.to_string()),
        // The folder holds a run: `resume()` it, or pass `overwrite=True`.
        e @ LoopError::RunExists(_) => {
            pyo3::exceptions::PyFileExistsError::new_err(crate::errors::error_chain(&e))
        }
        // The message and its causes (an I/O error names its path, then its cause).
        e => PyRuntimeError::new_err(crate::errors::error_chain(&e)),
    }
}

/// `base` with the settings Python names by strings, each parsed by the library's
/// rule: the advantage (absent: the one the search implies), the treatment of boosted
/// tokens, the served format and the KL reference (`start` keeps a frozen copy of the
/// starting weights in `out_dir/reference/`, read back by `resume`).
fn named_settings(
    base: LoopConfig,
    advantage: Option<&str>,
    boosted_tokens: &str,
    serve_format: &str,
    kl_reference: &str,
) -> PyResult<LoopConfig> {
    Ok(LoopConfig {
        advantage: match advantage {
            Some(a) => parse("advantage", a)?,
            None => base.advantage,
        },
        boosted_tokens: parse("boosted_tokens", boosted_tokens)?,
        serve_format: treegrpo::train::serving::served_format(serve_format).map_err(value_error)?,
        kl_reference: kl_reference.parse().map_err(value_error)?,
        ..base
    })
}

/// The environment with its training and test samples (`sets`: train, then test).
fn train_and_test(
    env: &Bound<'_, PyAny>,
    sets: &[SampleSet<'_, '_>; 2],
    max_turns: usize,
    env_timeout: f64,
    event_loop: Option<&Bound<'_, PyAny>>,
) -> PyResult<(Arc<dyn Environment>, Vec<QaSample>, Vec<QaSample>)> {
    let (env, mut samples) = environment(env, sets, max_turns, env_timeout, event_loop)?;
    let test = samples.pop().unwrap_or_default();
    let train = samples.pop().unwrap_or_default();
    Ok((env, train, test))
}

/// The samples a split takes: those given, or the task's own (the first `count`).
fn sample_set<'a, 'py>(
    given: Option<&'a Bound<'py, PyAny>>,
    split: Split,
    count: usize,
) -> SampleSet<'a, 'py> {
    match given {
        Some(samples) => SampleSet::Given {
            samples,
            split,
            offset: 0,
        },
        None => SampleSet::Default(split, count),
    }
}

/// f32 trainer weights from the model the engine loaded (seconds for 135M), with
/// the GIL released.
fn trainable(py: Python<'_>, model: &treegrpo::model::LoadedModel) -> PyResult<Params> {
    py.detach(|| Params::trainable(&model.model))
        .map_err(train_error)
}

/// A training run on an engine: its weights start from the engine's model file.
#[pyclass(module = "treegrpo._treegrpo", name = "Trainer", frozen)]
pub struct Trainer {
    /// `None` while `run` or `resume` has it.
    run: Mutex<Option<TrainRun>>,
}

impl Trainer {
    fn take(&self) -> PyResult<TrainRun> {
        self.run
            .lock()
            .map_err(|_| PyRuntimeError::new_err("trainer lock poisoned"))?
            .take()
            .ok_or_else(|| {
                PyRuntimeError::new_err(
                    "the trainer is running, or a failed resume consumed it (make a new Trainer)",
                )
            })
    }

    fn put(&self, run: TrainRun) {
        if let Ok(mut slot) = self.run.lock() {
            *slot = Some(run);
        }
    }
}

#[pymethods]
impl Trainer {
    #[new]
    #[pyo3(signature = (
        engine, env, out_dir, *, train=None, test=None, steps=4, prompts_per_step=8,
        trees=2, expand=2, rounds=1, keep=None, select="paper", chains=None, seed=0,
        advantage=None, max_turns=3, max_step_tokens=256, temperature=1.0,
        branch_sampling=None, boosted_tokens="corrected", concurrent_prompts=16, eval_every=0, eval_prompts=20, checkpoint_every=1,
        serve_format="f32", kl_reference="previous", env_timeout=30.0, event_loop=None,
        overwrite=false, **update_options
    ))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        engine: &PyEngine,
        env: &Bound<'_, PyAny>,
        out_dir: PathBuf,
        train: Option<&Bound<'_, PyAny>>,
        test: Option<&Bound<'_, PyAny>>,
        steps: u64,
        prompts_per_step: usize,
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
        boosted_tokens: &str,
        concurrent_prompts: usize,
        eval_every: u64,
        eval_prompts: usize,
        checkpoint_every: u64,
        serve_format: &str,
        kl_reference: &str,
        env_timeout: f64,
        event_loop: Option<&Bound<'_, PyAny>>,
        overwrite: bool,
        update_options: Option<&Bound<'_, PyDict>>,
    ) -> PyResult<Self> {
        let tree = tree_config(
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
        let (optimizer, update) = crate::update::configs(update_options)?;
        let named = named_settings(
            LoopConfig::new(tree, update),
            advantage,
            boosted_tokens,
            serve_format,
            kl_reference,
        )?;
        let sets = [
            sample_set(train, Split::Train, usize::MAX),
            sample_set(test, Split::Test, eval_prompts),
        ];
        let (env, train, test) = train_and_test(env, &sets, max_turns, env_timeout, event_loop)?;
        if eval_every > 0 && test.is_empty() {
            return Err(value_error("eval_every needs test samples"));
        }
        let config = LoopConfig {
            steps,
            prompts_per_step,
            concurrent_prompts,
            eval_every,
            eval_prompts,
            checkpoint_every,
            ..named
        };
        config.check().map_err(|e| value_error(e.to_string()))?;
        // Recorded in `out_dir/run.json` as the run starts (the KL reference a resume
        // keeps is read back from it).
        let source = RunSource {
            model: engine.model_path.clone(),
            task: None,
            warm_start: 0,
        };
        let engine = engine.engine.clone();
        let model = engine.model().clone();
        let params = trainable(py, &model)?;
        let run = TrainRun::new(
            engine,
            model,
            env,
            train,
            test,
            params,
            Optimizer::new(optimizer),
            config,
            out_dir,
        )
        .map_err(loop_error)?
        .with_source(source)
        .overwriting(overwrite);
        Ok(Trainer {
            run: Mutex::new(Some(run)),
        })
    }

    /// Continues from the last checkpoint under `out_dir` (weights, optimiser, step,
    /// token count); the log from there equals an uninterrupted run's.
    fn resume(&self, py: Python<'_>) -> PyResult<u64> {
        let run = self.take()?;
        let task = runtime().spawn(run.resume());
        let (resumed, interrupted) = wait_stopping(py, task, || {})?;
        // A failed resume consumed the run: the trainer must be made anew.
        let run = resumed.map_err(loop_error)?;
        let step = run.state.step;
        self.put(run);
        match interrupted {
            Some(signal) => Err(signal),
            None => Ok(step),
        }
    }

    /// Runs the remaining steps; returns every step's `log.jsonl` line as a dict.
    /// `progress(event)` is called with each step's line (and rollout / update
    /// progress). Ctrl-C stops at the next point that loses nothing (the log and the
    /// last checkpoint stay whole) and then raises `KeyboardInterrupt`.
    #[pyo3(signature = (progress=None))]
    fn run<'py>(
        &self,
        py: Python<'py>,
        progress: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let mut run = self.take()?;
        let stop = Arc::new(StopSignal::default());
        let callback = progress.map(|p| p.clone().unbind());
        let on_event = Box::new(move |e: LoopEvent<'_>| {
            if let Some(cb) = &callback {
                report(cb, &e);
            }
        });
        let signal = stop.clone();
        let task = runtime().spawn(async move {
            let outcome = run.run(signal, on_event).await;
            (run, outcome)
        });
        let ((run, outcome), interrupted) = wait_stopping(py, task, || stop.raise())?;
        let lines = convert::to_python(py, &run.logged)?;
        // Stopped or not, the run stays the trainer's: `run` again goes on from it.
        self.put(run);
        if let Some(signal) = interrupted {
            return Err(signal);
        }
        match outcome.map_err(loop_error)? {
            LoopOutcome::Finished { .. } | LoopOutcome::Interrupted { .. } => Ok(lines),
        }
    }

    /// Steps completed so far.
    #[getter]
    fn step(&self) -> PyResult<u64> {
        let guard = self
            .run
            .lock()
            .map_err(|_| PyRuntimeError::new_err("trainer lock poisoned"))?;
        Ok(guard.as_ref().map_or(0, |r| r.state.step))
    }

    /// The run's settings as the keywords resolved them, as JSON: the same document
    /// `treegrpo train --print-config` prints for its flags.
    #[getter]
    fn config(&self) -> PyResult<String> {
        let guard = self
            .run
            .lock()
            .map_err(|_| PyRuntimeError::new_err("trainer lock poisoned"))?;
        let run = guard
            .as_ref()
            .ok_or_else(|| PyRuntimeError::new_err("the trainer is running"))?;
        serde_json::to_string(&run.config).map_err(|e| PyRuntimeError::new_err(e.to_string()))
    }
}

/// One loop event as a dict for the user's callback (its exceptions are printed).
fn report(callback: &Py<PyAny>, e: &LoopEvent<'_>) {
    Python::attach(|py| {
        let call = || -> PyResult<()> {
            let d = PyDict::new(py);
            match e {
                LoopEvent::Rollout {
                    step,
                    wave,
                    progress,
                } => {
                    d.set_item("event", "rollout")?;
                    d.set_item("step", step)?;
                    d.set_item("wave", wave)?;
                    d.set_item("prompts_done", progress.prompts_done)?;
                    d.set_item("prompts", progress.prompts)?;
                }
                LoopEvent::Update { step, progress } => {
                    d.set_item("event", "update")?;
                    d.set_item("step", step)?;
                    d.set_item("micro_batches_done", progress.micro_batches_done)?;
                    d.set_item("micro_batches", progress.micro_batches)?;
                }
                LoopEvent::Evaluating { step } => {
                    d.set_item("event", "evaluating")?;
                    d.set_item("step", step)?;
                }
                LoopEvent::Step(line) => {
                    d.set_item("event", "step")?;
                    d.set_item("line", convert::to_python(py, line)?)?;
                }
                LoopEvent::Checkpoint { step, dir } => {
                    d.set_item("event", "checkpoint")?;
                    d.set_item("step", step)?;
                    d.set_item("dir", dir.to_path_buf())?;
                }
            }
            callback.bind(py).call1((d,))?;
            Ok(())
        };
        if let Err(err) = call() {
            err.print(py);
        }
    });
}
