//! Tools an environment calls (search, calculator, or a test's own), and the
//! runner that makes every failure an observation.
//!
//! Tools run on tokio and may be slow or broken. [`run_tool`] spawns the call
//! as its own task so that a timeout can abort it and a panic inside it is
//! caught as a `JoinError` instead of unwinding through the rollout. A tool
//! must not block its thread: CPU-heavy work belongs in
//! `tokio::task::spawn_blocking` (as the BM25 search tool does), otherwise a
//! timeout cannot fire while it runs. Because of the spawn, `run_tool` (and
//! so every environment's `step`) must run inside a tokio runtime.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};

use crate::env::error::ToolError;

/// A tool the agent can call with one text input.
#[async_trait]
pub trait Tool: Send + Sync {
    /// Short name used in error observations, e.g. `search`.
    fn name(&self) -> &str;
    /// Runs the tool; the `Ok` text becomes the observation body.
    async fn call(&self, input: &str) -> Result<String, ToolError>;
}

/// How a tool call ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ToolStatus {
    /// The tool returned its result.
    Ok,
    /// The tool returned a [`ToolError`]; the observation is its message and causes.
    Failed,
    /// The call ran past the environment's tool timeout and was aborted.
    TimedOut,
    /// The tool's task panicked (or was cancelled).
    Panicked,
}

/// A finished tool call: the observation body and how it ended.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ToolOutcome {
    /// How the call ended.
    pub status: ToolStatus,
    /// The observation body: the tool's result, or `Tool error (NAME): why`.
    pub text: String,
}

/// Calls `tool` under `timeout`. Never fails: a tool error, a timeout or a
/// panic becomes text the model reads (`Tool error (NAME): ...`), so the
/// episode goes on.
pub async fn run_tool(tool: Arc<dyn Tool>, input: &str, timeout: Duration) -> ToolOutcome {
    let name = tool.name().to_owned();
    let owned = input.to_owned();
    let handle = tokio::spawn(async move { tool.call(&owned).await });
    let abort = handle.abort_handle();
    let failure = |status, why: String| ToolOutcome {
        status,
        text: format!("Tool error ({name}): {why}"),
    };
    match tokio::time::timeout(timeout, handle).await {
        Ok(Ok(Ok(text))) => ToolOutcome {
            status: ToolStatus::Ok,
            text,
        },
        Ok(Ok(Err(err))) => failure(ToolStatus::Failed, crate::error_chain(&err)),
        Ok(Err(_join)) => failure(ToolStatus::Panicked, "the tool crashed".into()),
        Err(_elapsed) => {
            // Dropping the JoinHandle would detach the task; abort it so a
            // hung tool does not keep running in the background.
            abort.abort();
            failure(
                ToolStatus::TimedOut,
                format!("timed out after {} ms", timeout.as_millis()),
            )
        }
    }
}

/// Cuts `text` to at most `max_chars` characters (on a char boundary) so a
/// runaway tool cannot flood the context.
pub fn truncate_observation(text: &str, max_chars: usize) -> String {
    match text.char_indices().nth(max_chars) {
        Some((cut, _)) => format!("{} ...[truncated]", &text[..cut]),
        None => text.to_owned(),
    }
}
