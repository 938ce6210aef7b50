//! Runs a comparison: one warm-start shared by every arm, then each arm × seed as a
//! training run of its own folder, resumed where an earlier invocation stopped, then
//! the summary, the plot and the report.
//!
//! Every run loads the same warm-start checkpoint, so every arm starts from the same
//! weights, bit for bit; each run writes the hash of the weights it started from
//! (`start.json`) so that this can be checked, not assumed. The runs' step prompts are
//! the training split's in order, the same for every arm; the step budget makes every
//! arm compute the same tokens per step.

use std::path::Path;
use std::sync::{Arc, Mutex};

use super::arm::Arm;
use super::error::CompareError;
use super::plan::{run_dir, warm_start_dir, ComparePlan};
use super::report::write_outputs;
use super::start::{weights_hash, StartRecord, START_FILE};
use super::summary::Summary;
use crate::closed_loop::{
    evaluate, read_log, run_warm_start, EventFn, LoopConfig, LoopEvent, LoopOutcome, RunSource,
    RunStart, SftConfig, StopSignal, TrainRun, WarmStartConfig, WarmStartEvent, WarmStartInputs,
};
use crate::engine::{Engine, EngineConfig};
use crate::env::{Environment, QaSample, Split, TaskData};
use crate::model::kernels::WeightFormat;
use crate::model::LoadedModel;
use crate::rollout::TreeOptions;
use crate::train::{save_checkpoint, CheckpointExtras, KlReference, Optimizer, Params};

/// Something the comparison reports while it runs.
#[derive(Debug)]
pub enum CompareEvent<'a> {
    /// The shared warm-start's progress.
    WarmStart(WarmStartEvent<'a>),
    /// The start weights are evaluated (no warm-start asked, or its record is missing).
    EvaluatingStart,
    /// The folder's warm-start is reused (a resumed comparison).
    WarmStartReused {
        /// Its eval reward.
        eval_reward: Option<f64>,
    },
    /// Run `index` of `total` starts (`resumed_after`: the step it continues after).
    RunStarting {
        /// The arm.
        arm: &'a str,
        /// The seed index.
        seed: usize,
        /// Its place among the plan's runs (0-based) and their number.
        index: usize,
        /// The plan's runs.
        total: usize,
        /// 0 for a fresh run.
        resumed_after: u64,
    },
    /// A run already finished by an earlier invocation.
    RunDone {
        /// The arm.
        arm: &'a str,
        /// The seed index.
        seed: usize,
    },
    /// An event of the run in progress.
    Loop(LoopEvent<'a>),
}

/// How a comparison ended.
#[derive(Debug)]
pub enum CompareOutcome {
    /// Every run finished; the summary was written.
    Finished(Box<Summary>),
    /// Stopped by the signal; rerun the same command to continue.
    Interrupted,
}

/// What every run of the comparison reads: the task's environment and splits.
struct TaskInputs {
    env: Arc<dyn Environment>,
    demos: Vec<QaSample>,
    train: Vec<QaSample>,
    test: Vec<QaSample>,
}

fn task_inputs(plan: &ComparePlan) -> Result<TaskInputs, CompareError> {
    let data = TaskData::from_option(plan.data.clone());
    let (env, mut train) = plan.task.setup(&data, plan.turns, usize::MAX)?;
    let demos: Vec<QaSample> = train.drain(..plan.warm_start.min(train.len())).collect();
    let test = plan.task.split(&data, Split::Test, plan.eval_prompts)?;
    Ok(TaskInputs {
        env,
        demos,
        train,
        test,
    })
}

fn engine_for(model: Arc<LoadedModel>, kv_budget_bytes: usize) -> Result<Engine, CompareError> {
    Ok(Engine::start(
        model,
        EngineConfig {
            kv_budget_bytes,
            reuse_cached_first: true,
            ..EngineConfig::default()
        },
    )?)
}

/// Makes (or reuses) the shared warm-start in `out/warm-start/`.
async fn shared_start(
    plan: &ComparePlan,
    out: &Path,
    inputs: &TaskInputs,
    kv_budget_bytes: usize,
    on_event: &SharedEvents,
) -> Result<StartRecord, CompareError> {
    let dir = warm_start_dir(out);
    if dir.join(START_FILE).exists() {
        let record = StartRecord::read(&dir)?;
        emit(
            on_event,
            CompareEvent::WarmStartReused {
                eval_reward: record.eval_reward,
            },
        );
        return Ok(record);
    }
    let model_path =
        crate::model::fetch::model_path_or_default(plan.model.as_deref(), &mut |_| {})?;
    let model = Arc::new(LoadedModel::load(&model_path)?);
    let engine = engine_for(model.clone(), kv_budget_bytes)?;
    let params = Params::trainable(&model.model)?;
    let eval_reward = if plan.warm_start > 0 {
        let cfg = WarmStartConfig {
            task: Some(plan.task),
            lr: plan.warm_start_lr,
            sft: SftConfig {
                epochs: plan.warm_start_epochs,
                seed: plan.seed,
                ..SftConfig::default()
            },
            max_step_tokens: plan.max_step_tokens,
            evaluate_after: true,
            serve_format: WeightFormat::F32,
        };
        let warm_inputs = WarmStartInputs {
            model: &model,
            engine: Some(&engine),
            env: &inputs.env,
            demos: &inputs.demos,
            // The eval before the warm-start is not part of the comparison.
            test: &inputs.test,
            params: &params,
        };
        let warm = run_warm_start(warm_inputs, &cfg, &mut |e| {
            emit(on_event, CompareEvent::WarmStart(e))
        })
        .await?;
        warm.save_checkpoint(&dir, &params, &model)?;
        warm.record.eval_reward_after
    } else {
        emit(on_event, CompareEvent::EvaluatingStart);
        let e = evaluate(&engine, &inputs.env, &inputs.test, plan.max_step_tokens).await?;
        save_checkpoint(
            &dir,
            &params,
            CheckpointExtras {
                tokenizer: &model.tokenizer,
                chat_template: model.chat_template.as_ref(),
                optimizer: None,
                loop_state: None,
            },
        )?;
        Some(e.mean_reward)
    };
    let record = StartRecord {
        weights_fnv1a64: weights_hash(&params)?,
        eval_reward,
    };
    // Last: its presence says the folder's warm-start is whole.
    record.write(&dir)?;
    Ok(record)
}

/// The loop settings of `arm`'s seed `k`.
fn loop_config(plan: &ComparePlan, arm: &Arm, k: usize) -> Result<LoopConfig, CompareError> {
    let shape = arm.shape;
    let tree = TreeOptions {
        trees: shape.trees,
        expand: shape.expand,
        rounds: shape.rounds,
        keep: None,
        chains: shape.is_chains().then_some(shape.trees),
        selection: shape.selection,
        temperature: plan.temperature,
        max_step_tokens: plan.max_step_tokens,
        seed: plan.seed + k as u64,
        branch_sampling: arm.branch_sampling.map(|b| b.to_string()),
    }
    .config()
    .map_err(|e| CompareError::Loop(crate::rollout::RolloutError::from(e).into()))?;
    Ok(LoopConfig {
        steps: plan.steps,
        prompts_per_step: plan.prompts_per_step,
        advantage: arm.advantage,
        concurrent_prompts: plan.concurrent_prompts,
        eval_every: 0,
        eval_prompts: plan.eval_prompts,
        checkpoint_every: 1,
        serve_format: WeightFormat::F32,
        kl_reference: KlReference::Previous,
        step_budget: Some(plan.step_budget),
        eval_every_tokens: plan.eval_every_tokens,
        // The shared start's evaluation is every run's first point.
        eval_before: false,
        boosted_tokens: arm.boosted_tokens,
        ..LoopConfig::new(tree, plan.update)
    })
}

/// Whether the run in `dir` has logged its last step.
fn finished(dir: &Path, steps: u64) -> Result<bool, CompareError> {
    let log = dir.join("log.jsonl");
    if !log.exists() {
        return Ok(false);
    }
    Ok(read_log(&log)?.last().map(|l| l.step) == Some(steps))
}

/// Runs `arm`'s seed `k` to its end (or the stop signal), fresh or resumed.
#[allow(clippy::too_many_arguments)]
async fn run_one(
    plan: &ComparePlan,
    out: &Path,
    arm: &Arm,
    k: usize,
    (index, total): (usize, usize),
    kv_budget_bytes: usize,
    stop: Arc<StopSignal>,
    on_event: &SharedEvents,
) -> Result<LoopOutcome, CompareError> {
    let dir = run_dir(out, arm, k);
    let warm = warm_start_dir(out);
    let resumable = crate::closed_loop::resumable(&dir)?;
    let start = if resumable {
        RunStart::resume(&dir, Some(warm.clone()))?
    } else {
        RunStart {
            model: Some(warm.clone()),
            warm_start: plan.warm_start,
            resumed: None,
        }
    };
    let model = Arc::new(LoadedModel::load(&warm)?);
    let inputs = task_inputs(plan)?;
    let engine = engine_for(model.clone(), kv_budget_bytes)?;
    let params = Params::trainable(&model.model)?;
    std::fs::create_dir_all(&dir).map_err(|e| CompareError::Io(dir.clone(), e))?;
    if !resumable {
        StartRecord {
            weights_fnv1a64: weights_hash(&params)?,
            eval_reward: None,
        }
        .write(&dir)?;
    }
    let config = loop_config(plan, arm, k)?;
    let source = RunSource {
        model: warm,
        task: Some(plan.task),
        warm_start: start.warm_start,
    };
    let mut run = TrainRun::new(
        engine,
        model,
        inputs.env,
        inputs.train,
        inputs.test,
        params,
        Optimizer::new(plan.optimizer),
        config,
        dir,
    )?
    // A run that stopped before its first checkpoint starts over: the comparison
    // owns the folder, and its plan (checked above) is the same.
    .with_source(source)
    .overwriting(!resumable);
    if resumable {
        run = run.resume().await?;
    }
    emit(
        on_event,
        CompareEvent::RunStarting {
            arm: arm.name(),
            seed: k,
            index,
            total,
            resumed_after: run.state.step,
        },
    );
    let shared = on_event.clone();
    let forward: EventFn = Box::new(move |e| emit(&shared, CompareEvent::Loop(e)));
    Ok(run.run(stop, forward).await?)
}

/// A callback for [`CompareEvent`]s; the runs call it from their tasks, hence `Send`.
pub type CompareEventFn = Box<dyn FnMut(CompareEvent<'_>) + Send>;

/// The callback, shared by the comparison and the run in progress.
type SharedEvents = Arc<Mutex<CompareEventFn>>;

fn emit(events: &SharedEvents, e: CompareEvent<'_>) {
    (events.lock().unwrap_or_else(|p| p.into_inner()))(e)
}

/// Runs the comparison `plan` in `out` (see the module doc): a folder that holds the
/// same plan is continued, one that holds another is refused.
pub async fn run_compare(
    plan: &ComparePlan,
    out: &Path,
    kv_budget_bytes: usize,
    stop: Arc<StopSignal>,
    on_event: CompareEventFn,
) -> Result<CompareOutcome, CompareError> {
    let on_event: &SharedEvents = &Arc::new(Mutex::new(on_event));
    plan.check()?;
    plan.adopt_folder(out)?;
    let inputs = task_inputs(plan)?;
    let start = shared_start(plan, out, &inputs, kv_budget_bytes, on_event).await?;
    drop(inputs);
    let runs = plan.runs();
    for (index, (arm, k)) in runs.iter().enumerate() {
        if stop.is_raised() {
            return Ok(CompareOutcome::Interrupted);
        }
        if finished(&run_dir(out, arm, *k), plan.steps)? {
            emit(
                on_event,
                CompareEvent::RunDone {
                    arm: arm.name(),
                    seed: *k,
                },
            );
            continue;
        }
        let at = (index, runs.len());
        let outcome = run_one(
            plan,
            out,
            arm,
            *k,
            at,
            kv_budget_bytes,
            stop.clone(),
            on_event,
        )
        .await?;
        if let LoopOutcome::Interrupted { .. } = outcome {
            return Ok(CompareOutcome::Interrupted);
        }
    }
    let summary = Summary::collect(plan, out, &start)?;
    write_outputs(plan, out, &summary)?;
    Ok(CompareOutcome::Finished(Box::new(summary)))
}
