//! Helpers shared by the integration tests.
#![allow(dead_code)]

pub mod batch;
pub mod http;
pub mod oracle;
pub mod python;
pub mod reference_bpe;
pub mod rng;
pub mod server;
pub mod single_sequence;
pub mod tiny;

use std::path::PathBuf;

/// The default model, fetched on first use (the tests need it; CI fetches it too).
pub fn default_model() -> PathBuf {
    treegrpo::model::fetch::ensure_default_model(&mut |msg| eprintln!("{msg}"))
        .expect("the default model could not be fetched")
}

/// A two-worker multi-threaded tokio runtime, as the engine's callers use (mistral.rs
/// also needs a multi-threaded one: it calls `block_in_place` while loading).
pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

/// Largest absolute difference between two equally long slices.
pub fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

pub fn argmax(v: &[f32]) -> usize {
    let mut best = 0;
    for (i, &x) in v.iter().enumerate() {
        if x > v[best] {
            best = i;
        }
    }
    best
}

/// `log softmax(row)[target]`, in f64: the log-probability a row of logits gives a token.
pub fn log_softmax_at(row: &[f32], target: u32) -> f64 {
    row[target as usize] as f64 - log_sum_exp(row)
}

/// `log softmax(row)`, in f64.
pub fn log_softmax(row: &[f32]) -> Vec<f64> {
    let lse = log_sum_exp(row);
    row.iter().map(|&v| v as f64 - lse).collect()
}

fn log_sum_exp(row: &[f32]) -> f64 {
    let top = row.iter().cloned().fold(f32::NEG_INFINITY, f32::max) as f64;
    row.iter()
        .map(|&x| (x as f64 - top).exp())
        .sum::<f64>()
        .ln()
        + top
}

/// Sends SIGINT to a child process (as Ctrl-C would).
///
/// Returns the child's signal masks read just after sending, for a failure message
/// that says where the signal went if the child did not act on it.
pub fn interrupt(child: &std::process::Child) -> String {
    let killed = std::process::Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    signal_masks(child.id())
}

/// The signal lines of `/proc/PID/status` (pending, blocked, ignored and caught
/// masks; bit 1 is SIGINT), or why they could not be read.
pub fn signal_masks(pid: u32) -> String {
    match std::fs::read_to_string(format!("/proc/{pid}/status")) {
        Ok(status) => status
            .lines()
            .filter(|l| l.starts_with("Sig") || l.starts_with("ShdPnd"))
            .collect::<Vec<_>>()
            .join(", "),
        Err(e) => format!("/proc/{pid}/status: {e}"),
    }
}

/// Waits until `log` (a run's `log.jsonl`) has at least `lines` whole lines, failing
/// the test if `child` ends first or nothing comes within half an hour (a hang
/// guard, not a timing assertion).
pub fn wait_for_log_lines(child: &mut std::process::Child, log: &std::path::Path, lines: usize) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(1800);
    while treegrpo::closed_loop::read_log(log)
        .map(|l| l.len())
        .unwrap_or(0)
        < lines
    {
        assert!(
            std::time::Instant::now() < deadline,
            "{} never reached {lines} lines",
            log.display()
        );
        if let Some(status) = child.try_wait().unwrap() {
            panic!(
                "the command ended before {} had {lines} lines: {status}",
                log.display()
            );
        }
        std::thread::sleep(std::time::Duration::from_millis(2));
    }
}

/// The `treegrpo` binary this test build made, as a command to add arguments to.
pub fn treegrpo() -> std::process::Command {
    std::process::Command::new(env!("CARGO_BIN_EXE_treegrpo"))
}

/// Runs `cmd` to the end (no stdin) and returns its stdout; fails the test with its
/// stderr unless it succeeded.
pub fn run_ok(cmd: &mut std::process::Command) -> String {
    let output = cmd.stdin(std::process::Stdio::null()).output().unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout).unwrap()
}
