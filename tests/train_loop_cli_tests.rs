//! `treegrpo train` and `treegrpo sft` as a user runs them, on the calc task with
//! settings small enough for a test (one prompt a step, 16-token steps), on a tiny
//! model the test writes (HF layout, 2 layers of width 64): what these tests check is
//! the loop's bookkeeping, which does not depend on the model's size, and the default
//! model's loop is tested in `train_loop_tests` (CI time):
//!
//! - SIGINT during a run stops it with status 130, leaving `log.jsonl` whole (every
//!   line valid JSON) and the last checkpoint loadable; `--resume` continues it, and
//!   the resumed log equals an uninterrupted run's line for line (timings aside);
//!   `reward.svg` is written.
//! - `treegrpo sft` writes an HF checkpoint that `treegrpo train --model` starts from.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use treegrpo::closed_loop::{read_log, StepLog};

/// Steps of the test's run: enough that an interrupt after step 1 lands mid-run.
const STEPS: usize = 24;

fn treegrpo() -> Command {
    Command::new(env!("CARGO_BIN_EXE_treegrpo"))
}

/// A tiny HF model (seeded random weights, byte-level vocabulary, ChatML) in
/// `dir/model`, with room for the calc prompt.
fn tiny_model(dir: &Path) -> PathBuf {
    let path = dir.join("model");
    common::tiny::write_long_context(&path, 5);
    path
}

/// The test's small run, writing into `out` (or resuming it).
fn train_args(out: &Path, resume: bool) -> Vec<String> {
    let steps = STEPS.to_string();
    let mut args: Vec<String> = [
        "train",
        "--task",
        "calc",
        "--steps",
        steps.as_str(),
        "--prompts-per-step",
        "1",
        "--trees",
        "1",
        "--expand",
        "2",
        "--max-step-tokens",
        "16",
        "--turns",
        "1",
        "--eval-prompts",
        "1",
        "--lr",
        "1e-3",
        "--seed",
        "11",
    ]
    .map(String::from)
    .to_vec();
    if !resume {
        // A frozen KL reference: the resumed run must take it from run.json and
        // restore its weights from the run folder.
        args.extend(["--kl-reference".into(), "start".into()]);
    }
    args.push(if resume { "--resume" } else { "--out" }.into());
    args.push(out.display().to_string());
    args
}

/// Runs `cmd` to the end and fails the test with its stderr unless it succeeded.
fn run_ok(cmd: &mut Command) {
    let output = cmd.stdout(Stdio::null()).output().unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
}

fn timeless(dir: &Path) -> Vec<StepLog> {
    read_log(&dir.join("log.jsonl"))
        .unwrap()
        .iter()
        .map(StepLog::without_timings)
        .collect()
}

#[test]
fn sigint_leaves_log_and_checkpoint_whole_and_resume_reproduces_the_uninterrupted_log() {
    let dir = tempfile::tempdir().unwrap();
    let model = tiny_model(dir.path());

    let whole = dir.path().join("whole");
    run_ok(
        treegrpo()
            .args(train_args(&whole, false))
            .arg("--model")
            .arg(&model),
    );
    let expected = timeless(&whole);
    assert_eq!(expected.len(), STEPS + 1);
    assert!(
        expected[STEPS].kl > 0.0,
        "KL against the start weights after {} updates",
        STEPS - 1
    );
    assert!(whole.join("reward.svg").exists());

    let cut = dir.path().join("cut");
    let mut child = treegrpo()
        .args(train_args(&cut, false))
        .arg("--model")
        .arg(&model)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Interrupt once step 1 is logged (and so checkpointed: every step is).
    let log = cut.join("log.jsonl");
    common::wait_for_log_lines(&mut child, &log, 2);
    common::interrupt(&child);
    let output = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    let lines = read_log(&log).expect("every line of the log is whole");
    assert!(
        lines.len() < STEPS + 1,
        "the interrupt landed after the run's last step: give it more steps"
    );
    assert_eq!(output.status.code(), Some(130), "stderr: {stderr}");
    assert!(stderr.contains("--resume"), "stderr: {stderr}");
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(text.ends_with('\n'), "the log ends mid-line");
    let state: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(cut.join("checkpoint/loop_state.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(
        state["step"].as_u64(),
        lines.last().map(|l| l.step),
        "the checkpoint is the last logged step's"
    );
    // The checkpoint is an HF directory the product loads.
    treegrpo::model::LoadedModel::load(&cut.join("checkpoint")).unwrap();

    run_ok(treegrpo().args(train_args(&cut, true)));
    assert_eq!(timeless(&cut), expected);
}

#[test]
fn sft_writes_a_checkpoint_that_train_starts_from() {
    let dir = tempfile::tempdir().unwrap();
    let model = tiny_model(dir.path());
    let ck = dir.path().join("sft");
    run_ok(
        treegrpo()
            .args([
                "sft",
                "--task",
                "calc",
                "--examples",
                "4",
                "--epochs",
                "1",
                "--batch-size",
                "4",
                "--model",
            ])
            .arg(&model)
            .arg("--out")
            .arg(&ck),
    );
    let summary: serde_json::Value =
        serde_json::from_slice(&std::fs::read(ck.join("sft_summary.json")).unwrap()).unwrap();
    assert_eq!(summary["demonstrations"], 4);
    assert_eq!(summary["demonstration_reward"], 1.0);
    assert_eq!(summary["steps"], 1);
    let sft_log = std::fs::read_to_string(ck.join("sft_log.jsonl")).unwrap();
    assert_eq!(sft_log.lines().count(), 1);

    let run = dir.path().join("run");
    let mut args = train_args(&run, false);
    args[4] = "1".into(); // one step
    run_ok(treegrpo().args(args).arg("--model").arg(&ck));
    let lines = read_log(&run.join("log.jsonl")).unwrap();
    assert_eq!(lines.len(), 2);
    assert!(lines[1].rollouts > 0);
    let recorded: serde_json::Value =
        serde_json::from_slice(&std::fs::read(run.join("run.json")).unwrap()).unwrap();
    assert_eq!(recorded["model"].as_str(), ck.to_str());
}
