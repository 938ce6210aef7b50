//! `report.md`: the comparison for a reader — the regime it ran in, the table of
//! final eval rewards (mean ± std over seeds) with what each arm spent, each arm
//! against chain as a paired difference with its 95% interval and whether it beats
//! chain, and per step the learning signal that separates the arms: rollouts per
//! step, the share of prompts and of trees whose rewards are mixed, and the mean
//! |intra| and |inter| advantage. Beyond the verdict the interval gives, the
//! interpretation is left to the reader (and the notes): numbers only.

use std::fmt::Write;
use std::path::Path;

use super::error::CompareError;
use super::paired::{PairedDiff, RESAMPLES};
use super::plan::ComparePlan;
use super::summary::{Summary, SUMMARY_FILE};
use crate::view::plot::{bands_svg, Band};

/// The plot's file.
pub const PLOT_FILE: &str = "eval.svg";
/// The report's file.
pub const REPORT_FILE: &str = "report.md";

fn opt(v: Option<f64>) -> String {
    v.map_or_else(|| "–".to_string(), |v| format!("{v:.3}"))
}

/// What the interval says, in words.
fn verdict(d: &PairedDiff, chain: &str) -> String {
    if d.beats_chain {
        "yes: the whole interval is above 0".to_string()
    } else if d.ci_high < 0.0 {
        format!("no: worse than {chain} (the whole interval is below 0)")
    } else {
        "no: the interval includes 0".to_string()
    }
}

/// The table of every arm against the chain arm (nothing without one).
fn against_chain(r: &mut String, plan: &ComparePlan, s: &Summary) {
    let Some(chain) = &s.chain_arm else {
        return;
    };
    let _ = writeln!(r, "\n## Against {chain} (paired by seed and question)\n");
    let _ = writeln!(
        r,
        "Each difference is an arm's final greedy reward on one test question minus \
         {chain}'s on the same question, in the runs of the same seed; the mean is over \
         every (seed, question) pair. The 95% interval is a two-level bootstrap \
         ({RESAMPLES} resamples of the seeds, then of the questions within each seed \
         drawn; percentiles 2.5 and 97.5). An arm beats {chain} when the whole interval \
         is above 0.\n"
    );
    let _ = writeln!(
        r,
        "| arm | seeds paired | questions | mean difference | 95% interval | beats {chain}? |"
    );
    let _ = writeln!(r, "|---|---|---|---|---|---|");
    for arm in plan.arms.iter().filter(|a| a.name() != chain) {
        let Some(a) = s.arms.get(arm.name()) else {
            continue;
        };
        match &a.vs_chain {
            Some(d) => {
                let _ = writeln!(
                    r,
                    "| {} | {} | {} | {:+.3} | [{:+.3}, {:+.3}] | {} |",
                    arm.name(),
                    d.seeds_paired,
                    d.questions,
                    d.mean_diff,
                    d.ci_low,
                    d.ci_high,
                    verdict(d, chain)
                );
            }
            None => {
                let _ = writeln!(
                    r,
                    "| {} | 0 | – | – | – | not paired: the logs have no per-question rewards |",
                    arm.name()
                );
            }
        }
    }
}

/// The report's Markdown.
pub fn report(plan: &ComparePlan, s: &Summary) -> String {
    let mut r = String::new();
    regime(&mut r, plan, s);
    final_eval_table(&mut r, plan, s);
    against_chain(&mut r, plan, s);
    signal_table(&mut r, plan, s);
    fork_table(&mut r, plan, s);
    r
}

/// The title and the paragraph on the regime every arm ran in (weights, budget,
/// prompts, steps, sampling), then the plot.
fn regime(r: &mut String, plan: &ComparePlan, s: &Summary) {
    let _ = writeln!(r, "# Learning comparison: {}\n", s.task);
    let _ = writeln!(
        r,
        "Every arm starts from the same weights (a warm-start on {} demonstrations, \
         eval {:.3}) and spends {} computed tokens per step on the same {} prompts per \
         step, for {} steps; evaluation is greedy on {} test questions. Sampling \
         temperature {}, {} tool turns, {} tokens per step, learning rate {}. The \
         arms' mean computed tokens differ by {:.1}%.\n",
        plan.warm_start,
        s.start_eval,
        s.step_budget,
        plan.prompts_per_step,
        s.steps,
        s.eval_questions,
        plan.temperature,
        plan.turns,
        plan.max_step_tokens,
        plan.optimizer.lr,
        100.0 * s.budget_spread
    );
    let _ = writeln!(r, "![eval reward against computed tokens](eval.svg)\n");
}

/// The table of final eval rewards per arm (mean ± std and per seed) with the
/// computed tokens and rollouts per step each arm spent.
fn final_eval_table(r: &mut String, plan: &ComparePlan, s: &Summary) {
    let _ = writeln!(
        r,
        "| arm | seeds | final eval (mean ± std) | per seed | computed tokens (mean) | rollouts / step |"
    );
    let _ = writeln!(r, "|---|---|---|---|---|---|");
    for arm in &plan.arms {
        let Some(a) = s.arms.get(arm.name()) else {
            continue;
        };
        let per_seed: Vec<String> = a.final_eval.iter().map(|v| format!("{v:.2}")).collect();
        let tokens =
            a.computed_tokens.iter().sum::<u64>() as f64 / a.computed_tokens.len().max(1) as f64;
        let rollouts =
            a.steps.iter().map(|st| st.rollouts).sum::<f64>() / a.steps.len().max(1) as f64;
        let _ = writeln!(
            r,
            "| {} | {} | {:.3} ± {:.3} | {} | {:.0} | {:.1} |",
            arm.name(),
            a.seeds.len(),
            a.final_eval_mean,
            a.final_eval_std,
            per_seed.join(", "),
            tokens,
            rollouts
        );
    }
}

/// The per-step learning-signal table (reward, rollouts, mixed shares, mean
/// |intra| and |inter| advantage) for every arm.
fn signal_table(r: &mut String, plan: &ComparePlan, s: &Summary) {
    let _ = writeln!(r, "\n## Learning signal per step (mean over seeds)\n");
    let _ = writeln!(
        r,
        "Mixed: the share of prompts (trees) whose leaves' rewards are not all equal — \
         only those give non-zero inter-tree (intra-tree) advantages.\n"
    );
    let _ = writeln!(
        r,
        "| arm | step | reward | rollouts | trees/prompt | mixed prompts | mixed trees | mean abs intra | mean abs inter |"
    );
    let _ = writeln!(r, "|---|---|---|---|---|---|---|---|---|");
    for arm in &plan.arms {
        let Some(a) = s.arms.get(arm.name()) else {
            continue;
        };
        for st in &a.steps {
            let _ = writeln!(
                r,
                "| {} | {} | {:.3} | {:.1} | {:.2} | {:.2} | {} | {} | {:.3} |",
                arm.name(),
                st.step,
                st.reward,
                st.rollouts,
                st.trees_per_prompt,
                st.mixed_prompt_share,
                opt(st.mixed_tree_share),
                opt(st.intra_abs_mean),
                st.inter_abs_mean
            );
        }
    }
}

/// The per-step table of where the branches fork, for the arms whose steps record
/// a fork depth (tree arms); nothing when no arm does.
fn fork_table(r: &mut String, plan: &ComparePlan, s: &Summary) {
    let branched: Vec<_> = plan
        .arms
        .iter()
        .filter_map(|arm| s.arms.get(arm.name()).map(|a| (arm, a)))
        .filter(|(_, a)| a.steps.iter().any(|st| st.fork_depth_mean.is_some()))
        .collect();
    if branched.is_empty() {
        return;
    }
    let _ = writeln!(
        r,
        "\n## Where the branches fork (tree arms, mean over seeds)\n"
    );
    let _ = writeln!(
        r,
        "Fork depth: agent steps the branches share before they part; own tokens: the \
         share of a leaf's response after the longest prefix it shares with a sibling; \
         same answer: the share of sibling pairs that gave the same final answer (such \
         pairs earn the same reward, so give no intra-tree credit); identical: the share of \
         leaves equal to a sibling token for token (a tree of identical leaves is a \
         chain that cost less); other calls, other observations: the share of sibling \
         pairs whose tool calls (tool and query), or the observations they got, differ \
         (branches that see the same observations explored nothing; – in logs before \
         they were recorded).\n"
    );
    let _ = writeln!(
        r,
        "| arm | step | fork depth | leaf depth | own tokens | same answer | identical \
         | other calls | other observations |"
    );
    let _ = writeln!(r, "|---|---|---|---|---|---|---|---|---|");
    for (arm, a) in branched {
        for st in &a.steps {
            let _ = writeln!(
                r,
                "| {} | {} | {} | {} | {} | {} | {} | {} | {} |",
                arm.name(),
                st.step,
                opt(st.fork_depth_mean),
                opt(st.leaf_depth_mean),
                opt(st.own_token_share),
                opt(st.answer_agreement),
                opt(st.identical_leaf_share),
                opt(st.tool_calls_differ_share),
                opt(st.observations_differ_share)
            );
        }
    }
}

/// Writes `summary.json`, `eval.svg` and `report.md` into `out`.
pub fn write_outputs(
    plan: &ComparePlan,
    out: &Path,
    summary: &Summary,
) -> Result<(), CompareError> {
    let write = |name: &str, text: String| {
        let path = out.join(name);
        std::fs::write(&path, text).map_err(|e| CompareError::Io(path, e))
    };
    write(
        SUMMARY_FILE,
        serde_json::to_string_pretty(summary).expect("a summary serialises") + "\n",
    )?;
    let bands: Vec<Band> = plan
        .arms
        .iter()
        .filter_map(|arm| {
            let a = summary.arms.get(arm.name())?;
            Some(Band {
                label: format!(
                    "{} ({} seed{})",
                    arm.name(),
                    a.seeds.len(),
                    if a.seeds.len() == 1 { "" } else { "s" }
                ),
                mean: a.curve.iter().map(|p| (p[0], p[1])).collect(),
                low: a.spread.iter().map(|p| (p[0], p[1])).collect(),
                high: a.spread.iter().map(|p| (p[0], p[2])).collect(),
            })
        })
        .collect();
    let title = format!(
        "{}: greedy eval reward ({} questions)",
        summary.task, summary.eval_questions
    );
    write(PLOT_FILE, bands_svg(&title, &bands, 900, 560)?)?;
    write(REPORT_FILE, report(plan, summary))
}
