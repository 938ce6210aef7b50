//! The run records: `run.json`, what a training run was started with (read back when
//! it resumes), and the warm-start's record (`warm_start.json` in a run folder,
//! `sft_summary.json` in a `treegrpo sft` checkpoint) beside its `sft_log.jsonl`.
//!
//! Typed, so `treegrpo train`, `treegrpo sft` and the Python `Trainer` write and read
//! the same fields. The field names are those run folders have always had: a
//! `run.json` of an earlier build (no `kl_reference`, no `warm_start`) still reads,
//! with the defaults those builds ran with (`tests/run_record_tests.rs`).

use std::io::Write;
use std::path::{Path, PathBuf};

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use super::config::LoopConfig;
use super::error::LoopError;
use super::samples::BoostedTokens;
use super::sft::SftStepLog;
use crate::advantage::AdvantageMode;
use crate::env::Task;
use crate::rollout::TreeConfig;
use crate::train::{KlReference, OptimizerConfig, UpdateConfig};

/// A run folder's record of how the run was started.
pub const RUN_RECORD_FILE: &str = "run.json";
/// A run folder's record of its warm-start.
pub const WARM_START_FILE: &str = "warm_start.json";
/// A `treegrpo sft` checkpoint's record of its warm-start.
pub const SFT_SUMMARY_FILE: &str = "sft_summary.json";
/// The warm-start's steps, one JSON line each, beside its record.
pub const SFT_LOG_FILE: &str = "sft_log.jsonl";

/// What a run's record names that its loop settings do not: where it started from.
#[derive(Debug, Clone, PartialEq)]
pub struct RunSource {
    /// The model file or folder the run's weights started from.
    pub model: PathBuf,
    /// The built-in task (`None`: an environment of the caller's, a Python class say).
    pub task: Option<Task>,
    /// Training questions the warm-start demonstrated: the RL prompts start after them.
    pub warm_start: usize,
}

/// `run.json`: the settings a training run was started with. A resumed run takes its
/// model, its warm-start size and its KL reference from here; the rest records the
/// settings for whoever reads the folder later.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunRecord {
    /// The model the run's weights started from.
    pub model: PathBuf,
    /// The built-in task; `null` for an environment of the caller's.
    pub task: Option<Task>,
    /// Training questions the warm-start demonstrated (0 in records of builds before
    /// the warm-start: they had none).
    #[serde(default)]
    pub warm_start: usize,
    /// Steps the run was asked for.
    pub steps: u64,
    /// Training prompts each step's rollouts ran.
    pub prompts_per_step: usize,
    /// The search's shape and sampling (the run's seed included).
    pub config: TreeConfig,
    /// How the trajectories' advantages were computed.
    pub advantage: AdvantageMode,
    /// The update's settings: loss coefficients, clipping, packing, micro-batch size.
    pub update: UpdateConfig,
    /// The optimiser's learning rate (also in `optimizer`; kept for readers of older
    /// records).
    pub lr: f64,
    /// The optimiser the run trained with (kind, learning rate, betas, decay, warm-up).
    pub optimizer: OptimizerConfig,
    /// The KL term's reference (records of builds before the choice: the previous
    /// policy, all they knew).
    #[serde(default)]
    pub kl_reference: KlReference,
    /// Computed tokens each step's rollouts spent ([`LoopConfig::step_budget`]);
    /// absent for runs without a budget and in older records.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub step_budget: Option<u64>,
    /// What the update did with tokens drawn from the branch sampling (older
    /// records: corrected, the only treatment there was).
    #[serde(default)]
    pub boosted_tokens: BoostedTokens,
}

impl RunRecord {
    /// The record of a run from `source` with the loop's `config` and `optimizer`.
    pub fn new(source: &RunSource, config: &LoopConfig, optimizer: &OptimizerConfig) -> Self {
        RunRecord {
            model: source.model.clone(),
            task: source.task,
            warm_start: source.warm_start,
            steps: config.steps,
            prompts_per_step: config.prompts_per_step,
            config: config.tree.clone(),
            advantage: config.advantage,
            update: config.update,
            lr: optimizer.lr,
            optimizer: *optimizer,
            kl_reference: config.kl_reference,
            step_budget: config.step_budget,
            boosted_tokens: config.boosted_tokens,
        }
    }

    /// Where the recorded run started from.
    pub fn source(&self) -> RunSource {
        RunSource {
            model: self.model.clone(),
            task: self.task,
            warm_start: self.warm_start,
        }
    }

    /// The path of the record in run folder `dir`.
    pub fn path(dir: &Path) -> PathBuf {
        dir.join(RUN_RECORD_FILE)
    }

    /// The record of run folder `dir`: [`LoopError::RecordMissing`] where it has
    /// none, [`LoopError::Record`] where it is not a record's JSON.
    pub fn read(dir: &Path) -> Result<Self, LoopError> {
        let path = Self::path(dir);
        if !path.exists() {
            return Err(LoopError::RecordMissing(path));
        }
        read_json(&path)
    }

    /// The record of run folder `dir` if it has one (folders of runs started before
    /// records were written have none); a record that does not read is an error.
    pub fn read_if_present(dir: &Path) -> Result<Option<Self>, LoopError> {
        match Self::read(dir) {
            Ok(record) => Ok(Some(record)),
            Err(LoopError::RecordMissing(_)) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Writes the record into run folder `dir` (whole or not at all).
    pub fn write(&self, dir: &Path) -> Result<(), LoopError> {
        write_json(&Self::path(dir), self)
    }
}

/// What a warm-start did: `warm_start.json` in a run folder, `sft_summary.json` in a
/// `treegrpo sft` checkpoint.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WarmStartRecord {
    /// The built-in task (`null` for an environment of the caller's; absent from the
    /// `warm_start.json` of earlier builds, whose `run.json` names it).
    #[serde(default)]
    pub task: Option<Task>,
    /// Questions the oracle demonstrated.
    pub demonstrations: usize,
    /// The demonstrations' mean reward (1 where the oracle solves every question).
    pub demonstration_reward: f64,
    /// Model tokens trained on per epoch.
    pub model_tokens: usize,
    /// Passes over the demonstrations.
    pub epochs: usize,
    /// AdamW's learning rate.
    pub lr: f64,
    /// Optimiser steps taken.
    pub steps: usize,
    /// Mean negative log-likelihood before the first and the last step.
    pub first_nll: Option<f64>,
    /// The mean negative log-likelihood before the last step (`None`: no step ran).
    pub last_nll: Option<f64>,
    /// Seconds of training (the demonstrations and evaluations not included).
    pub seconds: f64,
    /// Test questions of the evaluations (0: none).
    #[serde(default)]
    pub eval_prompts: usize,
    /// Greedy mean reward on them before the warm-start and after it (a training run
    /// evaluates the warm weights as its step 0 in `log.jsonl` instead).
    pub eval_reward_before: Option<f64>,
    /// The greedy mean reward after the warm-start (`None`: not evaluated, or a
    /// record of an earlier build).
    #[serde(default)]
    pub eval_reward_after: Option<f64>,
}

impl WarmStartRecord {
    /// The record `file` in `dir` ([`WARM_START_FILE`] or [`SFT_SUMMARY_FILE`]).
    pub fn read(dir: &Path, file: &str) -> Result<Self, LoopError> {
        let path = dir.join(file);
        if !path.exists() {
            return Err(LoopError::RecordMissing(path));
        }
        read_json(&path)
    }

    /// Writes the record as `file` into `dir`, and `steps` as [`SFT_LOG_FILE`] beside it.
    pub fn write(&self, dir: &Path, file: &str, steps: &[SftStepLog]) -> Result<(), LoopError> {
        let mut log = Vec::new();
        for line in steps {
            let text = serde_json::to_string(line).expect("an SFT step line serialises");
            log.extend_from_slice(text.as_bytes());
            log.push(b'\n');
        }
        write_bytes(&dir.join(SFT_LOG_FILE), &log)?;
        write_json(&dir.join(file), self)
    }
}

/// `path` as a `T`; a file that does not parse is [`LoopError::Record`] naming it.
fn read_json<T: DeserializeOwned>(path: &Path) -> Result<T, LoopError> {
    let text = std::fs::read(path).map_err(|e| LoopError::Io(path.to_path_buf(), e))?;
    serde_json::from_slice(&text).map_err(|source| LoopError::Record {
        path: path.to_path_buf(),
        source,
    })
}

/// `value` as pretty JSON with a final newline.
fn write_json<T: Serialize>(path: &Path, value: &T) -> Result<(), LoopError> {
    let mut text = serde_json::to_vec_pretty(value).expect("a run record serialises");
    text.push(b'\n');
    write_bytes(path, &text)
}

/// Writes `bytes` to a sibling file first and renames it into place, so a crash
/// leaves the old file or the new one, never half of one.
fn write_bytes(path: &Path, bytes: &[u8]) -> Result<(), LoopError> {
    let io = |p: &Path| {
        let p = p.to_path_buf();
        move |e| LoopError::Io(p, e)
    };
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(io(dir))?;
    }
    let mut partial = path.as_os_str().to_owned();
    partial.push(".partial");
    let partial = PathBuf::from(partial);
    let mut file = std::fs::File::create(&partial).map_err(io(&partial))?;
    file.write_all(bytes).map_err(io(&partial))?;
    file.sync_data().map_err(io(&partial))?;
    std::fs::rename(&partial, path).map_err(io(path))
}
