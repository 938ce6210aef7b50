//! The training loop: each step samples rollouts (trees or chains) from the policy the
//! engine serves, scores them, makes one update, and swaps the updated weights into
//! the engine, so the next step samples from the new policy.
//!
//! What a step is made of depends only on the run's seed and the step number — its
//! prompts (the next `prompts_per_step` of the training split, cycling), its rollout
//! seed — and on the weights and optimiser state, which checkpoints keep exactly. So a
//! run resumed from the checkpoint of step `k` writes the same log lines from `k + 1`
//! on as the uninterrupted run (timings aside; `tests/train_loop_tests.rs`).
//!
//! The engine serves the policy after step `s` as weight version `b + s`, where `b` is
//! the version it served when the run started (0 for a fresh engine), dense in
//! `serve_format`; the log's `weight_version` is the version that sampled the step's
//! rollouts.

use std::ops::ControlFlow;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use serde::{Deserialize, Serialize};

use super::config::LoopConfig;
use super::error::LoopError;
use super::eval::{evaluate, Evaluation};
use super::events::{emit, wave_hooks, SharedEvents};
// The loop's events and stop signal are defined in `events`; callers name them here.
pub use super::events::{EventFn, LoopEvent, StopSignal};
use super::folder::{checkpoint_dir, prepare_fresh_folder, reference_dir, resumable};
use super::log::{LogFile, StepLog};
use super::record::{RunRecord, RunSource};
use super::samples::{train_sample, BoostedTokens};
use super::step_rollout::{step_allowance, step_rollouts, StepRequest, StepRollouts, WaveStart};
use crate::engine::{Engine, SeqRng};
use crate::env::{Environment, QaSample};
use crate::model::{LoadedModel, Model};
use crate::rollout::export::TrajectoryRecord;
use crate::train::{
    fill_reference_logprobs, restore_weights, save_checkpoint, CheckpointExtras, KlReference,
    Optimizer, Params, TrainSample, Update, UpdateMetrics,
};

/// What `loop_state.json` in a checkpoint records.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct LoopState {
    /// The last finished step (its update is in the checkpoint's weights).
    pub step: u64,
    /// Tokens the model computed in rollouts over every finished step (the log's
    /// `tokens.cumulative_computed` of `step`).
    pub cumulative_computed: u64,
    /// The engine's weight version when the run started: the policy after step `s` is
    /// served as version `base_version + s`.
    #[serde(default)]
    pub base_version: u64,
}

/// How a loop run ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LoopOutcome {
    /// Every step ran.
    Finished {
        /// The step the run ended at: `config.steps`.
        steps: u64,
    },
    /// Stopped by the [`StopSignal`] after `completed` steps.
    Interrupted {
        /// Steps finished and logged before the stop; the one in progress is lost.
        completed: u64,
    },
}

/// A training run: the engine serving the policy, the task, the trainer's weights and
/// optimiser, and where the run's files go.
pub struct TrainRun {
    /// The engine the rollouts sample from; each update's weights are swapped into it.
    pub engine: Engine,
    /// The model the engine started with (tokenizer and template for checkpoints).
    pub model: Arc<LoadedModel>,
    /// The task's environment: prompts, tools and rewards.
    pub env: Arc<dyn Environment>,
    /// The training split: each step's prompts are the next `prompts_per_step` of
    /// these, cycling.
    pub train: Vec<QaSample>,
    /// The test split the evaluations draw their prompts from.
    pub test: Vec<QaSample>,
    /// The trainer's f32 weights: the policy being trained.
    pub params: Params,
    /// The frozen start weights, with `KlReference::Start`.
    reference: Option<Params>,
    /// The optimiser and its state, saved with every checkpoint.
    pub optimizer: Optimizer,
    /// How the loop runs.
    pub config: LoopConfig,
    /// The run folder: `log.jsonl`, `checkpoint/`, plots.
    pub out: PathBuf,
    /// Where the run stands (0 steps on a fresh run).
    pub state: LoopState,
    /// Open once the run starts (fresh) or resumes.
    log: Option<LogFile>,
    /// Lines logged so far (resumed ones included).
    pub logged: Vec<StepLog>,
    /// The model the engine serves when it is `params` in f32: the update runs on it
    /// (one copy of the weights for serving and training).
    served: Mutex<Option<Arc<Model>>>,
    /// What `run.json` names besides the config; a fresh run writes its record when
    /// this is set.
    source: Option<RunSource>,
    /// A fresh run may replace a run already in `out` ([`Self::overwriting`]).
    overwrite: bool,
}

/// The seed of step `step`'s rollouts: a stream of its own per step.
fn step_seed(run_seed: u64, step: u64) -> u64 {
    SeqRng::from_parts(&[run_seed, step, 0x0074_7261_696e]).next_u64()
}

/// The prompts of step `step` (1-based): the next `n` of `train`, cycling.
fn step_samples(train: &[QaSample], step: u64, n: usize) -> Vec<QaSample> {
    let start = (step as usize - 1) * n;
    (0..n)
        .map(|i| train[(start + i) % train.len()].clone())
        .collect()
}

/// A rollout's leaves as update samples.
fn train_samples(records: &[TrajectoryRecord], boosted: BoostedTokens) -> Vec<TrainSample> {
    records
        .iter()
        .map(|r| train_sample(&r.trajectory, r.advantage, Some(boosted)))
        .collect()
}

impl TrainRun {
    /// A run writing into `out` (created). [`Self::run`] starts a fresh `log.jsonl`
    /// unless [`Self::resume`] has opened the existing one.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        engine: Engine,
        model: Arc<LoadedModel>,
        env: Arc<dyn Environment>,
        train: Vec<QaSample>,
        test: Vec<QaSample>,
        params: Params,
        optimizer: Optimizer,
        config: LoopConfig,
        out: PathBuf,
    ) -> Result<Self, LoopError> {
        config.check()?;
        if train.is_empty() {
            return Err(LoopError::Config(
                "training needs prompts: the training split is empty".into(),
            ));
        }
        std::fs::create_dir_all(&out).map_err(|e| LoopError::Io(out.clone(), e))?;
        let reference = match config.kl_reference {
            KlReference::Start => Some(params.frozen_copy()?),
            KlReference::Previous => None,
        };
        Ok(TrainRun {
            engine,
            model,
            env,
            train,
            test,
            params,
            reference,
            optimizer,
            config,
            state: LoopState {
                step: 0,
                cumulative_computed: 0,
                base_version: 0,
            },
            log: None,
            logged: Vec::new(),
            out,
            served: Mutex::new(None),
            source: None,
            overwrite: false,
        })
    }

    /// The run, recording where it started from: a fresh run writes `run.json`
    /// ([`RunRecord`]) into its folder as it starts.
    pub fn with_source(mut self, source: RunSource) -> Self {
        self.source = Some(source);
        self
    }

    /// Whether a fresh start may replace a run already in the folder (its log,
    /// checkpoints and reference weights are removed as it starts). Without it a
    /// fresh run refuses such a folder ([`LoopError::RunExists`]).
    pub fn overwriting(mut self, overwrite: bool) -> Self {
        self.overwrite = overwrite;
        self
    }

    /// The record of this run (`None` where no source was given).
    pub fn record(&self) -> Option<RunRecord> {
        let source = self.source.as_ref()?;
        Some(RunRecord::new(source, &self.config, &self.optimizer.config))
    }

    /// A resumed run keeps the KL reference its `run.json` records, whatever this
    /// invocation asked for: its reference weights (or their absence) are in the
    /// folder. Folders without a record keep the configured one.
    fn adopt_recorded_reference(&mut self) -> Result<(), LoopError> {
        let Some(record) = RunRecord::read_if_present(&self.out)? else {
            return Ok(());
        };
        self.config.kl_reference = record.kl_reference;
        self.reference = match record.kl_reference {
            // The values are restored from the folder's copy below.
            KlReference::Start => match self.reference.take() {
                Some(reference) => Some(reference),
                None => Some(self.params.frozen_copy()?),
            },
            KlReference::Previous => None,
        };
        Ok(())
    }

    /// Continues the run in `self.out` from its checkpoint: weights (bit for bit),
    /// optimiser state, step and token count; the log is cut back to the checkpoint's
    /// step, and the engine serves the checkpoint's policy under its step's version.
    pub async fn resume(mut self) -> Result<Self, LoopError> {
        let dir = checkpoint_dir(&self.out);
        let state_path = dir.join("loop_state.json");
        if !resumable(&self.out)? {
            return Err(LoopError::Resume {
                path: self.out.clone(),
                message: "no checkpoint with the loop's state yet (the run stopped before \
                          its first checkpoint): start it again"
                    .into(),
            });
        }
        let text = std::fs::read_to_string(&state_path)
            .map_err(|e| LoopError::Io(state_path.clone(), e))?;
        let state: LoopState =
            serde_json::from_str(&text).map_err(|source| LoopError::LoopState {
                path: state_path.clone(),
                source,
            })?;
        self.adopt_recorded_reference()?;
        restore_weights(&dir, &self.params)?;
        if let Some(reference) = &self.reference {
            let saved = reference_dir(&self.out);
            if !saved.join("model.safetensors").exists() {
                return Err(LoopError::Resume {
                    path: self.out.clone(),
                    message: "the run keeps no reference weights (it was started without \
                              a frozen KL reference)"
                        .into(),
                });
            }
            restore_weights(&saved, reference)?;
        }
        let mut optimizer =
            crate::train::load_optimizer(&dir, &self.params)?.ok_or_else(|| LoopError::Resume {
                path: dir.clone(),
                message: "the checkpoint has no optimiser state".into(),
            })?;
        // The flags of this invocation (learning rate, …) rule; the moments and the
        // step count are the checkpoint's.
        optimizer.config = self.optimizer.config;
        self.optimizer = optimizer;
        let (log, read) = LogFile::resume(&self.out, state.step)?;
        if let Some(line) = read.torn_line {
            eprintln!(
                "warning: {}: line {line} was cut short (a crash or a full disk); \
                 dropped, the run resumes from its checkpoint's step {}",
                self.out.join("log.jsonl").display(),
                state.step
            );
        }
        self.log = Some(log);
        self.logged = read.lines;
        self.state = state;
        if state.step > 0 {
            self.serve(state.step).await?;
        }
        Ok(self)
    }

    /// Swaps the trainer's current weights into the engine as the policy after `step`.
    async fn serve(&self, step: u64) -> Result<(), LoopError> {
        let model = Arc::new(self.params.to_model(self.config.serve_format)?);
        let version = self.state.base_version + step;
        self.engine.load_weights_as(model.clone(), version).await?;
        self.set_served(model);
        Ok(())
    }

    /// Tells the run which model the engine serves (the caller's swap, before the
    /// run starts); the next update runs on it if it holds `params`' values.
    pub fn set_served(&self, model: Arc<Model>) {
        *self.served.lock().unwrap_or_else(|p| p.into_inner()) = Some(model);
    }

    /// The greedy evaluation on the test prompts (`None`: the run evaluates none).
    async fn evaluate(&self) -> Result<Option<Evaluation>, LoopError> {
        let n = self.config.eval_prompts.min(self.test.len());
        if n == 0 {
            return Ok(None);
        }
        let max_step_tokens = self.config.tree.max_step_tokens;
        let e = evaluate(&self.engine, &self.env, &self.test[..n], max_step_tokens).await?;
        Ok(Some(e))
    }

    /// Whether to evaluate after `step`, which took the cumulative computed tokens
    /// from `before` to `after`.
    fn wants_eval(&self, step: u64, before: u64, after: u64) -> bool {
        let every = self.config.eval_every;
        let tokens = self.config.eval_every_tokens;
        step == self.config.steps
            || (every > 0 && step.is_multiple_of(every))
            || (tokens > 0 && after / tokens > before / tokens)
    }

    fn wants_checkpoint(&self, step: u64) -> bool {
        let every = self.config.checkpoint_every;
        step == self.config.steps || (every > 0 && step.is_multiple_of(every))
    }

    fn append(&mut self, line: StepLog) -> Result<(), LoopError> {
        self.log
            .as_mut()
            .expect("a run always has its log open")
            .append(&line)?;
        self.logged.push(line);
        Ok(())
    }

    fn checkpoint(&self) -> Result<PathBuf, LoopError> {
        let dir = checkpoint_dir(&self.out);
        let state = serde_json::to_value(self.state).expect("the loop state serialises");
        save_checkpoint(
            &dir,
            &self.params,
            CheckpointExtras {
                tokenizer: &self.model.tokenizer,
                chat_template: self.model.chat_template.as_ref(),
                optimizer: Some(&self.optimizer),
                loop_state: Some(&state),
            },
        )?;
        Ok(dir)
    }

    /// Runs steps until `config.steps` or the stop signal.
    pub async fn run(
        &mut self,
        stop: Arc<StopSignal>,
        on_event: EventFn,
    ) -> Result<LoopOutcome, LoopError> {
        if self.log.is_none() {
            prepare_fresh_folder(&self.out, self.overwrite)?;
            self.log = Some(LogFile::create_new(&self.out)?);
        }
        let events: SharedEvents = Arc::new(Mutex::new(on_event));
        if self.state.step == 0 && self.logged.is_empty() {
            if let ControlFlow::Break(outcome) = self.start_fresh(&stop, &events).await? {
                return Ok(outcome);
            }
        }
        while self.state.step < self.config.steps {
            let step = self.state.step + 1;
            if stop.is_raised() {
                return Ok(self.interrupted());
            }
            if let ControlFlow::Break(outcome) = self.run_step(step, &stop, &events).await? {
                return Ok(outcome);
            }
        }
        Ok(LoopOutcome::Finished {
            steps: self.state.step,
        })
    }

    /// The stop signal's outcome between steps or during one: the step in progress is
    /// lost, the finished ones stand.
    fn interrupted(&self) -> LoopOutcome {
        LoopOutcome::Interrupted {
            completed: self.state.step,
        }
    }

    /// A fresh run's start: its record, the engine's weight version as the base, the
    /// frozen reference's weights saved, the evaluation before training (if asked for)
    /// and the log's first line. Breaks with the outcome when stopped during it.
    async fn start_fresh(
        &mut self,
        stop: &StopSignal,
        events: &SharedEvents,
    ) -> Result<ControlFlow<LoopOutcome>, LoopError> {
        if let Some(record) = self.record() {
            record.write(&self.out)?;
        }
        self.state.base_version = self.engine.stats().await?.weight_version;
        if let Some(reference) = &self.reference {
            save_checkpoint(
                &reference_dir(&self.out),
                reference,
                CheckpointExtras {
                    tokenizer: &self.model.tokenizer,
                    chat_template: self.model.chat_template.as_ref(),
                    optimizer: None,
                    loop_state: None,
                },
            )?;
        }
        let eval = if self.config.eval_before {
            emit(events, LoopEvent::Evaluating { step: 0 });
            self.evaluate().await?
        } else {
            None
        };
        if stop.is_raised() {
            return Ok(ControlFlow::Break(LoopOutcome::Interrupted {
                completed: 0,
            }));
        }
        let line = StepLog::before_training(self.state.base_version, eval.as_ref());
        emit(events, LoopEvent::Step(&line));
        self.append(line)?;
        Ok(ControlFlow::Continue(()))
    }

    /// Step `step`: rollouts from the policy the engine serves, one update on them,
    /// the updated weights swapped in, then evaluation, log line and checkpoint as
    /// due. Breaks with the outcome when the stop signal loses the step.
    async fn run_step(
        &mut self,
        step: u64,
        stop: &Arc<StopSignal>,
        events: &SharedEvents,
    ) -> Result<ControlFlow<LoopOutcome>, LoopError> {
        let version = self.engine.stats().await?.weight_version;
        let t0 = Instant::now();
        let result = self.sample_rollouts(step, stop, events).await?;
        if result.interrupted || stop.is_raised() {
            return Ok(ControlFlow::Break(self.interrupted()));
        }
        let rollout_seconds = t0.elapsed().as_secs_f64();
        let metrics = self.update(step, &result, events)?;
        if stop.is_raised() {
            return Ok(ControlFlow::Break(self.interrupted()));
        }
        self.serve(step).await?;
        self.finish_step(step, version, &result, &metrics, rollout_seconds, events)
            .await?;
        Ok(ControlFlow::Continue(()))
    }

    /// Step `step`'s rollouts: its prompts under its own seed, within its share of
    /// the run's token budget (if any), each wave reporting to `events` and stopping
    /// on `stop`.
    async fn sample_rollouts(
        &self,
        step: u64,
        stop: &Arc<StopSignal>,
        events: &SharedEvents,
    ) -> Result<StepRollouts, LoopError> {
        let mut tree = self.config.tree.clone();
        tree.seed = step_seed(self.config.tree.seed, step);
        let samples = step_samples(&self.train, step, self.config.prompts_per_step);
        let request = StepRequest {
            engine: &self.engine,
            env: &self.env,
            samples,
            tree,
            advantage: self.config.advantage,
            concurrent_prompts: self.config.concurrent_prompts,
            budget: self
                .config
                .step_budget
                .map(|budget| step_allowance(budget, step, self.state.cumulative_computed)),
        };
        let mut hooks = |start: WaveStart| wave_hooks(step, start, events, stop);
        step_rollouts(request, &mut hooks).await
    }

    /// One update on the step's rollouts (after the frozen reference scored them, if
    /// kept), its progress reported to `events`; the metrics' time includes the
    /// reference's forward.
    fn update(
        &mut self,
        step: u64,
        result: &StepRollouts,
        events: &SharedEvents,
    ) -> Result<UpdateMetrics, LoopError> {
        let mut samples = train_samples(&result.records, self.config.boosted_tokens);
        let mut update_cfg = self.config.update;
        update_cfg.temperature = self.config.tree.sampling.logprob_temperature();
        let t_reference = Instant::now();
        if let Some(reference) = &self.reference {
            tokio::task::block_in_place(|| {
                fill_reference_logprobs(reference, &mut samples, &update_cfg)
            })?;
        }
        let reference_seconds = t_reference.elapsed().as_secs_f64();
        // Taken, not cloned: the weights change in the update, and the engine
        // holds the model until `serve` swaps the updated weights in.
        let served = self.served.lock().unwrap_or_else(|p| p.into_inner()).take();
        let mut metrics = {
            let (params, optimizer) = (&self.params, &mut self.optimizer);
            let mut on_progress = |progress| emit(events, LoopEvent::Update { step, progress });
            // The update is CPU work on this thread; the runtime's other workers
            // keep serving (nothing else runs during it).
            tokio::task::block_in_place(|| {
                Update::new(params, &samples, &update_cfg)
                    .serving(served.as_ref())
                    .reporting(&mut on_progress)
                    .step(optimizer)
            })?
        };
        drop(served);
        metrics.seconds += reference_seconds;
        Ok(metrics)
    }

    /// Ends step `step` once its weights are served: the evaluation if due, the loop's
    /// state moved on, the step's log line (`version` sampled its rollouts, in
    /// `rollout_seconds`), and the checkpoint if due.
    async fn finish_step(
        &mut self,
        step: u64,
        version: u64,
        result: &StepRollouts,
        metrics: &UpdateMetrics,
        rollout_seconds: f64,
        events: &SharedEvents,
    ) -> Result<(), LoopError> {
        let before = self.state.cumulative_computed;
        let after = before + result.computed;
        let eval = if self.wants_eval(step, before, after) {
            emit(events, LoopEvent::Evaluating { step });
            self.evaluate().await?
        } else {
            None
        };
        self.state = LoopState {
            step,
            cumulative_computed: after,
            ..self.state
        };
        let line = StepLog::after_step(
            step,
            version,
            result,
            metrics,
            self.state.cumulative_computed,
            rollout_seconds,
            eval.as_ref(),
        );
        emit(events, LoopEvent::Step(&line));
        self.append(line)?;
        if self.wants_checkpoint(step) {
            let dir = self.checkpoint()?;
            emit(events, LoopEvent::Checkpoint { step, dir: &dir });
        }
        Ok(())
    }
}
