//! `summary.json`: what the comparison found, read back from the runs' logs — per arm
//! the seeds, each seed's final eval reward and computed tokens, the eval curve
//! (mean over seeds, with its min and max), and per step the learning signal (shares
//! of prompts and trees with mixed rewards, mean |intra| and |inter| advantage) and
//! rollouts; and each arm against the chain baseline, paired by seed and question
//! ([`paired`](super::paired)). Built from files alone, so a resumed comparison gives
//! the same summary.

use std::collections::BTreeMap;
use std::path::Path;

use serde::{Deserialize, Serialize};

use super::arm::Arm;
use super::error::CompareError;
use super::paired::{pair, paired_difference, PairedDiff};
use super::plan::{run_dir, ComparePlan};
use super::start::StartRecord;
use crate::closed_loop::{read_log, StepLog};

/// The summary's file.
pub const SUMMARY_FILE: &str = "summary.json";

/// Per-step figures of an arm, averaged over its seeds.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StepSignal {
    /// The step (1-based).
    pub step: u64,
    /// Mean rollout reward.
    pub reward: f64,
    /// Trajectories trained on.
    pub rollouts: f64,
    /// Tokens computed by the step's rollouts.
    pub computed: f64,
    /// Mean trees (chains) grown per prompt.
    pub trees_per_prompt: f64,
    /// Share of prompts whose leaves' rewards differ.
    pub mixed_prompt_share: f64,
    /// Share of branched trees whose leaves' rewards differ (`None` for chains).
    pub mixed_tree_share: Option<f64>,
    /// Mean |intra-tree advantage| (`None` for chains).
    pub intra_abs_mean: Option<f64>,
    /// Mean |inter-tree advantage|.
    pub inter_abs_mean: f64,
    /// Mean agent steps before a fork ([`BranchingStats`](crate::rollout::BranchingStats); `None` for chains and
    /// logs before it was recorded, as are the six below).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fork_depth_mean: Option<f64>,
    /// Mean agent steps of a branched tree's leaf.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub leaf_depth_mean: Option<f64>,
    /// Mean share of a leaf's tokens after what it shares with a sibling.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub own_token_share: Option<f64>,
    /// Share of sibling leaf pairs that gave the same final answer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub answer_agreement: Option<f64>,
    /// Share of a branched tree's leaves equal to a sibling token for token.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub identical_leaf_share: Option<f64>,
    /// Share of sibling leaf pairs whose tool calls (tool and query) differ.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_calls_differ_share: Option<f64>,
    /// Share of sibling leaf pairs whose observations differ.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observations_differ_share: Option<f64>,
}

/// One arm's results.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ArmSummary {
    /// Its seeds (the rollout seed of each run).
    pub seeds: Vec<u64>,
    /// Each seed's last eval reward.
    pub final_eval: Vec<f64>,
    /// Each seed's cumulative computed tokens at its end.
    pub computed_tokens: Vec<u64>,
    /// `[tokens, eval]`: the mean over seeds at each evaluation, the shared start
    /// first.
    pub curve: Vec<[f64; 2]>,
    /// `[tokens, min, max]` over seeds at each evaluation: the spread.
    pub spread: Vec<[f64; 3]>,
    /// Mean and (population) standard deviation of `final_eval`.
    pub final_eval_mean: f64,
    /// See `final_eval_mean`.
    pub final_eval_std: f64,
    /// Per step, averaged over seeds.
    pub steps: Vec<StepSignal>,
    /// The final evaluation against [`Summary::chain_arm`]'s, paired by seed and
    /// question (absent for that arm itself, without a chain arm, and where the logs
    /// have no per-question rewards: written by older builds).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vs_chain: Option<PairedDiff>,
}

/// The whole `summary.json`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Summary {
    /// The task's name.
    pub task: String,
    /// Test questions each evaluation ran.
    pub eval_questions: usize,
    /// Training steps of every run.
    pub steps: u64,
    /// Computed tokens each step's rollouts spent, for every arm.
    pub step_budget: u64,
    /// The shared start's eval reward (every curve's first point).
    pub start_eval: f64,
    /// Every arm by name, in the plan's order of names.
    pub arms: BTreeMap<String, ArmSummary>,
    /// The baseline every arm's `vs_chain` is against: the arm named `chain`, else
    /// the plan's first chain arm (absent without one).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub chain_arm: Option<String>,
    /// Largest arm mean of computed tokens over the smallest, less one: how far the
    /// budgets differ (the comparison asks for under 0.05).
    pub budget_spread: f64,
}

fn mean(values: impl IntoIterator<Item = f64>) -> f64 {
    let (sum, n) = values
        .into_iter()
        .fold((0.0, 0usize), |(s, n), v| (s + v, n + 1));
    sum / n.max(1) as f64
}

fn mean_some(values: impl IntoIterator<Item = Option<f64>>) -> Option<f64> {
    let v: Vec<f64> = values.into_iter().flatten().collect();
    (!v.is_empty()).then(|| mean(v))
}

/// The eval points of a run: its start, then each evaluated step.
fn eval_points(start: f64, log: &[StepLog]) -> Vec<(f64, f64)> {
    std::iter::once((0.0, start))
        .chain(log.iter().filter(|l| l.step > 0).filter_map(|l| {
            l.eval_reward
                .map(|e| (l.tokens.cumulative_computed as f64, e))
        }))
        .collect()
}

fn arm_summary(seeds: Vec<u64>, logs: &[Vec<StepLog>], start: f64) -> ArmSummary {
    let points: Vec<Vec<(f64, f64)>> = logs.iter().map(|l| eval_points(start, l)).collect();
    let n_points = points.iter().map(Vec::len).min().unwrap_or(0);
    let (mut curve, mut spread) = (Vec::new(), Vec::new());
    for i in 0..n_points {
        let x = mean(points.iter().map(|p| p[i].0));
        let ys: Vec<f64> = points.iter().map(|p| p[i].1).collect();
        let lo = ys.iter().copied().fold(f64::INFINITY, f64::min);
        let hi = ys.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        curve.push([x, mean(ys.iter().copied())]);
        spread.push([x, lo, hi]);
    }
    let final_eval: Vec<f64> = points
        .iter()
        .map(|p| p.last().map_or(start, |l| l.1))
        .collect();
    let m = mean(final_eval.iter().copied());
    let std = mean(final_eval.iter().map(|v| (v - m) * (v - m))).sqrt();
    let steps_n = logs
        .iter()
        .map(|l| l.iter().filter(|s| s.step > 0).count())
        .min()
        .unwrap_or(0);
    let steps = (1..=steps_n as u64)
        .map(|step| {
            let lines: Vec<&StepLog> = logs
                .iter()
                .filter_map(|l| l.iter().find(|s| s.step == step))
                .collect();
            let signal =
                |f: &dyn Fn(&StepLog) -> Option<f64>| mean_some(lines.iter().map(|l| f(l)));
            StepSignal {
                step,
                reward: mean(lines.iter().map(|l| l.reward_mean)),
                rollouts: mean(lines.iter().map(|l| l.rollouts as f64)),
                computed: mean(lines.iter().map(|l| l.tokens.computed as f64)),
                trees_per_prompt: mean(
                    lines
                        .iter()
                        .map(|l| mean(l.trees_per_prompt.iter().map(|&t| t as f64))),
                ),
                mixed_prompt_share: signal(&|l| l.signal.map(|s| s.mixed_prompt_share))
                    .unwrap_or(0.0),
                mixed_tree_share: signal(&|l| l.signal.and_then(|s| s.mixed_tree_share)),
                intra_abs_mean: signal(&|l| l.signal.and_then(|s| s.intra_abs_mean)),
                inter_abs_mean: signal(&|l| l.signal.map(|s| s.inter_abs_mean)).unwrap_or(0.0),
                fork_depth_mean: signal(&|l| l.branching.map(|b| b.fork_depth_mean)),
                leaf_depth_mean: signal(&|l| l.branching.map(|b| b.leaf_depth_mean)),
                own_token_share: signal(&|l| l.branching.map(|b| b.own_token_share)),
                answer_agreement: signal(&|l| l.branching.map(|b| b.answer_agreement)),
                identical_leaf_share: signal(&|l| l.branching.map(|b| b.identical_leaf_share)),
                tool_calls_differ_share: signal(&|l| {
                    l.branching.and_then(|b| b.tool_calls_differ_share)
                }),
                observations_differ_share: signal(&|l| {
                    l.branching.and_then(|b| b.observations_differ_share)
                }),
            }
        })
        .collect();
    ArmSummary {
        seeds,
        final_eval,
        computed_tokens: logs
            .iter()
            .map(|l| l.last().map_or(0, |s| s.tokens.cumulative_computed))
            .collect(),
        curve,
        spread,
        final_eval_mean: m,
        final_eval_std: std,
        steps,
        vs_chain: None,
    }
}

/// The baseline of the paired comparison: `chain` itself, else the first chain arm.
fn chain_arm(arms: &[Arm]) -> Option<&Arm> {
    arms.iter()
        .find(|a| a.name() == "chain")
        .or_else(|| arms.iter().find(|a| a.shape.is_chains()))
}

/// A run's final evaluation by question: the last evaluated step's (`None`: it has
/// none, or its log predates per-question rewards).
fn final_by_question(log: &[StepLog]) -> Option<Vec<(&str, f64)>> {
    log.iter()
        .rev()
        .find(|l| l.step > 0 && l.eval_reward.is_some())?
        .eval_per_question()
}

/// `arm` against `chain`, seed index by seed index (the same rollout seed), over the
/// seeds both ran.
fn vs_chain(arm: &[Vec<StepLog>], chain: &[Vec<StepLog>]) -> Option<PairedDiff> {
    let seeds: Vec<Vec<f64>> = arm
        .iter()
        .zip(chain)
        .filter_map(|(a, c)| Some(pair(&final_by_question(a)?, &final_by_question(c)?)))
        .collect();
    paired_difference(&seeds)
}

impl Summary {
    /// The summary of the finished runs of `plan` in `out`.
    pub fn collect(
        plan: &ComparePlan,
        out: &Path,
        start: &StartRecord,
    ) -> Result<Self, CompareError> {
        let start_eval = start.eval_reward.unwrap_or(0.0);
        let mut arms = BTreeMap::new();
        let mut logs_of = BTreeMap::new();
        for arm in &plan.arms {
            let n = plan.seeds_of(arm);
            let mut logs = Vec::with_capacity(n);
            for k in 0..n {
                logs.push(read_log(&run_dir(out, arm, k).join("log.jsonl"))?);
            }
            let seeds = (0..n).map(|k| plan.seed + k as u64).collect();
            arms.insert(
                arm.name().to_string(),
                arm_summary(seeds, &logs, start_eval),
            );
            logs_of.insert(arm.name(), logs);
        }
        let chain = chain_arm(&plan.arms).map(|a| a.name().to_string());
        if let Some(chain) = &chain {
            let chain_logs = &logs_of[chain.as_str()];
            for (name, a) in arms.iter_mut().filter(|(name, _)| *name != chain) {
                a.vs_chain = vs_chain(&logs_of[name.as_str()], chain_logs);
            }
        }
        let totals: Vec<f64> = arms
            .values()
            .map(|a| mean(a.computed_tokens.iter().map(|&t| t as f64)))
            .collect();
        let lo = totals.iter().copied().fold(f64::INFINITY, f64::min);
        let hi = totals.iter().copied().fold(0.0, f64::max);
        Ok(Summary {
            task: plan.task.to_string(),
            eval_questions: plan.eval_prompts,
            steps: plan.steps,
            step_budget: plan.step_budget,
            start_eval,
            arms,
            chain_arm: chain,
            budget_spread: if lo > 0.0 { hi / lo - 1.0 } else { 0.0 },
        })
    }

    /// Reads `summary.json` from `out`.
    pub fn read(out: &Path) -> Result<Self, CompareError> {
        let path = out.join(SUMMARY_FILE);
        let text = std::fs::read_to_string(&path).map_err(|e| CompareError::Io(path.clone(), e))?;
        serde_json::from_str(&text).map_err(|e| CompareError::Json(path, e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::closed_loop::{Evaluation, QuestionReward};

    /// A run's log whose step `step` evaluated `rewards` on questions q0, q1, ….
    fn log(step: u64, rewards: &[f64]) -> Vec<StepLog> {
        let eval = Evaluation {
            mean_reward: rewards.iter().sum::<f64>() / rewards.len() as f64,
            prompts: rewards.len(),
            seconds: 0.0,
            per_question: rewards
                .iter()
                .enumerate()
                .map(|(i, &reward)| QuestionReward {
                    id: format!("q{i}"),
                    reward,
                })
                .collect(),
        };
        let mut last = StepLog::before_training(0, Some(&eval));
        last.step = step;
        vec![StepLog::before_training(0, None), last]
    }

    #[test]
    fn vs_chain_pairs_final_evals_by_seed_index_and_question() {
        // Seed 0: (1 − 0.5) and (0.25 − 0.25); seed 1: (0.5 − 0.75) and (1 − 0.5).
        // Mean (0.5 + 0 − 0.25 + 0.5) / 4 = 0.1875; the arm's third seed has no chain
        // seed to pair with.
        let arm = [
            log(2, &[1.0, 0.25]),
            log(2, &[0.5, 1.0]),
            log(2, &[0.0, 0.0]),
        ];
        let chain = [log(2, &[0.5, 0.25]), log(2, &[0.75, 0.5])];
        let d = vs_chain(&arm, &chain).unwrap();
        assert_eq!((d.mean_diff, d.seeds_paired, d.questions), (0.1875, 2, 2));
        assert!(d.ci_low <= d.mean_diff && d.mean_diff <= d.ci_high, "{d:?}");

        // A run whose log predates per-question rewards pairs nothing.
        let mut old = log(2, &[1.0, 0.25]);
        for line in &mut old {
            (line.eval_question_ids, line.eval_rewards) = (None, None);
        }
        assert_eq!(vs_chain(&[old], &chain[..1]), None);
        // Only the step-0 line evaluated: no final evaluation after training.
        assert_eq!(vs_chain(&[log(0, &[1.0])], &[log(0, &[0.0])]), None);
    }

    #[test]
    fn the_baseline_is_chain_else_the_first_chain_arm() {
        let arms =
            |names: &[&str]| -> Vec<Arm> { names.iter().map(|n| n.parse().unwrap()).collect() };
        let name = |a: &[Arm]| chain_arm(a).map(|a| a.name().to_string());
        assert_eq!(
            name(&arms(&["tree", "chain-2", "chain"])).as_deref(),
            Some("chain")
        );
        assert_eq!(
            name(&arms(&["tree", "chain-2", "chain-1"])).as_deref(),
            Some("chain-2")
        );
        assert_eq!(name(&arms(&["tree", "tree-inter"])), None);
    }
}
