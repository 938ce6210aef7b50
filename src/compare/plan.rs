//! [`ComparePlan`]: everything that makes two comparisons the same experiment — the
//! task, the arms, the seeds, the steps, the step budget, the warm-start, the sampling
//! and the update — written to the output folder as `compare.json`, so a rerun with
//! the same flags resumes it and one with other flags is refused. Also the folder's
//! layout.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::arm::Arm;
use super::error::CompareError;
use crate::env::Task;
use crate::train::{OptimizerConfig, UpdateConfig};

/// The plan's file in the output folder.
pub const PLAN_FILE: &str = "compare.json";

/// A learning comparison (see the module doc).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ComparePlan {
    /// The task every arm trains and is evaluated on.
    pub task: Task,
    /// The model the warm-start starts from (`None`: the default model).
    pub model: Option<PathBuf>,
    /// The task's data folder (`None`: the data compiled in).
    pub data: Option<PathBuf>,
    /// The arms, in the order they run and are reported.
    pub arms: Vec<Arm>,
    /// Seeds per arm for the arms listed in `full_seed_arms` (the others run seed 0
    /// only); the rollout seed of seed `k` is `seed + k`.
    pub seeds: usize,
    /// Arms that run every seed (the rest, ablations, run one).
    pub full_seed_arms: Vec<String>,
    /// The first rollout seed.
    pub seed: u64,
    /// Training steps of every run.
    pub steps: u64,
    /// Prompts of each step (the same for every arm).
    pub prompts_per_step: usize,
    /// Computed tokens each step's rollouts spend, for every arm.
    pub step_budget: u64,
    /// Evaluate whenever a run's cumulative computed tokens cross a multiple of this
    /// (and after its last step).
    pub eval_every_tokens: u64,
    /// Test questions each evaluation runs greedily (the first this many).
    pub eval_prompts: usize,
    /// Training questions the shared warm-start demonstrates (0: none); the runs'
    /// prompts are the questions after them.
    pub warm_start: usize,
    /// Warm-start epochs.
    pub warm_start_epochs: usize,
    /// Warm-start learning rate.
    pub warm_start_lr: f64,
    /// Sampling temperature of every arm's rollouts.
    pub temperature: f32,
    /// Most tokens per agent step.
    pub max_step_tokens: usize,
    /// Tool turns before the forced answer turn.
    pub turns: usize,
    /// The update of every run (its temperature is the sampling temperature).
    pub update: UpdateConfig,
    /// The optimiser of every run.
    pub optimizer: OptimizerConfig,
    /// Most prompts grown at once (0: all).
    pub concurrent_prompts: usize,
}

impl ComparePlan {
    /// Refuses a plan that asks for nothing.
    pub fn check(&self) -> Result<(), CompareError> {
        let problem = if self.arms.is_empty() {
            "--arms names no arm"
        } else if self.seeds == 0 {
            "--seeds must be at least 1"
        } else if self.steps == 0 {
            "--steps must be at least 1"
        } else if self.prompts_per_step == 0 {
            "--prompts-per-step must be at least 1"
        } else if self.step_budget == 0 {
            "--token-budget must be at least 1"
        } else if self.eval_prompts == 0 {
            "--eval-prompts must be at least 1: the comparison is of eval rewards"
        } else {
            return Ok(());
        };
        Err(CompareError::Plan(problem))
    }

    /// The seeds arm `arm` runs (indices from 0).
    pub fn seeds_of(&self, arm: &Arm) -> usize {
        if self.full_seed_arms.iter().any(|a| a == arm.name()) {
            self.seeds
        } else {
            1
        }
    }

    /// Every run of the plan, arm by arm, seed by seed.
    pub fn runs(&self) -> Vec<(&Arm, usize)> {
        self.arms
            .iter()
            .flat_map(|arm| (0..self.seeds_of(arm)).map(move |k| (arm, k)))
            .collect()
    }

    /// Writes the plan into `out`, or checks it against the one there (a resumed
    /// comparison): the same plan, or the same with more steps (which extends every
    /// run) or more arms after its own (which adds their runs), is taken; any other
    /// difference is refused.
    pub fn adopt_folder(&self, out: &Path) -> Result<(), CompareError> {
        let path = out.join(PLAN_FILE);
        std::fs::create_dir_all(out).map_err(|e| CompareError::Io(out.to_path_buf(), e))?;
        let mine = serde_json::to_value(self).expect("a plan serialises");
        if path.exists() {
            let text =
                std::fs::read_to_string(&path).map_err(|e| CompareError::Io(path.clone(), e))?;
            let theirs: serde_json::Value =
                serde_json::from_str(&text).map_err(|e| CompareError::Json(path.clone(), e))?;
            match first_difference(&mine, &theirs) {
                None => return Ok(()),
                // More steps extend every run from its last checkpoint (the steps it
                // has taken are the same either way); more arms add runs.
                Some(_) if extends(&mine, &theirs) => {}
                Some(field) => return Err(CompareError::PlanChanged { path, field }),
            }
        }
        let text = serde_json::to_string_pretty(&mine).expect("a plan serialises");
        std::fs::write(&path, text + "\n").map_err(|e| CompareError::Io(path, e))
    }
}

/// Whether plan `a` extends plan `b`: at least its steps, its arms followed by more
/// (and the same for the arms that run every seed), every other setting the same.
fn extends(a: &serde_json::Value, b: &serde_json::Value) -> bool {
    let steps = |v: &serde_json::Value| v.get("steps").and_then(serde_json::Value::as_u64);
    let list = |v: &serde_json::Value, key: &str| -> Vec<serde_json::Value> {
        v.get(key)
            .and_then(serde_json::Value::as_array)
            .cloned()
            .unwrap_or_default()
    };
    let prefix = |key: &str| list(a, key).starts_with(&list(b, key));
    let rest = |v: &serde_json::Value| {
        let mut v = v.clone();
        if let Some(o) = v.as_object_mut() {
            for key in ["steps", "arms", "full_seed_arms"] {
                o.remove(key);
            }
        }
        v
    };
    steps(a) >= steps(b) && prefix("arms") && prefix("full_seed_arms") && rest(a) == rest(b)
}

/// The first top-level field where two plans differ.
fn first_difference(a: &serde_json::Value, b: &serde_json::Value) -> Option<String> {
    let (Some(a), Some(b)) = (a.as_object(), b.as_object()) else {
        return (a != b).then(|| "the plan".to_string());
    };
    a.keys()
        .chain(b.keys())
        .find(|k| a.get(*k) != b.get(*k))
        .cloned()
}

/// The shared warm-start's folder (an HF checkpoint every run loads).
pub fn warm_start_dir(out: &Path) -> PathBuf {
    out.join("warm-start")
}

/// The run folder of `arm`'s seed `k`.
pub fn run_dir(out: &Path, arm: &Arm, k: usize) -> PathBuf {
    out.join("runs").join(arm.name()).join(format!("seed-{k}"))
}
