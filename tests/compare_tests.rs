//! `treegrpo compare` as a user runs it, at a tiny scale: the calc task, two arms
//! (a (1,2,1) tree arm and a chain arm), one seed, two steps of two prompts, on a tiny
//! model the test writes (HF layout, 2 layers of width 64) — what is checked is the
//! comparison's bookkeeping, which does not depend on the model's size:
//!
//! - `summary.json` has the shape, and `eval.svg` and `report.md` are written;
//! - every eval line of every log carries each test question's reward by id, whose
//!   mean is the line's eval reward, and the tree arm's `vs_chain` is the mean of its
//!   final rewards minus chain's, question by question, inside its interval;
//! - every run kept to the step budget: the waves added trees (chains) until each
//!   step's share was spent, what a step overran carried to the next, so after step
//!   `k` every run computed `k ×` the budget up to what one tree costs;
//! - every run started from the shared warm-start's weights, bit for bit (the hash each
//!   run recorded equals the hash of the warm-start checkpoint loaded here, which
//!   differs from the untrained model's), and the tree and chain arms saw the same
//!   prompts in the same order at every step (the training split after the
//!   warm-start's questions);
//! - a comparison interrupted by SIGINT in the middle of its first run, then rerun
//!   with the same command, writes the same summary and the same logs as one that was
//!   never interrupted; a rerun with more steps extends every run, one with more arms
//!   adds their runs; a rerun with other settings is refused;
//! - the added arm is a diverse tree (`-bt3k16n8`): its steps trained on boosted tokens,
//!   and the update saw their behaviour logprobs (a gap between its own logprobs and
//!   the rollouts' that is exactly 0 for the plain arms).

mod common;

use common::{run_ok, treegrpo};

use std::path::{Path, PathBuf};
use std::process::Stdio;

use candle_core::DType;
use serde_json::Value;
use treegrpo::closed_loop::{read_log, StepLog};
use treegrpo::compare::{weights_hash, StartRecord};
use treegrpo::env::{Split, Task, TaskData};
use treegrpo::model::LoadedModel;
use treegrpo::train::Params;

const STEPS: usize = 2;
const PROMPTS: usize = 2;
const WARM_START: usize = 2;
const BUDGET: u64 = 6000;
const ARMS: [&str; 2] = ["tree-1-2-1", "chain-2"];
/// The arm added on a rerun: a tree whose branches start from a wider distribution.
const DIVERSE: &str = "tree-1-2-1-bt3k16n8";

fn compare_args(out: &Path, model: &Path, seed: &str) -> Vec<String> {
    let (steps, prompts, warm, budget) = (
        STEPS.to_string(),
        PROMPTS.to_string(),
        WARM_START.to_string(),
        BUDGET.to_string(),
    );
    [
        "compare",
        "--task",
        "calc",
        "--arms",
        &ARMS.join(","),
        "--seeds",
        "1",
        "--steps",
        &steps,
        "--prompts-per-step",
        &prompts,
        "--token-budget",
        &budget,
        "--eval-every-tokens",
        &budget,
        "--eval-prompts",
        "2",
        "--warm-start",
        &warm,
        "--max-step-tokens",
        "16",
        "--turns",
        "1",
        "--lr",
        "1e-3",
        "--seed",
        seed,
        "--out",
        &out.display().to_string(),
        "--model",
        &model.display().to_string(),
    ]
    .map(String::from)
    .to_vec()
}

fn run_dir(out: &Path, arm: &str) -> PathBuf {
    out.join("runs").join(arm).join("seed-0")
}

fn timeless(out: &Path, arm: &str) -> Vec<StepLog> {
    read_log(&run_dir(out, arm).join("log.jsonl"))
        .unwrap()
        .iter()
        .map(StepLog::without_timings)
        .collect()
}

fn summary(out: &Path) -> Value {
    serde_json::from_str(&std::fs::read_to_string(out.join("summary.json")).unwrap()).unwrap()
}

#[test]
fn tiny_comparison_summary_budgets_starts_prompts_and_resume() {
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("model");
    common::tiny::write_long_context(&model, 5);

    // The whole comparison, never interrupted.
    let whole = dir.path().join("whole");
    run_ok(treegrpo().args(compare_args(&whole, &model, "3")));
    let s = summary(&whole);
    // Shown with --nocapture: what the tiny comparison measured.
    let report = std::fs::read_to_string(whole.join("report.md")).unwrap();
    eprintln!("{report}");
    assert!(report.contains("| tree-1-2-1 | 1 |"), "the branching table");
    for step in s["arms"]["tree-1-2-1"]["steps"].as_array().unwrap() {
        assert!(step["fork_depth_mean"].is_number(), "{step}");
        let identical = step["identical_leaf_share"].as_f64().unwrap();
        assert!((0.0..=1.0).contains(&identical), "{step}");
    }
    for step in s["arms"]["chain-2"]["steps"].as_array().unwrap() {
        assert!(step.get("fork_depth_mean").is_none(), "{step}");
        assert!(step.get("identical_leaf_share").is_none(), "{step}");
    }
    assert_eq!(s["task"], "calc");
    assert_eq!(s["eval_questions"], 2);
    // The tree arm against the chain arm (the plan's only one), paired by seed and
    // question; the chain arm is not compared with itself.
    assert_eq!(s["chain_arm"], ARMS[1]);
    assert!(s["arms"][ARMS[1]].get("vs_chain").is_none());
    let vs = &s["arms"][ARMS[0]]["vs_chain"];
    let figure = |key: &str| vs[key].as_f64().unwrap_or_else(|| panic!("{key}: {vs}"));
    let (mean_diff, ci_low, ci_high) = (figure("mean_diff"), figure("ci_low"), figure("ci_high"));
    assert!(ci_low <= mean_diff && mean_diff <= ci_high, "{vs}");
    assert!(
        (-1.0..=1.0).contains(&ci_low) && (-1.0..=1.0).contains(&ci_high),
        "{vs}"
    );
    assert_eq!(
        (&vs["seeds_paired"], &vs["questions"]),
        (&1.into(), &2.into())
    );
    assert_eq!(vs["beats_chain"], ci_low > 0.0, "{vs}");
    assert!(
        report.contains("## Against chain-2 (paired by seed and question)"),
        "the paired table"
    );
    assert!(report.contains("| tree-1-2-1 | 1 | 2 |"), "the paired row");
    for arm in ARMS {
        let a = &s["arms"][arm];
        assert_eq!(a["seeds"], serde_json::json!([3]), "{arm}");
        assert_eq!(a["final_eval"].as_array().unwrap().len(), 1, "{arm}");
        assert_eq!(a["computed_tokens"].as_array().unwrap().len(), 1, "{arm}");
        let curve = a["curve"].as_array().unwrap();
        assert!(curve.len() >= 2, "{arm}: start and at least the last eval");
        assert_eq!(
            curve[0][0], 0.0,
            "{arm}: the curve starts at the shared start"
        );
        assert_eq!(curve[0][1], s["start_eval"], "{arm}");
        for point in curve {
            assert_eq!(point.as_array().unwrap().len(), 2, "{arm}: [tokens, eval]");
        }
    }
    for file in ["eval.svg", "report.md", "compare.json"] {
        assert!(whole.join(file).exists(), "{file}");
    }

    // Equal budgets: every run's cumulative tokens after step k are k × the budget,
    // to within what one tree (chain) costs, and the waves grew more than the first
    // wave's trees to get there.
    let logs: Vec<Vec<StepLog>> = ARMS.iter().map(|arm| timeless(&whole, arm)).collect();

    // Every evaluation's reward per test question, by id in the test split's order;
    // their mean is the eval reward. The tree arm's mean difference is its final
    // rewards minus chain's, question by question.
    let test_ids: Vec<String> = Task::Calc
        .split(&TaskData::Embedded, Split::Test, 2)
        .unwrap()
        .iter()
        .map(|q| q.id.to_string())
        .collect();
    let mut finals = Vec::new();
    for (arm, log) in ARMS.iter().zip(&logs) {
        let evals: Vec<&StepLog> = log.iter().filter(|l| l.eval_reward.is_some()).collect();
        assert!(!evals.is_empty(), "{arm}: no eval line");
        for line in &evals {
            let per_question = line.eval_per_question().unwrap();
            let ids: Vec<&str> = per_question.iter().map(|q| q.0).collect();
            assert_eq!(ids, test_ids, "{arm} step {}", line.step);
            let mean = per_question.iter().map(|q| q.1).sum::<f64>() / 2.0;
            let eval = line.eval_reward.unwrap();
            assert!(
                (mean - eval).abs() < 1e-12,
                "{arm} step {}: {mean} against {eval}",
                line.step
            );
        }
        for line in log.iter().filter(|l| l.eval_reward.is_none()) {
            assert!(
                line.eval_rewards.is_none() && line.eval_question_ids.is_none(),
                "{arm}"
            );
        }
        finals.push(evals.last().unwrap().eval_rewards.clone().unwrap());
    }
    let diffs: Vec<f64> = finals[0]
        .iter()
        .zip(&finals[1])
        .map(|(t, c)| t - c)
        .collect();
    let mean = diffs.iter().sum::<f64>() / diffs.len() as f64;
    assert!((mean - mean_diff).abs() < 1e-12, "{mean} against {vs}");
    for (arm, log) in ARMS.iter().zip(&logs) {
        assert_eq!(log.len(), STEPS + 1, "{arm}");
        for line in log.iter().filter(|l| l.step > 0) {
            let trees: usize = line.trees_per_prompt.iter().sum();
            let per_tree = line.tokens.computed as f64 / trees as f64;
            // What a step overran or fell short by is carried to the next: the
            // run's cumulative tokens stay within a tree of step × budget.
            let target = BUDGET as f64 * line.step as f64;
            let off = (line.tokens.cumulative_computed as f64 - target).abs();
            assert!(
                off <= per_tree,
                "{arm} step {}: {} cumulative tokens for {target} ({per_tree:.0} a tree)",
                line.step,
                line.tokens.cumulative_computed
            );
            assert!(
                trees > PROMPTS,
                "{arm} step {}: the budget grew no tree beyond the first wave's one a prompt: {:?}",
                line.step,
                line.trees_per_prompt
            );
            assert!(line.signal.is_some(), "{arm}: the step's signal is logged");
            // Trees log where their branches forked; chains have none.
            match (arm.starts_with("tree"), line.branching) {
                (true, Some(b)) => {
                    assert!(b.branched_trees > 0 && b.forks > 0, "{arm}: {b:?}");
                    assert!(b.fork_depth_mean < b.leaf_depth_mean, "{arm}: {b:?}");
                    for share in [b.own_token_share, b.answer_agreement] {
                        assert!((0.0..=1.0).contains(&share), "{arm}: {b:?}");
                    }
                }
                (false, None) => {}
                (_, b) => panic!("{arm} step {}: branching {b:?}", line.step),
            }
        }
    }
    let spread = s["budget_spread"].as_f64().unwrap();
    assert!(spread < 0.25, "arms' computed tokens differ by {spread}");

    // The same start, bit for bit: the hash each run recorded is the warm-start
    // checkpoint's, computed here from the files, and not the untrained model's.
    let warm = whole.join("warm-start");
    let hash_of = |path: &Path| {
        let m = LoadedModel::load(path).unwrap();
        weights_hash(&Params::from_model(&m.model, DType::F32).unwrap()).unwrap()
    };
    let warm_hash = hash_of(&warm);
    assert_ne!(
        warm_hash,
        hash_of(&model),
        "the warm-start changed no weight"
    );
    assert_eq!(StartRecord::read(&warm).unwrap().weights_fnv1a64, warm_hash);
    for arm in ARMS {
        let recorded = StartRecord::read(&run_dir(&whole, arm)).unwrap();
        assert_eq!(recorded.weights_fnv1a64, warm_hash, "{arm}");
    }

    // The same prompts in the same order per step: the training split after the
    // warm-start's questions, two a step.
    let train = Task::Calc
        .split(&TaskData::Embedded, Split::Train, usize::MAX)
        .unwrap();
    for step in 1..=STEPS {
        let start = WARM_START + (step - 1) * PROMPTS;
        let expected: Vec<String> = train[start..start + PROMPTS]
            .iter()
            .map(|q| q.id.to_string())
            .collect();
        for (arm, log) in ARMS.iter().zip(&logs) {
            assert_eq!(log[step].prompt_ids, expected, "{arm} step {step}");
        }
    }

    // Interrupted in the middle of the first run (after its first step), then rerun.
    let cut = dir.path().join("cut");
    let mut child = treegrpo()
        .args(compare_args(&cut, &model, "3"))
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let first_log = run_dir(&cut, ARMS[0]).join("log.jsonl");
    common::wait_for_log_lines(&mut child, &first_log, 2);
    common::interrupt(&child);
    let output = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(130), "stderr: {stderr}");
    assert!(
        !cut.join("summary.json").exists(),
        "no summary before the end"
    );
    assert!(
        read_log(&first_log).unwrap().len() < STEPS + 1,
        "the interrupt landed after the first run's end"
    );
    run_ok(treegrpo().args(compare_args(&cut, &model, "3")));
    assert_eq!(summary(&cut), s, "the resumed comparison's summary");
    for arm in ARMS {
        assert_eq!(timeless(&cut, arm), timeless(&whole, arm), "{arm}'s log");
    }

    // More steps extend the comparison: every run continues from its checkpoint.
    let mut more = compare_args(&cut, &model, "3");
    let at = more.iter().position(|a| a == "--steps").unwrap() + 1;
    more[at] = (STEPS + 1).to_string();
    run_ok(treegrpo().args(&more));
    let extended = summary(&cut);
    assert_eq!(extended["steps"], STEPS + 1);
    for arm in ARMS {
        let log = timeless(&cut, arm);
        assert_eq!(log.len(), STEPS + 2, "{arm}: one more step");
        assert_eq!(
            log[..STEPS + 1],
            timeless(&whole, arm)[..],
            "{arm}: the first steps kept"
        );
    }

    // More arms add their runs; the others are kept as they are. The added arm is a
    // diverse tree: its branches' first 8 tokens drawn at T = 3 from the top 16.
    let mut wider = more.clone();
    let at = wider.iter().position(|a| a == "--arms").unwrap() + 1;
    wider[at] = format!("{},{DIVERSE}", ARMS.join(","));
    run_ok(treegrpo().args(&wider));
    let widened = summary(&cut);
    assert_eq!(widened["arms"][ARMS[0]], extended["arms"][ARMS[0]]);
    assert_eq!(widened["arms"][DIVERSE]["seeds"], serde_json::json!([3]));
    assert!(widened["arms"][DIVERSE]["vs_chain"]["mean_diff"].is_number());

    // The behaviour logprobs reach the update: a plain arm's trainer logprobs equal
    // its rollouts' bit for bit (one decoder, on-policy), the diverse arm's boosted
    // tokens were drawn from another distribution than the policy's, and the update
    // measured that gap against what the rollouts recorded — had it been handed the
    // policy's logprobs, the gap would be 0 there too.
    for arm in ARMS {
        for line in timeless(&cut, arm).iter().filter(|l| l.step > 0) {
            assert_eq!(line.boosted_tokens, 0, "{arm} step {}", line.step);
            assert_eq!(
                line.rollout_logprob_diff_max,
                Some(0.0),
                "{arm} step {}",
                line.step
            );
        }
    }
    let diverse = timeless(&cut, DIVERSE);
    assert_eq!(diverse.len(), STEPS + 2, "{DIVERSE}: every step");
    for line in diverse.iter().filter(|l| l.step > 0) {
        assert!(
            line.boosted_tokens > 0,
            "step {}: nothing boosted",
            line.step
        );
        let gap = line.rollout_logprob_diff_max.unwrap();
        assert!(
            gap > 0.0,
            "step {}: the update saw no boosted token",
            line.step
        );
    }
    // Fewer arms than the folder's is another experiment.
    let output = treegrpo()
        .args(compare_args(&cut, &model, "3"))
        .output()
        .unwrap();
    assert!(
        !output.status.success(),
        "a rerun with fewer arms and steps was taken"
    );

    // Other settings in the same folder are refused, naming what differs.
    let mut reseeded = wider.clone();
    let at = reseeded.iter().position(|a| a == "--seed").unwrap() + 1;
    reseeded[at] = "4".into();
    let output = treegrpo().args(&reseeded).output().unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("seed differs"), "stderr: {stderr}");
}
