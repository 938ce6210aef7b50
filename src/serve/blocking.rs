//! A request's CPU work before the engine sees it — tokenising its text, rendering
//! its chat template — runs on tokio's blocking pool, never on the async workers.
//!
//! Why: the server runs on a few async worker threads (two on a 2-core host). Text up
//! to the 16 MiB body limit takes real time to tokenise; done inline, two such
//! requests would hold both workers and `/health`, `/metrics` and every stream would
//! stop answering until they finished. On the blocking pool they wait their turn for
//! a core like any thread, and the workers stay free to answer.

use super::error::ServeError;
use super::state::AppState;

/// Runs `work` on the blocking pool with the server's state and waits for it; a
/// panic in it is the request's 500 ([`ServeError::Task`]), never the server's.
pub async fn off_the_workers<T, F>(state: &AppState, work: F) -> Result<T, ServeError>
where
    T: Send + 'static,
    F: FnOnce(&AppState) -> Result<T, ServeError> + Send + 'static,
{
    let state = state.clone();
    tokio::task::spawn_blocking(move || work(&state)).await?
}
