//! `POST /v1/rollouts`: tree (or chain) rollouts on a built-in task, answered in the
//! export schema of `treegrpo rollout --out` — `trajectories` as the lines of
//! `trajectories.jsonl`, `forests` as those of `forest.jsonl`, and the `summary`.
//!
//! The run is a task of its own: a client that disconnects does not abandon forests
//! half-grown (their sequences would stay in the engine); the run finishes, frees
//! everything it holds, and its result is dropped.

use axum::extract::State;
use axum::Json;
use serde::Deserialize;
use serde_json::{json, Value};

use crate::advantage::AdvantageMode;
use crate::env::{EnvConfig, Split, Task, TaskData};
use crate::rollout::{
    run_rollout, RolloutRequest, RunHooks, RunOptions, Selection, TreeConfig, TreeOptions,
};

use super::body::ApiJson;
use super::error::ServeError;
use super::state::AppState;

/// Most prompts one request rolls out.
const MAX_PROMPTS: usize = 1024;

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
    #[serde(default = "two")]
    trees: usize,
    #[serde(default = "two")]
    expand: usize,
    #[serde(default = "one")]
    rounds: usize,
    #[serde(default)]
    keep: Option<usize>,
    /// G independent chains instead of trees (the GRPO baseline).
    #[serde(default)]
    chains: Option<usize>,
    #[serde(default)]
    select: Option<Selection>,
    #[serde(default = "one_f32")]
    temperature: f32,
    #[serde(default = "step_tokens")]
    max_step_tokens: usize,
    /// Tool turns before the forced answer turn.
    #[serde(default = "three")]
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

fn one() -> usize {
    1
}
fn two() -> usize {
    2
}
fn three() -> usize {
    3
}
fn one_f32() -> f32 {
    1.0
}
fn step_tokens() -> usize {
    256
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
            selection: self.select.unwrap_or(Selection::Paper),
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
        (Some(n), None) => body.task.split(&data, Split::Train, *n)?,
        (None, Some(ids)) => {
            let all = body.task.split(&data, Split::Train, usize::MAX)?;
            ids.iter()
                .map(|id| {
                    all.iter()
                        .find(|s| s.id.as_str() == id)
                        .cloned()
                        .ok_or_else(|| {
                            ServeError::invalid("sample_ids", format!("no training sample '{id}'"))
                        })
                })
                .collect::<Result<Vec<_>, _>>()?
        }
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
    let engine = state.engine.clone();
    let result = tokio::spawn(run_rollout(engine, request, RunHooks::default())).await??;
    Ok(Json(json!({
        "summary": result.summary,
        "trajectories": result.records,
        "forests": result.trees,
    })))
}

impl super::known_fields::KnownFields for RolloutBody {}
