//! The run records (`closed_loop::record`): `run.json` and the warm-start's record as
//! typed structs, shared by `treegrpo train`, `treegrpo sft` and the Python `Trainer`.
//!
//! - a record written is the record read back, and `run.json` keeps the field names
//!   the untyped writer gave it;
//! - backward compatibility: a `run.json` exactly as the untyped writer wrote it, and
//!   every run folder committed under `benchmarks/` (written by earlier builds: no
//!   `kl_reference`, one without `warm_start`), read as the new struct, with the
//!   defaults those builds ran with;
//! - a missing or corrupt `run.json` is a `LoopError` naming the file (never a
//!   panic), from the library and from `treegrpo train --resume`;
//! - how a run starts: a resumed run takes the model and warm-start size of its
//!   record, and RL prompts always start after the warm-start's questions;
//! - (a tiny model the test writes) `treegrpo train --warm-start` and `treegrpo sft`
//!   run the one warm-start and write records that read back; a resume keeps the
//!   run's record.

mod common;

use common::{run_ok, treegrpo};

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use treegrpo::advantage::AdvantageMode;
use treegrpo::closed_loop::{
    LoopConfig, LoopError, RunRecord, RunSource, RunStart, SftStepLog, WarmStartRecord,
    RUN_RECORD_FILE, SFT_LOG_FILE, SFT_SUMMARY_FILE, WARM_START_FILE,
};
use treegrpo::engine::Sampling;
use treegrpo::env::{QaSample, Task, TaskData};
use treegrpo::model::kernels::WeightFormat;
use treegrpo::rollout::{Selection, TreeConfig, TreeShape};
use treegrpo::train::{KlReference, LossAgg, OptimizerConfig, OptimizerKind, UpdateConfig};

/// `run.json` as `treegrpo train` wrote it before the record was typed (an untyped
/// `serde_json::json!` object, so its keys sorted): `--warm-start 32 --kl-reference
/// start`, (2, 2, 1) trees at temperature 1, `--lr 1e-5`, 96-token steps.
const UNTYPED_RUN_JSON: &str = r#"{
  "advantage": "tree",
  "config": {
    "expand": 2,
    "keep": null,
    "max_step_tokens": 96,
    "prefix_reuse": true,
    "rounds": 1,
    "sampling": {
      "Random": {
        "min_p": null,
        "temperature": 1.0,
        "top_k": null,
        "top_p": null
      }
    },
    "seed": 0,
    "selection": "paper",
    "trees": 2
  },
  "kl_reference": "start",
  "lr": 0.00001,
  "model": "/root/.cache/treegrpo/SmolLM2-135M-Instruct.Q4_1.gguf",
  "optimizer": {
    "beta1": 0.9,
    "beta2": 0.999,
    "eps": 1e-8,
    "kind": "adamw",
    "lr": 0.00001,
    "warmup_steps": 0,
    "weight_decay": 0.01
  },
  "prompts_per_step": 8,
  "steps": 2,
  "task": "search-qa",
  "update": {
    "loss": {
      "agg": "token-mean",
      "clip_c": 3.0,
      "clip_high": 0.2,
      "clip_low": 0.2,
      "entropy_coef": 0.001,
      "kl_coef": 0.001,
      "tis_cap": 2.0
    },
    "max_grad_norm": 1.0,
    "micro_batch_tokens": 2048,
    "packed": true,
    "temperature": 1.0
  },
  "warm_start": 32
}
"#;

/// The loop settings of [`UNTYPED_RUN_JSON`].
fn loop_config() -> LoopConfig {
    let sampling = Sampling::new(1.0, None, None, None).unwrap();
    let mut tree = TreeConfig::new(TreeShape::tree(2, 2, 1, Selection::Paper), sampling, 0);
    tree.max_step_tokens = 96;
    LoopConfig {
        step_budget: None,
        eval_every_tokens: 0,
        eval_before: true,
        boosted_tokens: Default::default(),
        steps: 2,
        prompts_per_step: 8,
        tree,
        advantage: AdvantageMode::Tree,
        concurrent_prompts: 16,
        update: UpdateConfig {
            micro_batch_tokens: 2048,
            temperature: 1.0,
            ..UpdateConfig::default()
        },
        eval_every: 0,
        eval_prompts: 20,
        checkpoint_every: 1,
        serve_format: WeightFormat::F32,
        kl_reference: KlReference::Start,
    }
}

fn optimizer() -> OptimizerConfig {
    OptimizerConfig {
        lr: 1e-5,
        ..OptimizerConfig::default()
    }
}

fn source() -> RunSource {
    RunSource {
        model: PathBuf::from("/root/.cache/treegrpo/SmolLM2-135M-Instruct.Q4_1.gguf"),
        task: Some(Task::SearchQa),
        warm_start: 32,
    }
}

fn keys(v: &serde_json::Value) -> BTreeSet<String> {
    v.as_object().unwrap().keys().cloned().collect()
}

#[test]
fn a_run_record_written_is_the_record_read_back() {
    let dir = tempfile::tempdir().unwrap();
    let record = RunRecord::new(&source(), &loop_config(), &optimizer());
    record.write(dir.path()).unwrap();
    assert_eq!(RunRecord::read(dir.path()).unwrap(), record);
    assert_eq!(record.source(), source());
    let text = std::fs::read_to_string(dir.path().join(RUN_RECORD_FILE)).unwrap();
    assert!(text.ends_with("}\n"), "pretty JSON with a final newline");
    // Nothing but the record is left in the folder (the write goes through a
    // sibling file renamed into place).
    let names: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names, [RUN_RECORD_FILE]);
}

#[test]
fn run_json_keeps_the_field_names_and_values_of_the_untyped_writer() {
    let dir = tempfile::tempdir().unwrap();
    RunRecord::new(&source(), &loop_config(), &optimizer())
        .write(dir.path())
        .unwrap();
    let mut written: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.path().join(RUN_RECORD_FILE)).unwrap()).unwrap();
    let untyped: serde_json::Value = serde_json::from_str(UNTYPED_RUN_JSON).unwrap();
    // Fields added since the untyped writer, each with the value older records read
    // as: the update's treatment of branch-sampled tokens (issue 54).
    let added = written.as_object_mut().unwrap().remove("boosted_tokens");
    assert_eq!(added, Some(serde_json::json!("corrected")));
    assert_eq!(keys(&written), keys(&untyped));
    assert_eq!(written, untyped, "the same JSON, key order aside");
}

#[test]
fn run_json_as_the_untyped_writer_wrote_it_reads_as_the_record() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join(RUN_RECORD_FILE), UNTYPED_RUN_JSON).unwrap();
    let r = RunRecord::read(dir.path()).unwrap();
    assert_eq!(r, RunRecord::new(&source(), &loop_config(), &optimizer()));
    assert_eq!(r.kl_reference, KlReference::Start);
    assert_eq!(r.warm_start, 32);
    assert_eq!(r.task, Some(Task::SearchQa));
    assert_eq!(r.optimizer.kind, OptimizerKind::AdamW);
    assert_eq!(r.update.loss.agg, LossAgg::TokenMean);
    assert_eq!(r.config.max_step_tokens, 96);
}

/// Every `run.json` under `benchmarks/` (run folders committed by earlier builds).
fn committed_run_folders() -> Vec<PathBuf> {
    let mut found = Vec::new();
    let mut dirs = vec![Path::new(env!("CARGO_MANIFEST_DIR")).join("benchmarks")];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.file_name().is_some_and(|n| n == RUN_RECORD_FILE) {
                found.push(dir.clone());
            }
        }
    }
    found.sort();
    found
}

#[test]
fn every_committed_run_folder_of_earlier_builds_reads() {
    let folders = committed_run_folders();
    assert!(!folders.is_empty(), "benchmarks/ holds run folders");
    let mut without_warm_start = 0;
    for dir in &folders {
        let raw: serde_json::Value =
            serde_json::from_slice(&std::fs::read(dir.join(RUN_RECORD_FILE)).unwrap()).unwrap();
        let r = RunRecord::read(dir).unwrap_or_else(|e| panic!("{}: {e:?}", dir.display()));
        // Builds before the KL reference choice ran against the previous policy;
        // builds before the warm-start had none.
        if raw.get("kl_reference").is_none() {
            assert_eq!(r.kl_reference, KlReference::Previous);
        }
        match raw.get("warm_start") {
            None => {
                assert_eq!(r.warm_start, 0);
                without_warm_start += 1;
            }
            Some(w) => assert_eq!(Some(r.warm_start as u64), w.as_u64()),
        }
        assert_eq!(r.model.to_str(), raw["model"].as_str());
        assert_eq!(Some(r.steps), raw["steps"].as_u64());
        // Read, then written by this build: every field it had is kept as it was.
        let rewritten = serde_json::to_value(&r).unwrap();
        for (key, value) in raw.as_object().unwrap() {
            let mut value = value.clone();
            if key == "config" {
                // Records of builds before min_p: the field is added, as null.
                let sampling = &mut value["sampling"]["Random"];
                if sampling.is_object() && sampling.get("min_p").is_none() {
                    sampling["min_p"] = serde_json::Value::Null;
                }
            }
            assert_eq!(rewritten[key], value, "{}: {key}", dir.display());
        }
    }
    assert!(without_warm_start > 0, "one folder predates the warm-start");
    for dir in folders.iter().filter(|d| d.join(WARM_START_FILE).exists()) {
        let w = WarmStartRecord::read(dir, WARM_START_FILE).unwrap();
        assert_eq!(
            w.task, None,
            "earlier builds' warm_start.json names no task"
        );
        assert!(w.demonstrations > 0);
        assert_eq!(w.eval_reward_after, None);
    }
}

#[test]
fn a_warm_start_record_and_its_log_round_trip() {
    let dir = tempfile::tempdir().unwrap();
    let record = WarmStartRecord {
        task: Some(Task::Calc),
        demonstrations: 4,
        demonstration_reward: 1.0,
        model_tokens: 120,
        epochs: 1,
        lr: 1e-4,
        steps: 2,
        first_nll: Some(2.5),
        last_nll: Some(1.25),
        seconds: 3.0,
        eval_prompts: 5,
        eval_reward_before: Some(0.0),
        eval_reward_after: Some(0.4),
    };
    let steps: Vec<SftStepLog> = (1..=2)
        .map(|step| SftStepLog {
            epoch: 0,
            step,
            nll: 2.5 / step as f64,
            grad_norm: 1.0,
            tokens: 60,
            lr: 1e-4,
            seconds: 1.5,
        })
        .collect();
    for file in [WARM_START_FILE, SFT_SUMMARY_FILE] {
        record.write(dir.path(), file, &steps).unwrap();
        assert_eq!(WarmStartRecord::read(dir.path(), file).unwrap(), record);
    }
    let log = std::fs::read_to_string(dir.path().join(SFT_LOG_FILE)).unwrap();
    let read: Vec<SftStepLog> = log
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(read, steps);
}

/// The message of `e` with its causes, as the CLI prints it (`{e:#}`).
fn chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        text += &format!(": {c}");
        cause = c.source();
    }
    text
}

#[test]
fn a_missing_or_corrupt_run_json_is_an_error_naming_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(RUN_RECORD_FILE);
    let e = RunRecord::read(dir.path()).unwrap_err();
    assert!(
        matches!(&e, LoopError::RecordMissing(p) if *p == path),
        "{e:?}"
    );
    assert!(e.to_string().contains(&path.display().to_string()), "{e}");
    assert_eq!(RunRecord::read_if_present(dir.path()).unwrap(), None);

    let corrupt = [
        "",
        "{\"model\": \"m.gguf\", \"steps\": 2",
        "not json at all",
        &UNTYPED_RUN_JSON.replace("\"steps\": 2", "\"steps\": \"two\""),
        &UNTYPED_RUN_JSON.replace(
            "\"kl_reference\": \"start\"",
            "\"kl_reference\": \"initial\"",
        ),
        &UNTYPED_RUN_JSON.replace(
            "  \"model\": \"/root/.cache/treegrpo/SmolLM2-135M-Instruct.Q4_1.gguf\",\n",
            "",
        ),
    ];
    for text in corrupt {
        std::fs::write(&path, text).unwrap();
        for e in [
            RunRecord::read(dir.path()).unwrap_err(),
            RunRecord::read_if_present(dir.path()).unwrap_err(),
        ] {
            assert!(
                matches!(&e, LoopError::Record { path: p, .. } if *p == path),
                "{e:?}"
            );
            let message = chain(&e);
            assert!(
                message.starts_with(&format!("{}: not a valid run record: ", path.display())),
                "{message}"
            );
            // The cause is printed once.
            assert_eq!(message.matches("not a valid run record").count(), 1);
        }
    }
    // A warm-start record likewise.
    std::fs::write(dir.path().join(WARM_START_FILE), "[1, 2]").unwrap();
    let e = WarmStartRecord::read(dir.path(), WARM_START_FILE).unwrap_err();
    assert!(matches!(e, LoopError::Record { .. }), "{e:?}");
}

#[test]
fn train_resume_of_a_folder_without_a_valid_run_json_names_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(RUN_RECORD_FILE);
    let resume = || {
        treegrpo()
            .args(["train", "--task", "calc", "--resume"])
            .arg(dir.path())
            .output()
            .unwrap()
    };
    let output = resume();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains(&format!("{} is missing", path.display())),
        "{stderr}"
    );

    std::fs::write(&path, "{\"model\": ").unwrap();
    let output = resume();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains(&format!("{}: not a valid run record", path.display())),
        "{stderr}"
    );
    assert!(!stderr.contains("panicked"), "{stderr}");
}

/// The calc task's first `n` training questions.
fn questions(n: usize) -> Vec<QaSample> {
    Task::Calc.samples(&TaskData::Embedded, n).unwrap()
}

#[test]
fn a_resumed_run_starts_from_its_record_and_rl_prompts_follow_the_warm_start() {
    let fresh = RunStart::fresh(None, 3);
    assert!(fresh.warm_starts_now());
    let (demos, rl) = fresh.split_train(questions(10));
    assert_eq!(demos, questions(3));
    assert_eq!(rl, questions(10)[3..]);
    let (demos, rl) = RunStart::fresh(None, 0).split_train(questions(2));
    assert!(demos.is_empty());
    assert_eq!(rl, questions(2));

    let dir = tempfile::tempdir().unwrap();
    RunRecord::new(&source(), &loop_config(), &optimizer())
        .write(dir.path())
        .unwrap();
    let resumed = RunStart::resume(dir.path(), None).unwrap();
    assert_eq!(resumed.model, Some(source().model));
    assert_eq!(resumed.warm_start, 32);
    assert!(!resumed.warm_starts_now(), "its warm-start ran before");
    let (demos, rl) = resumed.split_train(questions(40));
    assert!(demos.is_empty());
    assert_eq!(
        rl,
        questions(40)[32..],
        "the same RL prompts as the fresh run"
    );
    let other = PathBuf::from("other.gguf");
    assert_eq!(
        RunStart::resume(dir.path(), Some(other.clone()))
            .unwrap()
            .model,
        Some(other),
        "--model names another model"
    );
}

/// `treegrpo train` on calc at a test's size (one prompt a step, 16-token steps).
const SMALL_TRAIN: [&str; 15] = [
    "train",
    "--task",
    "calc",
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
];

#[test]
fn train_warm_start_and_sft_write_records_that_read_back() {
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("model");
    common::tiny::write_long_context(&model, 5);
    let run = dir.path().join("run");
    run_ok(
        treegrpo()
            .args(SMALL_TRAIN)
            .args([
                "--steps",
                "1",
                "--warm-start",
                "4",
                "--warm-start-epochs",
                "1",
            ])
            .arg("--model")
            .arg(&model)
            .arg("--out")
            .arg(&run),
    );
    let record = RunRecord::read(&run).unwrap();
    assert_eq!(record.model, model);
    assert_eq!(record.task, Some(Task::Calc));
    assert_eq!(record.warm_start, 4);
    assert_eq!(record.steps, 1);
    let warm = WarmStartRecord::read(&run, WARM_START_FILE).unwrap();
    assert_eq!(warm.task, Some(Task::Calc));
    assert_eq!(warm.demonstrations, 4);
    assert_eq!(warm.epochs, 1);
    assert_eq!((warm.eval_prompts, warm.eval_reward_after), (1, None));
    assert!(warm.eval_reward_before.is_some());
    let sft_log = std::fs::read_to_string(run.join(SFT_LOG_FILE)).unwrap();
    assert_eq!(sft_log.lines().count(), warm.steps);

    // Resumed for one more step: the model and warm-start come from run.json, which
    // stays the run's as it was started.
    run_ok(
        treegrpo()
            .args(SMALL_TRAIN)
            .args(["--steps", "2", "--resume"])
            .arg(&run),
    );
    assert_eq!(RunRecord::read(&run).unwrap(), record);
    let lines = treegrpo::closed_loop::read_log(&run.join("log.jsonl")).unwrap();
    assert_eq!(lines.iter().map(|l| l.step).collect::<Vec<_>>(), [0, 1, 2]);

    let ck = dir.path().join("sft");
    let stdout = run_ok(
        treegrpo()
            .args(["sft", "--task", "calc", "--examples", "4", "--epochs", "1"])
            .args(["--batch-size", "4", "--eval-prompts", "1"])
            .args(["--max-step-tokens", "16", "--turns", "1", "--model"])
            .arg(&model)
            .arg("--out")
            .arg(&ck),
    );
    let summary = WarmStartRecord::read(&ck, SFT_SUMMARY_FILE).unwrap();
    let printed: WarmStartRecord = serde_json::from_str(stdout.trim()).unwrap();
    assert_eq!(printed, summary, "stdout is the summary");
    assert_eq!(summary.task, Some(Task::Calc));
    assert_eq!((summary.demonstrations, summary.steps), (4, 1));
    assert_eq!(summary.eval_prompts, 1);
    assert!(summary.eval_reward_before.is_some() && summary.eval_reward_after.is_some());
    assert!(ck.join("config.json").exists(), "an HF checkpoint");
}
