//! The real binary on the default model: what a user types, what they see.

mod common;

use common::treegrpo;

#[test]
fn generate_answers_the_capital_of_france_with_paris() {
    let model = common::default_model();
    let out = treegrpo()
        .args([
            "generate",
            "--prompt",
            "What is the capital of France?",
            "--model",
        ])
        .arg(&model)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "stderr: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("Paris"), "completion was: {stdout}");
}

/// `--min-tokens`: the answer ("Paris." and the end of the turn, a few tokens) may
/// not end before 24 tokens, so all 24 come; above `--max-tokens` it is refused.
#[test]
fn min_tokens_holds_off_the_end_of_the_answer() {
    let model = common::default_model();
    let generate = |extra: &[&str]| {
        treegrpo()
            .args(["generate", "--prompt", "What is the capital of France?"])
            .args(["--max-tokens", "24"])
            .args(extra)
            .arg("--model")
            .arg(&model)
            .output()
            .unwrap()
    };
    let free = generate(&[]);
    let held = generate(&["--min-tokens", "24"]);
    let stderr = |o: &std::process::Output| String::from_utf8_lossy(&o.stderr).into_owned();
    assert!(
        free.status.success() && held.status.success(),
        "{}",
        stderr(&held)
    );
    assert!(
        stderr(&free).contains("stop: StopToken"),
        "{}",
        stderr(&free)
    );
    assert!(stderr(&held).contains(" 24 generated"), "{}", stderr(&held));
    assert!(
        stderr(&held).contains("stop: MaxTokens"),
        "{}",
        stderr(&held)
    );
    let refused = generate(&["--min-tokens", "25"]);
    assert!(!refused.status.success());
    assert!(stderr(&refused).contains("min_tokens 25 is above max_tokens 24"));
}

#[test]
fn same_seed_same_sample() {
    let model = common::default_model();
    let run = |seed: &str| {
        let out = treegrpo()
            .args([
                "generate",
                "--prompt",
                "Tell me a short story.",
                "--max-tokens",
                "24",
            ])
            .args(["--temperature", "0.9", "--seed", seed, "--model"])
            .arg(&model)
            .output()
            .unwrap();
        assert!(out.status.success());
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    assert_eq!(run("7"), run("7"));
    assert_ne!(
        run("7"),
        run("8"),
        "different seeds should sample differently"
    );
}

#[test]
fn data_gen_reproduces_the_committed_calc_set() {
    let dir = tempfile::tempdir().unwrap();
    let status = treegrpo()
        .args(["data", "gen", "--task", "calc", "--seed"])
        .arg(treegrpo::env::datagen::COMMITTED_CALC_SEED.to_string())
        .arg("--out")
        .arg(dir.path())
        .status()
        .unwrap();
    assert!(status.success());
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("data/calc");
    for f in ["train.jsonl", "test.jsonl"] {
        let want = std::fs::read(root.join(f)).unwrap();
        let got = std::fs::read(dir.path().join(f)).unwrap();
        assert!(want == got, "{f} differs from the committed file");
    }
}

/// SIGINT in the middle of a run: the process stops with status 130, and the output
/// holds every finished tree as valid JSONL, with a summary that says so.
#[test]
fn an_interrupted_rollout_keeps_every_finished_tree() {
    let model = common::default_model();
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("run");
    let mut child = treegrpo()
        .args([
            "rollout",
            "--prompts",
            "40",
            "--concurrent-prompts",
            "1",
            "--max-step-tokens",
            "24",
            "--model",
        ])
        .arg(&model)
        .arg("--out")
        .arg(&out)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // Wait for the first finished forest, then interrupt (one prompt at a time, so
    // dozens are still to come however late the signal lands).
    let traj = out.join("trajectories.jsonl");
    // A hang guard, not a timing assertion: one forest takes about a minute alone,
    // far more on a machine busy with other tests.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(1800);
    while std::fs::metadata(&traj).map(|m| m.len()).unwrap_or(0) == 0 {
        assert!(std::time::Instant::now() < deadline, "no tree finished");
        if let Some(status) = child.try_wait().unwrap() {
            panic!("rollout ended before the interrupt: {status}");
        }
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
    let before = common::signal_masks(child.id());
    let after = common::interrupt(&child);
    let output = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(
        output.status.code(),
        Some(130),
        "signal masks before SIGINT: {before}; just after: {after}; stderr: {stderr}"
    );
    assert!(stderr.contains("interrupted"), "stderr: {stderr}");

    let summary: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("summary.json")).unwrap()).unwrap();
    assert_eq!(summary["interrupted"], true);
    assert_eq!(summary["precision"], "exact");
    let finished = summary["prompts_finished"].as_u64().unwrap() as usize;
    assert!((1..40).contains(&finished), "{finished} prompts finished");
    // Every line is whole JSON; every finished forest's trees and leaves are there.
    let lines = |f: &str| -> Vec<serde_json::Value> {
        let text = std::fs::read_to_string(out.join(f)).unwrap();
        assert!(text.is_empty() || text.ends_with('\n'), "{f} ends mid-line");
        text.lines()
            .map(|l| serde_json::from_str(l).expect("a valid JSON line"))
            .collect()
    };
    let trees = lines("forest.jsonl");
    let records = lines("trajectories.jsonl");
    assert_eq!(trees.len(), finished * 2, "M = 2 trees per finished prompt");
    assert_eq!(records.len() as u64, summary["rollouts"].as_u64().unwrap());
    let leaves: usize = trees
        .iter()
        .map(|t| {
            t["nodes"]
                .as_array()
                .unwrap()
                .iter()
                .filter(|n| n["terminal"] == true)
                .count()
        })
        .sum();
    assert_eq!(leaves, records.len());
}

/// `treegrpo bench --json` on one prompt: the documented shape, and figures that agree
/// with each other (rollouts per 10k tokens from rollouts and computed tokens).
#[test]
fn bench_prints_the_documented_json() {
    let model = common::default_model();
    let out = treegrpo()
        .args([
            "bench",
            "--prompts",
            "1",
            "--only",
            "chain-4,tree-1-2-1",
            "--max-step-tokens",
            "8",
            "--decode-batches",
            "2",
            "--decode-tokens",
            "4",
            "--prefill-tokens",
            "40",
            "--prefill-runs",
            "1",
            "--json",
            "--model",
        ])
        .arg(&model)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "stderr: {stderr}");
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(report["machine"]["threads"].as_u64().unwrap() >= 1);
    assert_eq!(report["precision"], "exact");
    let runs = report["runs"].as_array().unwrap();
    let labels: Vec<&str> = runs.iter().map(|r| r["label"].as_str().unwrap()).collect();
    assert_eq!(labels, ["chain-4", "tree-1-2-1"]);
    for r in runs {
        let rollouts = r["rollouts"].as_f64().unwrap();
        let computed = r["tokens"]["computed"].as_f64().unwrap();
        assert!(rollouts > 0.0 && computed > 0.0);
        let per_10k = r["rollouts_per_10k_tokens"].as_f64().unwrap();
        assert!((per_10k - rollouts * 1e4 / computed).abs() < 1e-9);
        for key in ["trees", "expand", "rounds", "keep", "selection", "chains"] {
            assert!(r["config"].get(key).is_some(), "config.{key}");
        }
        assert!(r["wall_seconds"].as_f64().unwrap() > 0.0);
    }
    assert_eq!(runs[0]["ratio_to_chain"].as_f64(), Some(1.0));
    assert_eq!(runs[0]["config"]["chains"], 4);
    // Ours first; a build with a peer feature adds the peer's figure after each,
    // carrying the ratio ours ÷ its (ours carries none).
    let (decode, prefill) = (&report["decode"], &report["prefill"]);
    for (figures, key, value) in [(decode, "batch", 2), (prefill, "tokens", 40)] {
        let figures = figures.as_array().unwrap();
        assert_eq!(figures[0]["engine"], "treegrpo");
        assert_eq!(figures[0][key], value);
        assert!(figures[0]["tokens_per_second"].as_f64().unwrap() > 0.0);
        assert!(figures[0]["treegrpo_ratio"].is_null());
        for peer in &figures[1..] {
            assert_eq!(peer[key], value);
            assert!(peer["treegrpo_ratio"].as_f64().unwrap() > 0.0, "{peer}");
        }
        let peers = usize::from(cfg!(feature = "llamacpp"))
            + usize::from(cfg!(feature = "mistralrs") && key == "batch");
        assert_eq!(figures.len(), 1 + peers, "{figures:?}");
    }
}

/// `--decode-batches` with no value skips the decode measurement and
/// `--prefill-tokens 0` the prefill one (the rows still run); `--precision fast` is
/// recorded in the report.
#[test]
fn bench_decode_batches_without_value_skips_decode() {
    let model = common::default_model();
    let out = treegrpo()
        .args([
            "bench",
            "--prompts",
            "1",
            "--only",
            "chain-4",
            "--max-step-tokens",
            "4",
            "--turns",
            "1",
            "--decode-batches",
            "--prefill-tokens",
            "0",
            "--precision",
            "fast",
            "--json",
            "--model",
        ])
        .arg(&model)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "stderr: {stderr}");
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["runs"].as_array().unwrap().len(), 1);
    assert_eq!(report["decode"].as_array().unwrap().len(), 0);
    assert_eq!(report["prefill"].as_array().unwrap().len(), 0);
    assert_eq!(report["precision"], "fast");
}

/// An unknown `--precision` is a usage error naming the choices, not a panic.
#[test]
fn unknown_precision_is_a_usage_error() {
    let out = treegrpo()
        .args(["generate", "--prompt", "hi", "--precision", "sloppy"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("exact or fast"), "stderr: {stderr}");
}

/// `TREEGRPO_STEP_LOG=FILE`: one JSON line per engine step whose rows add up to the
/// run's computed tokens; a path that cannot be created is an error, not a panic.
#[test]
fn the_step_log_accounts_for_every_computed_token() {
    let model = common::default_model();
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("steps.jsonl");
    let out = dir.path().join("run");
    let status = treegrpo()
        .args([
            "rollout",
            "--prompts",
            "1",
            "--max-step-tokens",
            "16",
            "--model",
        ])
        .arg(&model)
        .arg("--out")
        .arg(&out)
        .env("TREEGRPO_STEP_LOG", &log)
        .output()
        .unwrap();
    assert!(
        status.status.success(),
        "{}",
        String::from_utf8_lossy(&status.stderr)
    );
    let steps: Vec<serde_json::Value> = std::fs::read_to_string(&log)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).expect("a valid JSON line"))
        .collect();
    assert!(steps.len() > 1, "{} steps", steps.len());
    let field = |s: &serde_json::Value, k: &str| s[k].as_u64().unwrap_or_else(|| panic!("{k}"));
    for (i, s) in steps.iter().enumerate() {
        assert_eq!(field(s, "step"), i as u64 + 1);
        let (seqs, rows) = (field(s, "seqs"), field(s, "rows"));
        assert!(seqs >= 1 && rows >= seqs, "{s}");
        assert!(field(s, "decode_seqs") <= seqs, "{s}");
        assert!(field(s, "context") >= rows, "{s}");
        let distinct = field(s, "distinct_context");
        assert!(distinct >= 1 && distinct <= field(s, "context"), "{s}");
        for k in ["t_ms", "forward_ms", "sample_ms", "gap_ms"] {
            assert!(s[k].as_f64().is_some_and(|v| v >= 0.0), "{k} in {s}");
        }
    }
    let summary: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("summary.json")).unwrap()).unwrap();
    // The prompt's two trees decode side by side from its shared cached blocks.
    assert!(
        steps
            .iter()
            .any(|s| field(s, "distinct_context") < field(s, "context")),
        "no step read a block two sequences share"
    );
    let rows: u64 = steps.iter().map(|s| field(s, "rows")).sum();
    assert_eq!(rows, summary["tokens"]["computed"].as_u64().unwrap());

    let bad = treegrpo()
        .args(["rollout", "--prompts", "1", "--model"])
        .arg(&model)
        .env(
            "TREEGRPO_STEP_LOG",
            dir.path().join("no/such/dir/steps.jsonl"),
        )
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&bad.stderr);
    assert_eq!(bad.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("step log"), "{stderr}");
}

/// vLLM's sampling options on `treegrpo generate`: a repetition penalty changes a
/// greedy continuation of a repetitive prompt; out-of-range values are errors naming
/// the option (a negative temperature is not greedy).
#[test]
fn generate_takes_vllm_sampling_options_and_refuses_bad_ones() {
    let model = common::default_model();
    let run = |extra: &[&str]| {
        treegrpo()
            .args(["generate", "--raw", "--max-tokens", "12", "--prompt"])
            .arg("one two three one two three one two three one two three")
            .args(extra)
            .arg("--model")
            .arg(&model)
            .output()
            .unwrap()
    };
    let plain = run(&[]);
    let penalised = run(&["--repetition-penalty", "1.8"]);
    assert!(plain.status.success() && penalised.status.success());
    assert_ne!(plain.stdout, penalised.stdout);
    for (flag, value, named) in [
        ("--temperature", "-0.5", "temperature"),
        ("--min-p", "2", "min_p"),
        ("--repetition-penalty", "0", "repetition_penalty"),
        ("--presence-penalty", "3", "presence_penalty"),
    ] {
        let out = run(&[&format!("{flag}={value}")]);
        assert!(!out.status.success(), "{flag}={value} was accepted");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains(named), "{flag}: {stderr}");
    }
}

/// `treegrpo rollout --keep 0` and `--temperature=-1` fail before any rollout, with
/// the library's words (the server and Python say the same).
#[test]
fn rollout_refuses_keep_zero_and_a_negative_temperature_up_front() {
    for (flags, want) in [
        (
            vec!["--keep", "0"],
            treegrpo::rollout::TreeConfigError::KeepZero.to_string(),
        ),
        (
            vec!["--temperature=-1"],
            treegrpo::engine::SamplingError::Temperature(-1.0).to_string(),
        ),
    ] {
        let out = treegrpo()
            .args(["rollout", "--prompts", "1"])
            .args(&flags)
            .output()
            .unwrap();
        assert!(!out.status.success(), "{flags:?} was accepted");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains(&want), "{flags:?}: {stderr}");
    }
    // The bench reads the same flag by the same rule, before loading anything.
    let out = treegrpo()
        .args(["bench", "--prompts", "1", "--temperature=-1"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    let want = treegrpo::engine::SamplingError::Temperature(-1.0).to_string();
    assert!(stderr.contains(&want), "bench: {stderr}");
}

/// `treegrpo train` without flags runs the library's `LoopConfig::default()`: every
/// default is written once, in the library (Python's `Trainer` without keywords is
/// checked against the same output in python/tests/test_trainer.py).
#[test]
fn train_without_flags_runs_the_librarys_default_config() {
    let out = treegrpo()
        .args(["train", "--print-config"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let printed: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let default = serde_json::to_value(treegrpo::closed_loop::LoopConfig::default()).unwrap();
    assert_eq!(printed, default);
    // A setting the library refuses is refused through the flag's own name.
    let out = treegrpo()
        .args(["train", "--print-config", "--prompts-per-step", "0"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("--prompts-per-step: prompts_per_step must be at least 1"),
        "{stderr}"
    );
}
