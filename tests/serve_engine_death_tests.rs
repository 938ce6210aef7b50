//! An engine-thread panic is loud: the real `treegrpo serve` (a tiny model, `--port 0`)
//! whose engine panics — through the fault hook the test build compiles in
//! (`fault-injection`, `TREEGRPO_FAULT_ENGINE_PANIC_AT_STEP`) — answers the requests
//! waiting on it with 503 naming the panic, answers `/health` with 503, and exits
//! non-zero so a supervisor restarts it. Before this, the process lived on answering
//! 500 to everything.

mod common;

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::{Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::http;
use serde_json::json;

/// Waits for the child to exit, at most `limit`.
fn wait_exit(child: &mut std::process::Child, limit: Duration) -> Option<ExitStatus> {
    let start = Instant::now();
    while start.elapsed() < limit {
        if let Some(status) = child.try_wait().unwrap() {
            return Some(status);
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    None
}

#[test]
fn an_engine_panic_gives_503s_a_failing_health_check_and_a_non_zero_exit() {
    let dir = tempfile::tempdir().unwrap();
    common::tiny::write_long_context(dir.path(), 5);
    let mut child = Command::new(env!("CARGO_BIN_EXE_treegrpo"))
        .args(["serve", "--port", "0", "--kv-mib", "16", "--model"])
        .arg(dir.path())
        // The third step panics: the first request's steps go through.
        .env("TREEGRPO_FAULT_ENGINE_PANIC_AT_STEP", "3")
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    let addr: SocketAddr = loop {
        let line = lines
            .next()
            .expect("the server exited before listening")
            .unwrap();
        if let Some(rest) = line.split("listening on http://").nth(1) {
            break rest.split_whitespace().next().unwrap().parse().unwrap();
        }
    };
    let stderr = Arc::new(Mutex::new(String::new()));
    let sink = stderr.clone();
    std::thread::spawn(move || {
        for line in lines.map_while(Result::ok) {
            let mut s = sink.lock().unwrap();
            s.push_str(&line);
            s.push('\n');
        }
    });

    assert_eq!(http::get(addr, "/health").status, 200);
    // One generation of two tokens: a prefill step, a decode step.
    let two =
        json!({"input_ids": [1, 5, 9], "sampling_params": {"max_new_tokens": 2, "temperature": 0}});
    let first = http::post(addr, "/generate", &two);
    assert_eq!(first.status, 200, "{}", first.text());

    // The next one's first step is the third: the engine thread panics under it.
    let dead = http::post(addr, "/generate", &two);
    assert_eq!(dead.status, 503, "{}", dead.text());
    let message = dead.json()["error"]["message"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(
        message.contains("engine thread panicked") && message.contains("fault injected"),
        "{message}"
    );
    // Every later call, /health included, is 503 with the same cause, while the
    // server drains before it exits.
    let health = http::get(addr, "/health");
    assert_eq!(health.status, 503, "{}", health.text());
    assert!(
        health.text().contains("fault injected"),
        "{}",
        health.text()
    );
    let after = http::post(addr, "/generate", &two);
    assert_eq!(after.status, 503);

    let status = wait_exit(&mut child, Duration::from_secs(60)).unwrap_or_else(|| {
        let _ = child.kill();
        panic!("the server did not exit after its engine died");
    });
    assert!(!status.success(), "exit status {status}");
    assert_eq!(status.code(), Some(1), "exit status {status}");
    // Give the reader thread a moment to take the last lines.
    std::thread::sleep(Duration::from_millis(200));
    let err = stderr.lock().unwrap().clone();
    assert!(err.contains("fault injected at engine step 3"), "{err}");
    assert!(err.contains("exiting"), "{err}");
}
