//! Reading an update's input: `trajectories.jsonl` as `treegrpo rollout` writes it
//! (verl's agent-loop fields: `prompt_ids`, `response_ids`, `response_mask`,
//! `response_logprobs`, `advantage`, and the `temperature` they were sampled at), so
//! rollouts made elsewhere in the same schema train the same way.
//!
//! Every line is checked before anything is computed, and the first bad one is
//! reported with the file and its 1-based line number: ids outside the vocabulary,
//! mask / ids / logprobs of different lengths, a mask value other than 0 and 1, a
//! missing or non-finite advantage, an empty prompt, a path longer than the context,
//! mixed temperatures, an empty file.

use std::path::Path;

use serde::Deserialize;

use super::error::TrainError;
use super::update::TrainSample;
use crate::model::{ModelConfig, TokenId};

/// The fields an update reads; the rest of a record is ignored.
#[derive(Debug, Deserialize)]
struct Line {
    prompt_ids: Vec<TokenId>,
    response_ids: Vec<TokenId>,
    response_mask: Vec<u8>,
    #[serde(default)]
    response_logprobs: Option<Vec<f32>>,
    /// The distribution each token was drawn from (the TIS weight's denominator);
    /// older files have none, and then `response_logprobs` are taken.
    #[serde(default)]
    response_behaviour_logprobs: Option<Vec<f32>>,
    advantage: Option<f64>,
    #[serde(default)]
    temperature: Option<f64>,
}

/// An update's trajectories and the temperature they were sampled at.
#[derive(Debug, Clone)]
pub struct TrainingData {
    /// One sample per non-blank line of the file, in file order.
    pub samples: Vec<TrainSample>,
    /// From the records; 1 when none says (and for greedy rollouts).
    pub temperature: f64,
}

/// Reads and checks `path` against the model it will train.
pub fn read_trajectories(path: &Path, model: &ModelConfig) -> Result<TrainingData, TrainError> {
    let text = std::fs::read_to_string(path).map_err(|e| TrainError::Io(path.to_path_buf(), e))?;
    parse_trajectories(&text, path, model)
}

/// [`read_trajectories`] of a file's text in memory (`path` names it in errors).
pub fn parse_trajectories(
    text: &str,
    path: &Path,
    model: &ModelConfig,
) -> Result<TrainingData, TrainError> {
    let bad = |line: usize, message: String| TrainError::BadInput {
        path: path.to_path_buf(),
        line,
        message,
    };
    let mut samples = Vec::new();
    let mut temperature: Option<f64> = None;
    for (i, raw) in text.lines().enumerate() {
        let n = i + 1;
        if raw.trim().is_empty() {
            continue;
        }
        let mut line: Line = serde_json::from_str(raw).map_err(|source| TrainError::Json {
            path: path.to_path_buf(),
            line: n,
            what: "a trajectory record",
            source,
        })?;
        let checked = check_line(&mut line, model).map_err(|m| bad(n, m))?;
        merge_temperature(&mut temperature, line.temperature).map_err(|m| bad(n, m))?;
        samples.push(into_sample(line, checked));
    }
    if samples.is_empty() {
        return Err(bad(0, "no trajectories (the file is empty)".into()));
    }
    Ok(TrainingData {
        samples,
        temperature: temperature.unwrap_or(1.0),
    })
}

/// What checking a record yields besides the record itself.
struct Checked {
    /// The record's advantage, present and finite.
    advantage: f64,
    /// The logprobs the importance weight divides by, one per response id.
    rollout_logprobs: Option<Vec<f32>>,
}

/// Checks one record (all but its temperature) and takes its rollout logprobs out of
/// it; the message of the first failed check, in the order the module docs promise:
/// advantage, mask length, logprobs, mask values, then the tokens.
fn check_line(line: &mut Line, model: &ModelConfig) -> Result<Checked, String> {
    let advantage = line
        .advantage
        .ok_or_else(|| String::from("the advantage is missing (null)"))?;
    if !advantage.is_finite() {
        return Err(format!("the advantage {advantage} is not finite"));
    }
    let r = line.response_ids.len();
    if line.response_mask.len() != r {
        return Err(format!(
            "{r} response ids but {} mask values",
            line.response_mask.len()
        ));
    }
    let rollout_logprobs = take_rollout_logprobs(line)?;
    check_tokens(line, model)?;
    Ok(Checked {
        advantage,
        rollout_logprobs,
    })
}

/// Takes the logprobs the importance weight divides by: the behaviour's where
/// recorded (and not empty), else the response logprobs; checks there is one per
/// response id and each is finite.
fn take_rollout_logprobs(line: &mut Line) -> Result<Option<Vec<f32>>, String> {
    let r = line.response_ids.len();
    let rollout_logprobs = line
        .response_behaviour_logprobs
        .take()
        .filter(|v| !v.is_empty())
        .or(line.response_logprobs.take());
    if let Some(lp) = &rollout_logprobs {
        if lp.len() != r {
            return Err(format!("{r} response ids but {} logprobs", lp.len()));
        }
        if let Some(j) = lp.iter().position(|x| !x.is_finite()) {
            return Err(format!("response logprob {j} is not finite"));
        }
    }
    Ok(rollout_logprobs)
}

/// Checks the mask values are 0 or 1, the prompt is not empty, every id is in the
/// model's vocabulary and the whole path fits its context.
fn check_tokens(line: &Line, model: &ModelConfig) -> Result<(), String> {
    if let Some(&m) = line.response_mask.iter().find(|&&m| m > 1) {
        return Err(format!("mask value {m} (masks are 0 or 1)"));
    }
    if line.prompt_ids.is_empty() {
        return Err("the prompt is empty".into());
    }
    if let Some(&t) = line
        .prompt_ids
        .iter()
        .chain(&line.response_ids)
        .find(|&&t| t as usize >= model.vocab_size)
    {
        return Err(format!(
            "token id {t} is outside the model's vocabulary of {}",
            model.vocab_size
        ));
    }
    let len = line.prompt_ids.len() + line.response_ids.len();
    if len > model.max_position_embeddings {
        return Err(format!(
            "{len} tokens exceed the model's context of {}",
            model.max_position_embeddings
        ));
    }
    Ok(())
}

/// Checks a record's temperature (when it has one) is positive and the same as the
/// earlier lines', and records it in `seen`.
fn merge_temperature(seen: &mut Option<f64>, temperature: Option<f64>) -> Result<(), String> {
    if let Some(t) = temperature {
        if !(t.is_finite() && t > 0.0) {
            return Err(format!("temperature {t} must be positive"));
        }
        match *seen {
            Some(prev) if prev != t => {
                return Err(format!("temperature {t} differs from the {prev} of earlier lines: update one rollout's output at a time"))
            }
            _ => *seen = Some(t),
        }
    }
    Ok(())
}

/// A checked record as a training sample: the prompt's and the response's ids as one
/// path, the logprobs widened to f64.
fn into_sample(line: Line, checked: Checked) -> TrainSample {
    let prompt_len = line.prompt_ids.len();
    let mut tokens = line.prompt_ids;
    tokens.extend(&line.response_ids);
    TrainSample {
        tokens,
        prompt_len,
        response_mask: line.response_mask,
        rollout_logprobs: checked
            .rollout_logprobs
            .map(|v| v.into_iter().map(f64::from).collect()),
        old_logprobs: None,
        ref_logprobs: None,
        advantage: checked.advantage,
    }
}
