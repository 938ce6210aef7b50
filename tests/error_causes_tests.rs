//! An I/O error of the rollout, the trainer and the closed loop names its path and
//! carries its cause as the `source`: a caller printing the chain (the CLI's `{:#}`,
//! the server's `error_chain`, Python's messages) shows each exactly once.

use std::error::Error;
use std::io::{Error as IoError, ErrorKind};

use treegrpo::closed_loop::LoopError;
use treegrpo::rollout::RolloutError;
use treegrpo::train::TrainError;

/// The message and its causes, `: `-joined, as a chain printer writes them.
fn chain(e: &dyn Error) -> String {
    let mut text = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        text.push_str(": ");
        text.push_str(&c.to_string());
        cause = c.source();
    }
    text
}

fn missing() -> IoError {
    IoError::new(ErrorKind::NotFound, "no such file")
}

#[test]
fn io_errors_name_their_path_then_their_cause_once() {
    let want = "/runs/x/log.jsonl: no such file";
    assert_eq!(
        chain(&RolloutError::Io("/runs/x/log.jsonl".into(), missing())),
        want
    );
    assert_eq!(
        chain(&TrainError::Io("/runs/x/log.jsonl".into(), missing())),
        want
    );
    assert_eq!(
        chain(&LoopError::Io("/runs/x/log.jsonl".into(), missing())),
        want
    );
}
