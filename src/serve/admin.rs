//! Weights and cache: `POST /update_weights_from_disk` (SGLang's name and shape),
//! `POST /flush_cache`, `GET /health`.
//!
//! Loading from disk is off unless the server was given a weights folder
//! (`--weights-dir`): a path must resolve (links followed) inside it, and one load
//! runs at a time. A browser page could otherwise make the server open any file.

use std::path::{Path, PathBuf};

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Deserialize;
use serde_json::json;

use super::body::ApiJson;
use super::error::{error_chain, ServeError};
use super::state::AppState;

/// The JSON body of `POST /update_weights_from_disk`: `{"model_path": "..."}`, as
/// SGLang's endpoint takes it (its `load_format` and `flush_cache` are accepted and
/// ignored; any other field is a 400).
#[derive(Debug, Deserialize)]
pub struct UpdateWeightsRequest {
    /// An HF checkpoint directory (as `treegrpo train` and `sft` write them) or a GGUF.
    model_path: PathBuf,
}

/// `POST /update_weights_from_disk`: the engine serves the file's weights from now
/// on, under the next weight version. Requests in flight finish on the old weights;
/// cached prefixes are dropped and live sessions recompute their KV on next use.
/// Answers `{success, message, weight_version}`, with a 4xx/5xx status on failure.
pub async fn update_weights_from_disk(
    State(state): State<AppState>,
    ApiJson(req): ApiJson<UpdateWeightsRequest>,
) -> Response {
    let refused = |status: StatusCode, message: String| {
        (
            status,
            Json(json!({ "success": false, "message": message })),
        )
            .into_response()
    };
    let Some(dir) = &state.config.weights_dir else {
        return refused(
            StatusCode::FORBIDDEN,
            "loading weights from disk is off: start the server with --weights-dir DIR".into(),
        );
    };
    let Some(path) = inside(dir, &req.model_path) else {
        // Nothing is said of the path: whether it exists outside the folder is not
        // this server's to tell.
        return refused(
            StatusCode::FORBIDDEN,
            "model_path: not a file or folder inside the server's --weights-dir".into(),
        );
    };
    let Ok(_loading) = state.weight_load.try_lock() else {
        return refused(
            StatusCode::CONFLICT,
            "another weight load is in progress: retry when it ends".into(),
        );
    };
    match state.engine.load_weights_from(&path).await {
        Ok(version) => Json(json!({
            "success": true,
            "message": format!("serving {} as weight version {version}", path.display()),
            "weight_version": version,
        }))
        .into_response(),
        Err(e) => {
            let serving = state.engine.stats().await.map_or(0, |s| s.weight_version);
            let e = ServeError::Engine(e);
            // A file that cannot be read is the caller's mistake (400), not ours.
            let status = match e.status() {
                StatusCode::INTERNAL_SERVER_ERROR => StatusCode::BAD_REQUEST,
                s => s,
            };
            (
                status,
                Json(json!({
                    "success": false,
                    "message": error_chain(&e),
                    "weight_version": serving,
                })),
            )
                .into_response()
        }
    }
}

/// `path` (relative to `dir`, or absolute) resolved with every link followed, if it
/// exists and lies inside `dir` (already resolved by the server's start).
fn inside(dir: &Path, path: &Path) -> Option<PathBuf> {
    let resolved = std::fs::canonicalize(dir.join(path)).ok()?;
    resolved.starts_with(dir).then_some(resolved)
}

/// `POST /flush_cache`: forgets every cached prefix (blocks of live sequences and
/// sessions stay).
pub async fn flush_cache(
    State(state): State<AppState>,
) -> Result<Json<serde_json::Value>, ServeError> {
    state.engine.clear_prefix_cache().await?;
    Ok(Json(json!({ "success": true })))
}

/// `GET /health`: 200 while the engine thread answers.
pub async fn health(State(state): State<AppState>) -> Result<Json<serde_json::Value>, ServeError> {
    let stats = state.engine.stats().await?;
    Ok(Json(json!({
        "status": "ok",
        "weight_version": stats.weight_version,
        "model": state.config.model_name,
    })))
}

/// SGLang's `load_format` and `flush_cache` are accepted: the file's format is read
/// from it, and a swap always drops every cached prefix.
impl super::known_fields::KnownFields for UpdateWeightsRequest {
    fn unknown_field(body: &serde_json::Value) -> Option<String> {
        super::known_fields::first_unknown(
            body,
            "",
            &[&["model_path", "load_format", "flush_cache"]],
        )
    }
}
