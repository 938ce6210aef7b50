//! The warm-start as a command runs it, one implementation for `treegrpo sft` and
//! `treegrpo train --warm-start`: the greedy eval reward before, supervised steps on
//! the oracle's demonstrations ([`super::sft::warm_start`]), the warm weights swapped
//! into the engine, the eval reward after (where asked), and the record of it all
//! ([`WarmStartRecord`]). Progress goes out as [`WarmStartEvent`]s for the caller to
//! show.

use std::path::Path;
use std::sync::Arc;

use super::error::LoopError;
use super::eval::{evaluate, Evaluation};
use super::record::{WarmStartRecord, SFT_SUMMARY_FILE, WARM_START_FILE};
use super::sft::{warm_start, SftConfig, SftStepLog, WarmStart};
use crate::engine::Engine;
use crate::env::{Environment, QaSample, Task};
use crate::model::kernels::WeightFormat;
use crate::model::{LoadedModel, Model};
use crate::train::{save_checkpoint, CheckpointExtras, Params};

/// How a warm-start runs.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct WarmStartConfig {
    /// The built-in task, for the record (`None`: an environment of the caller's).
    pub task: Option<Task>,
    /// AdamW's learning rate (no weight decay).
    pub lr: f64,
    /// The supervised steps: epochs, batch size, micro-batches, clipping, seed.
    pub sft: SftConfig,
    /// Most tokens per agent step in the evaluations.
    pub max_step_tokens: usize,
    /// Evaluate the warm weights too (a training run need not: its step 0 does).
    pub evaluate_after: bool,
    /// How the engine holds the warm weights.
    pub serve_format: WeightFormat,
}

/// What a warm-start works on.
pub struct WarmStartInputs<'a> {
    /// The model whose tokenizer and chat template render the demonstrations.
    pub model: &'a LoadedModel,
    /// Evaluates, and serves the warm weights; `None`: training only.
    pub engine: Option<&'a Engine>,
    /// The task's environment: its oracle demonstrates, its rewards score evaluations.
    pub env: &'a Arc<dyn Environment>,
    /// The questions the oracle demonstrates.
    pub demos: &'a [QaSample],
    /// Held-out questions of the evaluations (empty: none).
    pub test: &'a [QaSample],
    /// The weights trained, in place.
    pub params: &'a Params,
}

/// Before or after the warm-start.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EvalPoint {
    /// The model as it was, before any supervised step.
    Before,
    /// The warm weights, after the last supervised step.
    After,
}

/// Something a warm-start reports while it runs (for progress displays).
#[derive(Debug)]
pub enum WarmStartEvent<'a> {
    /// An evaluation on `prompts` test questions starts.
    Evaluating {
        /// Whether the weights evaluated are the start's or the warm ones.
        point: EvalPoint,
        /// Test questions evaluated, one greedy chain each.
        prompts: usize,
    },
    /// It finished.
    Evaluated {
        /// Which weights were evaluated.
        point: EvalPoint,
        /// The mean reward, prompts, seconds and each question's reward.
        evaluation: Evaluation,
    },
    /// A supervised step finished, of `total` in `epochs` epochs.
    Step {
        /// The finished step's figures.
        line: &'a SftStepLog,
        /// Epochs the warm-start runs.
        epochs: usize,
        /// Optimiser steps the whole warm-start takes, over every epoch.
        total: usize,
    },
    /// The training is done (the warm weights are not yet served).
    Trained(&'a WarmStart),
}

/// A finished warm-start.
#[derive(Debug)]
pub struct WarmStarted {
    /// What the warm-start did, as written to `warm_start.json` or `sft_summary.json`.
    pub record: WarmStartRecord,
    /// Its steps (`sft_log.jsonl`).
    pub steps: Vec<SftStepLog>,
    /// The warm weights as the engine now serves them (`None` without an engine): a
    /// training run's first update runs on this model
    /// ([`super::TrainRun::set_served`]).
    pub served: Option<Arc<Model>>,
}

/// Optimiser steps of a warm-start on `demos` questions.
fn total_steps(demos: usize, cfg: &SftConfig) -> usize {
    demos.div_ceil(cfg.batch_size.max(1)) * cfg.epochs
}

/// The greedy mean reward on `test`, reported as `point` (`None`: nothing to do).
async fn evaluate_at(
    point: EvalPoint,
    inputs: &WarmStartInputs<'_>,
    max_step_tokens: usize,
    on_event: &mut (dyn FnMut(WarmStartEvent<'_>) + Send),
) -> Result<Option<f64>, LoopError> {
    let Some(engine) = inputs.engine.filter(|_| !inputs.test.is_empty()) else {
        return Ok(None);
    };
    on_event(WarmStartEvent::Evaluating {
        point,
        prompts: inputs.test.len(),
    });
    let evaluation = evaluate(engine, inputs.env, inputs.test, max_step_tokens).await?;
    let mean_reward = evaluation.mean_reward;
    on_event(WarmStartEvent::Evaluated { point, evaluation });
    Ok(Some(mean_reward))
}

/// Runs the warm-start: evaluates the model as it is, trains `inputs.params` on the
/// oracle's demonstrations of `inputs.demos`, swaps the warm weights into the engine
/// and evaluates them if asked. The training is CPU work done in place: call it on a
/// multi-thread tokio runtime.
pub async fn run_warm_start(
    inputs: WarmStartInputs<'_>,
    cfg: &WarmStartConfig,
    on_event: &mut (dyn FnMut(WarmStartEvent<'_>) + Send),
) -> Result<WarmStarted, LoopError> {
    let before = evaluate_at(EvalPoint::Before, &inputs, cfg.max_step_tokens, on_event).await?;
    let (epochs, total) = (cfg.sft.epochs, total_steps(inputs.demos.len(), &cfg.sft));
    let ws = warm_start(
        inputs.model,
        inputs.env.as_ref(),
        inputs.demos,
        inputs.params,
        cfg.lr,
        &cfg.sft,
        &mut |line| {
            on_event(WarmStartEvent::Step {
                line,
                epochs,
                total,
            })
        },
    )
    .await?;
    on_event(WarmStartEvent::Trained(&ws));
    let served = match inputs.engine {
        Some(engine) => {
            let model = Arc::new(inputs.params.to_model(cfg.serve_format)?);
            engine.load_weights(model.clone()).await?;
            Some(model)
        }
        None => None,
    };
    let after = if cfg.evaluate_after {
        evaluate_at(EvalPoint::After, &inputs, cfg.max_step_tokens, on_event).await?
    } else {
        None
    };
    let steps = &ws.steps;
    let record = WarmStartRecord {
        task: cfg.task,
        demonstrations: ws.demonstrations,
        demonstration_reward: ws.demonstration_reward,
        model_tokens: ws.model_tokens,
        epochs,
        lr: cfg.lr,
        steps: steps.len(),
        first_nll: steps.first().map(|l| l.nll),
        last_nll: steps.last().map(|l| l.nll),
        seconds: steps.iter().map(|l| l.seconds).sum(),
        eval_prompts: if before.is_some() {
            inputs.test.len()
        } else {
            0
        },
        eval_reward_before: before,
        eval_reward_after: after,
    };
    Ok(WarmStarted {
        record,
        steps: ws.steps,
        served,
    })
}

impl WarmStarted {
    /// Writes `warm_start.json` and `sft_log.jsonl` into run folder `dir`.
    pub fn write_to_run(&self, dir: &Path) -> Result<(), LoopError> {
        self.record.write(dir, WARM_START_FILE, &self.steps)
    }

    /// `treegrpo sft`'s output: the warm weights `params` as an HF checkpoint in
    /// `dir` (with `model`'s tokenizer and chat template), `sft_summary.json` and
    /// `sft_log.jsonl` in it.
    pub fn save_checkpoint(
        &self,
        dir: &Path,
        params: &Params,
        model: &LoadedModel,
    ) -> Result<(), LoopError> {
        save_checkpoint(
            dir,
            params,
            CheckpointExtras {
                tokenizer: &model.tokenizer,
                chat_template: model.chat_template.as_ref(),
                optimizer: None,
                loop_state: None,
            },
        )?;
        // After the checkpoint: its save swaps a whole new folder in.
        self.record.write(dir, SFT_SUMMARY_FILE, &self.steps)
    }
}
