//! The Search-R1 step protocol shared by every tool environment: parse the
//! step, run the tool or give feedback, count turns, force the final answer
//! turn, and grade the trajectory.
//!
//! Turns: every step is a turn, valid or not. Steps `1..=max_turns` may call
//! the environment's tool or answer; if the episode is still going after
//! step `max_turns`, that step's observation ends with a notice that the
//! tool is no longer available, and step `max_turns + 1` is the forced
//! answer turn: an answer ends the episode as usual, anything else (a tool
//! call included) is invalid and ends the episode without an answer. This is
//! Search-R1's final `do_search=False` rollout, made explicit to the model.

use std::sync::Arc;

use crate::env::action::{parse_action, Action, InvalidReason};
use crate::env::action_kind::ActionKind;
use crate::env::config::EnvConfig;
use crate::env::environment::{Score, ScoreDetails, StepOutcome};
use crate::env::episode::{Episode, StepRecord};
use crate::env::error::EnvError;
use crate::env::format::{check_step_format, FormatIssue};
use crate::env::reward::{reward_from, RewardConfig, RewardMetric};
use crate::env::tags::Tags;
use crate::env::tool::{run_tool, truncate_observation, Tool, ToolStatus};

/// The verb the model's own feedback uses for a tool.
fn verb(kind: ActionKind) -> (&'static str, &'static str) {
    match kind {
        ActionKind::Calc => ("calculate", "expression"),
        _ => ("search", "query"),
    }
}

/// Search-R1's feedback for an invalid step, with the environment's tool.
/// With default tags and the search tool this is the reference text byte
/// for byte.
pub fn invalid_action_feedback(tags: &Tags, tool: ActionKind) -> String {
    let (verb, what) = verb(tool);
    let t = tags.action(tool);
    let a = &tags.answer;
    format!(
        "\nMy previous action is invalid. If I want to {verb}, I should put the {what} between <{t}> and </{t}>. If I want to give the final answer, I should put the answer between <{a}> and </{a}>. Let me try again.\n"
    )
}

/// Appended after the last tool turn's observation.
pub fn turn_limit_notice(tags: &Tags, tool: ActionKind) -> String {
    let (verb, _) = verb(tool);
    let a = &tags.answer;
    format!(
        "\nI have reached the turn limit, so I cannot {verb} any more. I must now give my final answer between <{a}> and </{a}>.\n"
    )
}

/// A tool result as Search-R1 appends it: `\n\n<information>BODY</information>\n\n`,
/// body trimmed.
pub fn information_block(tags: &Tags, body: &str) -> String {
    let i = &tags.information;
    format!("\n\n<{i}>{}</{i}>\n\n", body.trim())
}

/// The one tool an environment offers, and the action that calls it.
#[derive(Clone)]
pub(crate) struct ToolSlot {
    pub kind: ActionKind,
    pub tool: Arc<dyn Tool>,
}

/// Stop strings: the closing tags of the tool action and of the answer.
pub(crate) fn stop_strings(tags: &Tags, tool: ActionKind) -> Vec<String> {
    vec![
        Tags::close(tags.action(tool)),
        Tags::close(tags.action(ActionKind::Answer)),
    ]
}

/// A demonstration step in the protocol's format: one think block, then one action.
pub(crate) fn oracle_text(tags: &Tags, thought: &str, action_tag: &str, input: &str) -> String {
    format!(
        "{}{thought}{}\n{} {input} {}",
        Tags::open(&tags.think),
        Tags::close(&tags.think),
        Tags::open(action_tag),
        Tags::close(action_tag),
    )
}

/// One step of the protocol (see the module doc).
pub(crate) async fn protocol_step(
    cfg: &EnvConfig,
    slot: &ToolSlot,
    episode: &mut Episode,
    text: &str,
) -> Result<StepOutcome, EnvError> {
    if episode.is_done() {
        return Err(EnvError::EpisodeFinished(episode.sample().id.clone()));
    }
    let tags = &cfg.tags;
    let answer_only = episode.in_answer_only_turn();
    let last_tool_turn = !answer_only && episode.steps().len() + 1 == cfg.max_turns;
    let action = match parse_action(text, tags) {
        a @ (Action::Answer(_) | Action::Invalid(_)) => a,
        a => match a.kind() {
            Some(kind) if kind != slot.kind => Action::Invalid(InvalidReason::NotAllowed { kind }),
            Some(kind) if answer_only => {
                Action::Invalid(InvalidReason::ToolAfterTurnLimit { kind })
            }
            _ => a,
        },
    };
    let format_issue = check_step_format(text, tags, &action).err();
    let mut tool_status = None;
    let (observation, done) = match &action {
        Action::Answer(_) => (None, true),
        _ if answer_only => (None, true),
        // `parse_action` never yields `External` (only environments outside the crate
        // do); were it to, it would be no action this protocol knows.
        Action::Invalid(_) | Action::External { .. } => {
            (Some(invalid_action_feedback(tags, slot.kind)), false)
        }
        Action::Search(input) | Action::Calc(input) => {
            let outcome = run_tool(Arc::clone(&slot.tool), input, cfg.tool_timeout).await;
            tool_status = Some(outcome.status);
            let body = truncate_observation(&outcome.text, cfg.max_observation_chars);
            (Some(information_block(tags, &body)), false)
        }
    };
    let observation = match observation {
        Some(obs) if last_tool_turn => Some(obs + &turn_limit_notice(tags, slot.kind)),
        other => other,
    };
    let record = StepRecord {
        text: text.to_owned(),
        action: action.clone(),
        observation: observation.clone(),
        format_issue,
        tool_status,
        answer_only_turn: answer_only,
    };
    episode.push(record, done);
    Ok(StepOutcome {
        observation,
        done,
        action,
    })
}

/// First format problem of a trajectory (see [`crate::env::format`]).
pub fn trajectory_format_issue(episode: &Episode) -> Option<(usize, FormatIssue)> {
    let steps = episode.steps();
    if steps.is_empty() {
        return Some((0, FormatIssue::Empty));
    }
    if let Some((i, issue)) = steps
        .iter()
        .enumerate()
        .find_map(|(i, s)| s.format_issue.map(|f| (i + 1, f)))
    {
        return Some((i, issue));
    }
    match episode.final_answer() {
        Some(_) => None,
        None => Some((steps.len(), FormatIssue::NoFinalAnswer)),
    }
}

/// Grades a trajectory. `judge(answer, golden)` returns (exact match, F1).
pub(crate) fn score_episode(
    episode: &Episode,
    cfg: &RewardConfig,
    metric: RewardMetric,
    judge: impl Fn(&str, &[String]) -> (bool, f64),
) -> Score {
    let issue = trajectory_format_issue(episode);
    let well_formed = issue.is_none();
    let answer = episode.final_answer().map(str::to_owned);
    let (exact_match, f1) = match &answer {
        Some(a) => judge(a, &episode.sample().golden_answers),
        None => (false, 0.0),
    };
    let correctness = answer.as_ref().map(|_| match metric {
        RewardMetric::ExactMatch | RewardMetric::Environment => f64::from(u8::from(exact_match)),
        RewardMetric::F1 => f1,
    });
    let steps = episode.steps();
    let details = ScoreDetails {
        answer,
        exact_match,
        f1,
        metric,
        well_formed,
        format_issue: issue.map(|(step, what)| format!("step {step}: {what:?}")),
        steps: steps.len(),
        tool_calls: steps.iter().filter(|s| s.tool_status.is_some()).count(),
        tool_errors: steps
            .iter()
            .filter(|s| matches!(s.tool_status, Some(t) if t != ToolStatus::Ok))
            .count(),
        invalid_actions: steps.iter().filter(|s| !s.action.is_valid()).count(),
    };
    Score {
        reward: reward_from(correctness, well_formed, &cfg.levels),
        details,
    }
}
