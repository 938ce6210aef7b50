//! `POST /v1/rollouts`: tree (or chain) rollouts on a built-in task, answered in the
//! export schema of `treegrpo rollout --out` — `trajectories` as the lines of
//! `trajectories.jsonl`, `forests` as those of `forest.jsonl`, and the `summary`.
//!
//! A request is bounded before anything is allocated (prompts, `sample_ids`, the
//! leaves its shape grows over every prompt, `max_step_tokens`, `turns`: see
//! [`RolloutLimits`]), and admitted through the same gate as generations, for the
//! sequences it may run at once (up to `--max-running`: a larger rollout runs with
//! the whole gate to itself). The run is a task of its own, told to stop when the
//! handler is dropped (its client went away): forests still growing are abandoned
//! and their sequences freed, and the permit is given back once they are.

use axum::extract::State;
use axum::Json;
use serde::Deserialize;
use serde_json::{json, Value};

use crate::advantage::AdvantageMode;
use crate::env::{EnvConfig, QaSample, Split, Task, TaskData};
use crate::rollout::{
    run_rollout, RolloutLimits, RolloutRequest, RunHooks, RunOptions, Selection, TreeConfig,
    TreeOptions,
};

use super::body::ApiJson;
use super::error::ServeError;
use super::state::AppState;

/// Most prompts one request rolls out.
const MAX_PROMPTS: usize = 1024;
/// Most tool turns one request may ask for.
const MAX_TURNS: usize = 64;

/// The JSON body of `POST /v1/rollouts`: a built-in `task`, which of its training
/// questions (`prompts` or `sample_ids`), the search's shape (`trees`, `expand`,
/// `rounds`, `keep`, or `chains`), sampling, `advantage` and `token_budget`.
/// Unknown fields are a 400.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RolloutBody {
    task: Task,
    /// The task's first N training questions …
    #[serde(default)]
    prompts: Option<usize>,
    /// … or these questions of its training split, by id.
    #[serde(default)]
    sample_ids: Option<Vec<String>>,
    #[serde(default = "defaults::trees")]
    trees: usize,
    #[serde(default = "defaults::expand")]
    expand: usize,
    #[serde(default = "defaults::rounds")]
    rounds: usize,
    #[serde(default)]
    keep: Option<usize>,
    /// G independent chains instead of trees (the GRPO baseline).
    #[serde(default)]
    chains: Option<usize>,
    #[serde(default)]
    select: Option<Selection>,
    #[serde(default = "defaults::temperature")]
    temperature: f32,
    #[serde(default = "defaults::max_step_tokens")]
    max_step_tokens: usize,
    /// Tool turns before the forced answer turn.
    #[serde(default = "defaults::turns")]
    turns: usize,
    #[serde(default)]
    advantage: Option<AdvantageMode>,
    #[serde(default)]
    seed: u64,
    #[serde(default)]
    token_budget: Option<u64>,
    /// How a branch's first tokens are drawn: a branch sampling spec (`t2`,
    /// `treerl`, …; see `rollout::branch_sampling`).
    #[serde(default)]
    branch_sampling: Option<String>,
}

/// The defaults of an absent field: the library's (`TreeOptions::default`,
/// `EnvConfig::default`), as the CLI's and Python's are.
mod defaults {
    use crate::env::EnvConfig;
    use crate::rollout::TreeOptions;

    pub fn trees() -> usize {
        TreeOptions::default().trees
    }
    pub fn expand() -> usize {
        TreeOptions::default().expand
    }
    pub fn rounds() -> usize {
        TreeOptions::default().rounds
    }
    pub fn temperature() -> f32 {
        TreeOptions::default().temperature
    }
    pub fn max_step_tokens() -> usize {
        TreeOptions::default().max_step_tokens
    }
    pub fn turns() -> usize {
        EnvConfig::default().max_turns
    }
}

impl RolloutBody {
    /// The search asked for, checked by the library's own rule (`TreeOptions::config`).
    fn config(&self) -> Result<TreeConfig, ServeError> {
        TreeOptions {
            trees: self.trees,
            expand: self.expand,
            rounds: self.rounds,
            keep: self.keep,
            chains: self.chains,
            selection: self.select.unwrap_or(TreeOptions::default().selection),
            temperature: self.temperature,
            max_step_tokens: self.max_step_tokens,
            seed: self.seed,
            branch_sampling: self.branch_sampling.clone(),
        }
        .config()
        .map_err(ServeError::TreeConfig)
    }
}

/// `POST /v1/rollouts`.
pub async fn rollouts(
    State(state): State<AppState>,
    ApiJson(body): ApiJson<RolloutBody>,
) -> Result<Json<Value>, ServeError> {
    let config = body.config()?;
    let data = TaskData::Embedded;
    let samples = chosen_samples(&body, &data)?;
    let at_once = sequences_at_once(&state, &config, samples.len(), body.turns)?;
    let env = body.task.environment(
        &data,
        EnvConfig {
            max_turns: body.turns,
            ..EnvConfig::default()
        },
    )?;
    let mut options = RunOptions::new(body.advantage.unwrap_or(config.default_advantage()));
    options.token_budget = body.token_budget;
    let request = RolloutRequest {
        env,
        samples,
        config,
        options,
    };
    let permit = state.admission.admit(at_once).await?;
    // Dropped with the handler (a client that went away): the run stops.
    let (_cancel_on_drop, cancelled) = tokio::sync::oneshot::channel::<()>();
    let hooks = RunHooks {
        interrupt: Some(Box::pin(async move {
            let _ = cancelled.await;
        })),
        ..RunHooks::default()
    };
    let engine = state.engine.clone();
    let result = tokio::spawn(async move {
        let result = run_rollout(engine, request, hooks).await;
        // Held until the run has freed its sequences.
        drop(permit);
        result
    })
    .await??;
    Ok(Json(json!({
        "summary": result.summary,
        "trajectories": result.records,
        "forests": result.trees,
    })))
}

/// The training questions the body asks for: its task's first `prompts`, or those
/// `sample_ids` in the order given. Exactly one of the two must be given, within
/// [`MAX_PROMPTS`], ids at most once and each one known; at least one sample.
fn chosen_samples(body: &RolloutBody, data: &TaskData) -> Result<Vec<QaSample>, ServeError> {
    let samples = match (&body.prompts, &body.sample_ids) {
        (Some(_), Some(_)) => {
            return Err(ServeError::invalid(
                "prompts",
                "give `prompts` or `sample_ids`, not both",
            ))
        }
        (Some(n), None) if *n == 0 || *n > MAX_PROMPTS => {
            return Err(ServeError::invalid(
                "prompts",
                format!("between 1 and {MAX_PROMPTS}"),
            ))
        }
        (Some(n), None) => body.task.split(data, Split::Train, *n)?,
        (None, Some(ids)) if ids.len() > MAX_PROMPTS => {
            return Err(ServeError::invalid(
                "sample_ids",
                format!("at most {MAX_PROMPTS} ids"),
            ))
        }
        (None, Some(ids)) if has_duplicates(ids) => {
            return Err(ServeError::invalid(
                "sample_ids",
                "each id at most once (ask for more trees instead)",
            ))
        }
        (None, Some(ids)) => samples_by_id(body, data, ids)?,
        (None, None) => {
            return Err(ServeError::invalid(
                "prompts",
                "`prompts` or `sample_ids` is needed",
            ))
        }
    };
    if samples.is_empty() {
        return Err(ServeError::invalid(
            "sample_ids",
            "at least one sample is needed",
        ));
    }
    Ok(samples)
}

/// The task's training samples with these ids, in the order asked; the first id
/// with no sample is the error.
fn samples_by_id(
    body: &RolloutBody,
    data: &TaskData,
    ids: &[String],
) -> Result<Vec<QaSample>, ServeError> {
    let all = body.task.split(data, Split::Train, usize::MAX)?;
    ids.iter()
        .map(|id| {
            all.iter()
                .find(|s| s.id.as_str() == id)
                .cloned()
                .ok_or_else(|| {
                    ServeError::invalid("sample_ids", format!("no training sample '{id}'"))
                })
        })
        .collect::<Result<Vec<_>, _>>()
}

/// Checks the search against the server's [`RolloutLimits`] and says how many
/// sequences the run may hold at once (what it asks the admission gate for): its
/// most leaves over all `prompts`, capped at `--max-running`.
fn sequences_at_once(
    state: &AppState,
    config: &TreeConfig,
    prompts: usize,
    turns: usize,
) -> Result<usize, ServeError> {
    let limits = RolloutLimits {
        max_leaves: state.config.max_rollout_leaves,
        max_step_tokens: state.max_positions(),
        max_turns: MAX_TURNS,
    };
    limits
        .check(config, prompts, turns)
        .map_err(ServeError::TreeConfig)?;
    let leaves = config
        .shape
        .max_leaves()
        .map_or(u64::MAX, |l| l.saturating_mul(prompts as u64));
    Ok(leaves.min(state.config.max_running as u64) as usize)
}

/// Whether an id is asked for twice.
fn has_duplicates(ids: &[String]) -> bool {
    let mut seen = std::collections::HashSet::new();
    !ids.iter().all(|id| seen.insert(id.as_str()))
}

impl super::known_fields::KnownFields for RolloutBody {}
