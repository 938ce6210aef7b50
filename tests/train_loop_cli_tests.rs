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
//! - No run loses its history: `--out` on a folder holding a run is refused and
//!   leaves it byte for byte; a resume after a crash (a half-written copy of the log,
//!   a torn last line, a checkpoint save stopped between its two renames) goes on
//!   with every whole line, and so does one killed while it resumes; `--overwrite`
//!   starts over.

mod common;

use common::{run_ok, treegrpo};

use std::path::{Path, PathBuf};
use std::process::Stdio;

use treegrpo::closed_loop::{read_log, StepLog};

/// Steps of the test's run: enough that an interrupt after step 1 lands mid-run.
const STEPS: usize = 24;

/// A tiny HF model (seeded random weights, byte-level vocabulary, ChatML) in
/// `dir/model`, with room for the calc prompt.
fn tiny_model(dir: &Path) -> PathBuf {
    let path = dir.join("model");
    common::tiny::write_long_context(&path, 5);
    path
}

/// The test's small run, writing into `out` (or resuming it).
fn train_args(out: &Path, resume: bool) -> Vec<String> {
    train_args_for(out, resume, STEPS)
}

/// [`train_args`] with `steps` steps.
fn train_args_for(out: &Path, resume: bool, steps: usize) -> Vec<String> {
    let steps = steps.to_string();
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

/// The bytes of `dir`'s files that hold the run's history.
fn history_bytes(dir: &Path) -> Vec<Vec<u8>> {
    [
        "log.jsonl",
        "run.json",
        "checkpoint/loop_state.json",
        "checkpoint/model.safetensors",
    ]
    .iter()
    .map(|f| std::fs::read(dir.join(f)).unwrap())
    .collect()
}

#[test]
fn no_run_loses_its_history_to_a_rerun_a_crash_or_a_killed_resume() {
    use std::os::unix::fs::MetadataExt;
    let dir = tempfile::tempdir().unwrap();
    let model = tiny_model(dir.path());
    let run = dir.path().join("run");
    let train = |resume: bool, steps: usize| {
        let mut cmd = treegrpo();
        cmd.args(train_args_for(&run, resume, steps));
        if !resume {
            cmd.arg("--model").arg(&model);
        }
        cmd
    };
    run_ok(&mut train(false, 3));
    let original = timeless(&run);
    assert_eq!(original.len(), 4);

    // The same command again: refused, the run untouched.
    let before = history_bytes(&run);
    let output = train(false, 3).output().unwrap();
    assert!(!output.status.success(), "a second --out was taken");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("already holds a training run") && stderr.contains("--resume"),
        "stderr: {stderr}"
    );
    assert_eq!(
        history_bytes(&run),
        before,
        "the refused run touched the folder"
    );

    // What crashes leave: a checkpoint save stopped between its renames (the last
    // checkpoint moved aside, a half-written new one beside it), a torn last log line
    // (a full disk), and a half-written copy of the log from a resume cut short.
    let checkpoint = run.join("checkpoint");
    std::fs::rename(&checkpoint, run.join("checkpoint.previous")).unwrap();
    std::fs::create_dir(run.join("checkpoint.partial")).unwrap();
    std::fs::write(run.join("checkpoint.partial/config.json"), "{\"hidd").unwrap();
    let log = run.join("log.jsonl");
    let mut text = std::fs::read_to_string(&log).unwrap();
    text.push_str("{\"step\":4,\"weight_vers");
    std::fs::write(&log, &text).unwrap();
    std::fs::write(run.join("log.jsonl.partial"), "{\"step\":0").unwrap();
    let output = train(true, 5).stdout(Stdio::null()).output().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "stderr: {stderr}");
    assert!(stderr.contains("line 5 was cut short"), "stderr: {stderr}");
    assert!(
        stderr.contains("interrupted between its renames"),
        "stderr: {stderr}"
    );
    let resumed = timeless(&run);
    assert_eq!(resumed.len(), 6, "steps 0 to 5");
    assert_eq!(resumed[..4], original[..], "the history before the crash");
    for leftover in [
        "checkpoint.previous",
        "checkpoint.partial",
        "log.jsonl.partial",
    ] {
        assert!(!run.join(leftover).exists(), "{leftover} left behind");
    }

    // A resume killed (SIGKILL: no clean-up runs) just after it rewrote the log, and
    // one killed before: each leaves the history whole, and the next resume goes on.
    for wait_for_rewrite in [false, true] {
        let inode = std::fs::metadata(&log).unwrap().ino();
        let mut child = train(true, 7)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let start = std::time::Instant::now();
        while wait_for_rewrite
            && std::fs::metadata(&log).map(|m| m.ino()).unwrap_or(inode) == inode
            && start.elapsed() < std::time::Duration::from_secs(60)
        {
            assert!(
                child.try_wait().unwrap().is_none(),
                "the resume ended early"
            );
            std::thread::sleep(std::time::Duration::from_millis(2));
        }
        child.kill().unwrap();
        child.wait().unwrap();
        let lines = timeless(&run);
        assert!(lines.len() >= 6, "{} lines after the kill", lines.len());
        assert_eq!(lines[..6], resumed[..], "the history after the kill");
    }
    run_ok(&mut train(true, 7));
    let finished = timeless(&run);
    assert_eq!(finished.len(), 8, "steps 0 to 7");
    assert_eq!(finished[..6], resumed[..]);

    // --overwrite starts over: a fresh run, the same as the first one's start (its
    // last step, step 2, evaluates where the 3-step run's did not).
    run_ok(train(false, 2).arg("--overwrite"));
    let fresh = timeless(&run);
    assert_eq!(fresh.len(), 3);
    assert_eq!(fresh[..2], original[..2]);
}
