//! How a training run begins: fresh (with a warm-start if asked), or resumed from its
//! folder, whose `run.json` fixes what a new invocation may not change — the model it
//! started from (unless another is named) and the questions its warm-start used.

use std::path::{Path, PathBuf};

use super::error::LoopError;
use super::record::RunRecord;
use crate::env::QaSample;

/// What a training run starts from.
#[derive(Debug, Clone, PartialEq)]
pub struct RunStart {
    /// The model to load (`None`: the default model).
    pub model: Option<PathBuf>,
    /// Questions at the head of the training split that the warm-start demonstrates
    /// (or, for a resumed run, demonstrated).
    pub warm_start: usize,
    /// The record of the run being resumed; `None` for a fresh run.
    pub resumed: Option<RunRecord>,
}

impl RunStart {
    /// A fresh run from `model` (`None`: the default model), warm-started on the first
    /// `warm_start` training questions (0: none).
    pub fn fresh(model: Option<PathBuf>, warm_start: usize) -> Self {
        RunStart {
            model,
            warm_start,
            resumed: None,
        }
    }

    /// The run in folder `dir`, resumed: the model and warm-start size of its
    /// `run.json`, `model` in place of the recorded model where given.
    pub fn resume(dir: &Path, model: Option<PathBuf>) -> Result<Self, LoopError> {
        let record = RunRecord::read(dir)?;
        Ok(RunStart {
            model: Some(model.unwrap_or_else(|| record.model.clone())),
            warm_start: record.warm_start,
            resumed: Some(record),
        })
    }

    /// Whether the warm-start runs now (a resumed run's ran before its first
    /// checkpoint).
    pub fn warm_starts_now(&self) -> bool {
        self.resumed.is_none() && self.warm_start > 0
    }

    /// The training split as the warm-start's questions (empty unless it runs now)
    /// and the RL prompts: the questions after the warm-start's, so no reward is
    /// earned on a question the model was shown solved.
    pub fn split_train(&self, mut train: Vec<QaSample>) -> (Vec<QaSample>, Vec<QaSample>) {
        let demos: Vec<QaSample> = train.drain(..self.warm_start.min(train.len())).collect();
        if self.warm_starts_now() {
            (demos, train)
        } else {
            (Vec::new(), train)
        }
    }
}
