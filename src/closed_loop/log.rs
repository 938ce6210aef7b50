//! `log.jsonl`: one line per training step, appended and synced as each step ends,
//! so an interrupted run leaves only whole lines, and read back on `--resume`.

use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::error::LoopError;
use super::eval::Evaluation;
use super::step_rollout::StepRollouts;
use crate::advantage::AdvantageSignal;
use crate::durable;
use crate::rollout::BranchingStats;
use crate::train::UpdateMetrics;

/// Token figures of a step's rollouts (evaluation not included).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct StepTokens {
    /// Prompt and observation tokens computed.
    pub prefilled: u64,
    /// Tokens the model sampled (model turns).
    pub decoded: u64,
    /// Needed but not computed (forks, prefix cache).
    pub reused: u64,
    /// Everything the model computed for the step's rollouts.
    pub computed: u64,
    /// `computed` summed over every step so far: the x axis of the reward curves.
    pub cumulative_computed: u64,
}

/// One line of `log.jsonl`. Step 0 is the evaluation before any update (no rollouts).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StepLog {
    /// The training step this line closes (0: the evaluation before any update).
    pub step: u64,
    /// The weights the step's rollouts were sampled under (the step before's policy).
    pub weight_version: u64,
    /// Mean reward of the step's rollouts.
    pub reward_mean: f64,
    /// Greedy mean reward on the task's test prompts, when evaluated after the step.
    pub eval_reward: Option<f64>,
    /// The ids of that evaluation's questions, in the order evaluated (absent when
    /// none ran, and in older logs).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub eval_question_ids: Option<Vec<String>>,
    /// Each of those questions' greedy reward, in the same order: what
    /// `treegrpo compare` pairs two arms by (seed, question). Absent likewise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub eval_rewards: Option<Vec<f64>>,
    /// Trajectories (leaves) the step's rollouts produced and the update trained on.
    pub rollouts: usize,
    /// What the step's rollouts cost in tokens.
    pub tokens: StepTokens,
    /// The ids of the step's prompts, in order (absent on step 0 and in older logs).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub prompt_ids: Vec<String>,
    /// Trees (chains) grown on each prompt, in prompt order: a budgeted step adds
    /// trees until its budget is spent (absent on step 0 and in older logs).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub trees_per_prompt: Vec<usize>,
    /// The learning signal of the step's rollouts: the shares of prompts and trees
    /// with mixed rewards and the mean |intra| and |inter| advantages (absent on
    /// step 0 and in older logs).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signal: Option<AdvantageSignal>,
    /// Where the step's branches forked and how far apart they ended (absent for
    /// chains, on step 0 and in older logs).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub branching: Option<BranchingStats>,
    /// The update's total loss (see [`UpdateMetrics`](crate::train::UpdateMetrics));
    /// 0 on step 0, as are the other update figures.
    pub loss: f64,
    /// The loss's clipped policy-gradient part.
    pub pg_loss: f64,
    /// Mean negative log-likelihood of the loss tokens.
    pub nll: f64,
    /// The aggregated k3 KL to the reference policy (nats).
    pub kl: f64,
    /// The aggregated entropy at the loss tokens (nats).
    pub entropy: f64,
    /// Global gradient norm before clipping.
    pub grad_norm: f64,
    /// Fraction of loss tokens whose ratio was clipped.
    pub clip_fraction: f64,
    /// Mean truncated importance weight over the loss tokens.
    pub tis_mean: f64,
    /// Response tokens of the step's trajectories drawn from a branch sampling's
    /// wider distribution (counted per leaf, as the update counts tokens; absent
    /// when none were, as without `--branch-sampling`).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub boosted_tokens: usize,
    /// Max and mean `|trainer log p − rollout log p|` over the step's loss tokens
    /// (verl's `rollout_probs_diff`); absent on step 0 and in logs of older builds.
    /// The rollout's are the behaviour logprobs, so boosted tokens open a gap here
    /// and, on-policy and without them, it is exactly 0 (one decoder samples and
    /// trains).
    #[serde(default)]
    pub rollout_logprob_diff_max: Option<f64>,
    /// The mean of the same gap; absent likewise.
    #[serde(default)]
    pub rollout_logprob_diff_mean: Option<f64>,
    /// The learning rate of the step's update (after warm-up).
    pub lr: f64,
    /// Wall-clock seconds of the step's rollouts.
    pub rollout_seconds: f64,
    /// Wall-clock seconds of the update, the frozen reference's scoring included.
    pub update_seconds: f64,
    /// Wall-clock seconds of the evaluation after the step (0 when none ran).
    pub eval_seconds: f64,
}

impl StepLog {
    /// Step 0: the evaluation before any update, under weight version `version`.
    pub fn before_training(version: u64, eval: Option<&Evaluation>) -> StepLog {
        StepLog {
            step: 0,
            weight_version: version,
            reward_mean: 0.0,
            eval_reward: eval.map(|e| e.mean_reward),
            eval_question_ids: eval.map(question_ids),
            eval_rewards: eval.map(question_rewards),
            rollouts: 0,
            tokens: StepTokens::default(),
            prompt_ids: Vec::new(),
            trees_per_prompt: Vec::new(),
            signal: None,
            branching: None,
            loss: 0.0,
            pg_loss: 0.0,
            nll: 0.0,
            kl: 0.0,
            entropy: 0.0,
            grad_norm: 0.0,
            clip_fraction: 0.0,
            tis_mean: 0.0,
            boosted_tokens: 0,
            rollout_logprob_diff_max: None,
            rollout_logprob_diff_mean: None,
            lr: 0.0,
            rollout_seconds: 0.0,
            update_seconds: 0.0,
            eval_seconds: eval.map_or(0.0, |e| e.seconds),
        }
    }

    /// The line of finished step `step`: its rollouts (sampled under
    /// `weight_version`), its update's metrics, and the evaluation after it if one
    /// ran.
    #[allow(clippy::too_many_arguments)]
    pub fn after_step(
        step: u64,
        weight_version: u64,
        rollouts: &StepRollouts,
        m: &UpdateMetrics,
        cumulative_computed: u64,
        rollout_seconds: f64,
        eval: Option<&Evaluation>,
    ) -> StepLog {
        StepLog {
            step,
            weight_version,
            reward_mean: rollouts.mean_reward(),
            eval_reward: eval.map(|e| e.mean_reward),
            eval_question_ids: eval.map(question_ids),
            eval_rewards: eval.map(question_rewards),
            rollouts: rollouts.records.len(),
            tokens: StepTokens {
                prefilled: rollouts.prefilled,
                decoded: rollouts.decoded,
                reused: rollouts.reused,
                computed: rollouts.computed,
                cumulative_computed,
            },
            prompt_ids: rollouts.prompt_ids.clone(),
            trees_per_prompt: rollouts.trees_per_prompt.clone(),
            signal: Some(rollouts.signal()),
            branching: rollouts.branching(),
            loss: m.loss,
            pg_loss: m.pg_loss,
            nll: m.nll,
            kl: m.kl,
            entropy: m.entropy,
            grad_norm: m.grad_norm,
            clip_fraction: m.clip_fraction,
            tis_mean: m.tis_mean,
            boosted_tokens: rollouts.boosted_tokens(),
            rollout_logprob_diff_max: m.rollout_logprob_diff_max,
            rollout_logprob_diff_mean: m.rollout_logprob_diff_mean,
            lr: m.lr,
            rollout_seconds,
            update_seconds: m.seconds,
            eval_seconds: eval.map_or(0.0, |e| e.seconds),
        }
    }

    /// The evaluation's reward per question, `(id, reward)` in the order evaluated
    /// (`None`: no evaluation, or a log written before they were recorded, or ids
    /// and rewards that do not match up).
    pub fn eval_per_question(&self) -> Option<Vec<(&str, f64)>> {
        let (ids, rewards) = (
            self.eval_question_ids.as_ref()?,
            self.eval_rewards.as_ref()?,
        );
        (ids.len() == rewards.len()).then(|| {
            ids.iter()
                .map(String::as_str)
                .zip(rewards.iter().copied())
                .collect()
        })
    }

    /// The line with every timing zeroed: what an interrupted-and-resumed run must
    /// reproduce exactly.
    pub fn without_timings(&self) -> StepLog {
        StepLog {
            rollout_seconds: 0.0,
            update_seconds: 0.0,
            eval_seconds: 0.0,
            ..self.clone()
        }
    }
}

fn question_ids(e: &Evaluation) -> Vec<String> {
    e.per_question.iter().map(|q| q.id.clone()).collect()
}

fn question_rewards(e: &Evaluation) -> Vec<f64> {
    e.per_question.iter().map(|q| q.reward).collect()
}

/// The log file of a run folder, open for appending.
#[derive(Debug)]
pub struct LogFile {
    path: PathBuf,
    file: File,
}

/// A log read back for a resume: its whole lines, and whether a torn last line (one
/// a crash or a full disk cut short: no final newline, not a step line) was dropped.
#[derive(Debug)]
pub struct ReadBack {
    /// Every whole line, in order.
    pub lines: Vec<StepLog>,
    /// The 1-based number of the torn last line that was left out.
    pub torn_line: Option<usize>,
}

impl LogFile {
    /// `DIR/log.jsonl` for a fresh run, created empty; an existing one is an error
    /// ([`LoopError::RunExists`]), never truncated.
    pub fn create_new(dir: &Path) -> Result<Self, LoopError> {
        let path = dir.join("log.jsonl");
        let file = File::options()
            .append(true)
            .create_new(true)
            .open(&path)
            .map_err(|e| match e.kind() {
                std::io::ErrorKind::AlreadyExists => LoopError::RunExists(dir.to_path_buf()),
                _ => LoopError::Io(path.clone(), e),
            })?;
        durable::sync_parent(&path).map_err(|e| LoopError::Io(dir.to_path_buf(), e))?;
        Ok(LogFile { path, file })
    }

    /// `DIR/log.jsonl` cut back to the lines of steps `0..=last_step` (what a resume
    /// from the checkpoint of `last_step` keeps), which are returned with whether a
    /// torn last line was dropped. The kept lines replace the log through a synced
    /// `log.jsonl.partial` and a rename (`durable::replace_file`): a crash at any point leaves the old log or
    /// the new one whole, so the next resume has the history either way.
    pub fn resume(dir: &Path, last_step: u64) -> Result<(Self, ReadBack), LoopError> {
        let path = dir.join("log.jsonl");
        let read = read_log_for_resume(&path)?;
        let kept: Vec<StepLog> = read
            .lines
            .into_iter()
            .filter(|l| l.step <= last_step)
            .collect();
        if kept.last().map(|l| l.step) != Some(last_step) {
            return Err(LoopError::Resume {
                path,
                message: format!("the log has no line for the checkpoint's step {last_step}"),
            });
        }
        let io = |e| LoopError::Io(path.clone(), e);
        let mut text = String::new();
        for line in &kept {
            text.push_str(&serde_json::to_string(line).expect("a step line serialises"));
            text.push('\n');
        }
        durable::replace_file(&path, text.as_bytes()).map_err(io)?;
        let file = File::options().append(true).open(&path).map_err(io)?;
        let read = ReadBack {
            lines: kept,
            torn_line: read.torn_line,
        };
        Ok((LogFile { path, file }, read))
    }

    /// Appends one line and syncs it to disk.
    pub fn append(&mut self, line: &StepLog) -> Result<(), LoopError> {
        let io = |e| LoopError::Io(self.path.clone(), e);
        let mut text = serde_json::to_string(line).expect("a step line serialises");
        // One write of the whole line: a crash cuts at most this line short.
        text.push('\n');
        self.file.write_all(text.as_bytes()).map_err(io)?;
        self.file.sync_data().map_err(io)
    }
}

/// Every line of a `log.jsonl`; a bad line is an error naming file and line.
pub fn read_log(path: &Path) -> Result<Vec<StepLog>, LoopError> {
    let text = std::fs::read_to_string(path).map_err(|e| LoopError::Io(path.to_path_buf(), e))?;
    parse_lines(path, &text, text.lines().count())
}

/// [`read_log`] that drops a torn last line (no final newline and not a step line:
/// the write a crash or a full disk cut short) instead of failing on it. A bad line
/// anywhere else is still an error: that is not what an interrupted append leaves.
pub fn read_log_for_resume(path: &Path) -> Result<ReadBack, LoopError> {
    let text = std::fs::read_to_string(path).map_err(|e| LoopError::Io(path.to_path_buf(), e))?;
    let count = text.lines().count();
    let last = text.lines().last().unwrap_or_default();
    let torn = !text.ends_with('\n')
        && !last.trim().is_empty()
        && serde_json::from_str::<StepLog>(last).is_err();
    let whole = if torn { count - 1 } else { count };
    Ok(ReadBack {
        lines: parse_lines(path, &text, whole)?,
        torn_line: torn.then_some(count),
    })
}

/// The first `take` lines of `text` (blank ones skipped) as step lines.
fn parse_lines(path: &Path, text: &str, take: usize) -> Result<Vec<StepLog>, LoopError> {
    text.lines()
        .take(take)
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
        .map(|(i, l)| {
            serde_json::from_str(l).map_err(|source| LoopError::LogLine {
                path: path.to_path_buf(),
                line: i + 1,
                source,
            })
        })
        .collect()
}

/// serde's `skip_serializing_if` for counts that older logs do not have.
fn is_zero(n: &usize) -> bool {
    *n == 0
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::closed_loop::QuestionReward;

    fn evaluation() -> Evaluation {
        let q = |id: &str, reward| QuestionReward {
            id: id.to_string(),
            reward,
        };
        Evaluation {
            mean_reward: 0.6,
            prompts: 2,
            seconds: 1.5,
            per_question: vec![q("calc-7", 1.0), q("calc-3", 0.2)],
        }
    }

    #[test]
    fn an_eval_line_carries_each_questions_reward_and_old_lines_still_read() {
        let line = StepLog::before_training(4, Some(&evaluation()));
        assert_eq!(line.eval_reward, Some(0.6));
        assert_eq!(line.eval_seconds, 1.5);
        assert_eq!(
            line.eval_per_question(),
            Some(vec![("calc-7", 1.0), ("calc-3", 0.2)])
        );
        let text = serde_json::to_string(&line).unwrap();
        assert!(
            text.contains(r#""eval_question_ids":["calc-7","calc-3"],"eval_rewards":[1.0,0.2]"#),
            "{text}"
        );
        assert_eq!(serde_json::from_str::<StepLog>(&text).unwrap(), line);

        // Without an evaluation (and so in a line an older build wrote) the fields
        // are absent, and such a line reads back with none.
        let bare = StepLog::before_training(4, None);
        let text = serde_json::to_string(&bare).unwrap();
        assert!(!text.contains("eval_rewards") && !text.contains("eval_question_ids"));
        let read: StepLog = serde_json::from_str(&text).unwrap();
        assert_eq!(read.eval_per_question(), None);
        assert_eq!((read.eval_rewards, read.eval_question_ids), (None, None));

        // Ids and rewards that do not match up pair nothing.
        let torn = StepLog {
            eval_rewards: Some(vec![1.0]),
            ..line
        };
        assert_eq!(torn.eval_per_question(), None);
    }
}
