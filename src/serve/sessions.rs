//! Fork sessions: a trainer's own tree search over HTTP. A session is one engine
//! sequence the client drives step by step — generate, append an observation, fork
//! into branches that share its computed prefix (nothing is recomputed), close.
//!
//! The table (`session_table.rs`) maps session ids to sequences. A session is *leased* while an operation
//! runs on it (a second one at once gets 409); an operation whose client goes away
//! mid-way (its handler is dropped) closes the session and frees its sequence, since
//! what it holds is then unknown to the client. Idle sessions close after the TTL;
//! the table holds at most `max_sessions` (429 beyond).
//!
//! With several `--api-key`s, a session belongs to the key that created it (its
//! branches too): to any other key it does not exist (404, so an id cannot even be
//! confirmed).

use axum::extract::{Path, State};
use axum::{Extension, Json};
use serde::Deserialize;
use serde_json::{json, Value};

use crate::model::TokenId;

use super::blocking::off_the_workers;
use super::body::{chat_prompt, text_or_ids, ApiJson, MessageInput};
use super::error::ServeError;
use super::known_fields::{first_unknown, KnownFields};
use super::sampling::{finish_reason, visible_text, SamplingFields};
use super::session_table::{owned, Caller};
use super::state::AppState;

/// A session's default `max_new_tokens` (SGLang's default), so a step ends without
/// the client naming a limit.
const DEFAULT_STEP_TOKENS: usize = 128;
/// Most branches one fork makes.
const MAX_FORK: usize = 256;

/// The JSON body of `POST /v1/sessions`: exactly one of `messages` (rendered with
/// the model's chat template), `text` or `input_ids`; the session starts with
/// those tokens, computed with its first generation or fork.
#[derive(Debug, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct CreateRequest {
    input_ids: Option<Vec<i64>>,
    text: Option<String>,
    /// Chat messages, rendered with the model's template ready for the reply.
    messages: Option<Vec<MessageInput>>,
}

/// [`text_or_ids`] on the blocking pool (text is tokenised there).
async fn text_or_ids_off_the_workers(
    state: &AppState,
    text: Option<String>,
    input_ids: Option<Vec<i64>>,
) -> Result<Vec<TokenId>, ServeError> {
    off_the_workers(state, move |s| {
        text_or_ids(s, text.as_deref(), input_ids.as_deref())
    })
    .await
}

/// `POST /v1/sessions`.
pub async fn create(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    ApiJson(req): ApiJson<CreateRequest>,
) -> Result<Json<Value>, ServeError> {
    let tokens = match &req.messages {
        Some(m) if req.input_ids.is_none() && req.text.is_none() => {
            let messages = m.clone();
            off_the_workers(&state, move |s| chat_prompt(s, &messages)).await?
        }
        Some(_) => {
            return Err(ServeError::invalid(
                "messages",
                "give one of `messages`, `text` or `input_ids`",
            ))
        }
        None => text_or_ids_off_the_workers(&state, req.text, req.input_ids).await?,
    };
    state.sessions.check_room(1)?;
    let weight_version = state.engine.stats().await?.weight_version;
    let seq = state.engine.add_sequence(tokens.clone()).await?;
    let length = tokens.len();
    let id = state
        .sessions
        .insert(caller, seq, tokens, weight_version)
        .inspect_err(|_| state.engine.release(seq))?;
    Ok(Json(json!({
        "session_id": id,
        "length": length,
        "weight_version": weight_version,
    })))
}

/// The JSON body of `POST /v1/sessions/{id}/generate`: `sampling_params` as
/// `/generate` takes them (`max_new_tokens` defaults to 128).
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub struct GenerateRequest {
    sampling_params: SamplingFields,
}

/// `POST /v1/sessions/{id}/generate`: the generated tokens join the session.
pub async fn generate(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
    ApiJson(req): ApiJson<GenerateRequest>,
) -> Result<Json<Value>, ServeError> {
    let mut fields = req.sampling_params;
    fields.max_new_tokens = Some(fields.max_new_tokens.unwrap_or(DEFAULT_STEP_TOKENS));
    let lease = state.sessions.lease(&id, caller, &state.engine)?;
    let seed = fields.seed_or_fresh(&state);
    let run = async {
        let params = fields.gen_params(&state, lease.tokens.len(), seed, 0)?;
        let _permit = state.admission.admit(1).await?;
        Ok::<_, ServeError>(state.engine.generate(lease.seq, params).await?)
    };
    let result = run.await;
    let g = match result {
        Ok(g) => g,
        Err(e) => {
            lease.finish(&[], None);
            return Err(e);
        }
    };
    let length = lease.finish(&g.tokens, Some(g.weight_version));
    let text = visible_text(
        &state.model.tokenizer.decode(&g.tokens)?,
        &fields.stop_strings(),
    );
    Ok(Json(json!({
        "output_ids": g.tokens,
        "logprobs": g.logprobs,
        "text": text,
        "finish_reason": finish_reason(g.stop),
        "length": length,
        "weight_version": g.weight_version,
    })))
}

/// The JSON body of `POST /v1/sessions/{id}/append`: the observation as `text` or
/// `input_ids`, exactly one.
#[derive(Debug, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AppendRequest {
    input_ids: Option<Vec<i64>>,
    text: Option<String>,
}

/// `POST /v1/sessions/{id}/append`: tokens (an observation) added to the session,
/// computed with its next generation or fork.
pub async fn append(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
    ApiJson(req): ApiJson<AppendRequest>,
) -> Result<Json<Value>, ServeError> {
    let tokens = text_or_ids_off_the_workers(&state, req.text, req.input_ids).await?;
    let lease = state.sessions.lease(&id, caller, &state.engine)?;
    if lease.tokens.len() + tokens.len() >= state.max_positions() {
        let prompt = lease.tokens.len();
        lease.finish(&[], None);
        return Err(ServeError::ContextLength {
            prompt,
            requested: tokens.len(),
            max: state.max_positions(),
        });
    }
    match state.engine.append(lease.seq, tokens.clone()).await {
        Ok(()) => {
            let length = lease.finish(&tokens, None);
            Ok(Json(json!({ "length": length })))
        }
        Err(e) => {
            lease.finish(&[], None);
            Err(e.into())
        }
    }
}

/// The JSON body of `POST /v1/sessions/{id}/fork`: `n`, the number of new sessions
/// (1 to 256; 1 when the body is empty).
#[derive(Debug, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ForkRequest {
    n: usize,
}

impl Default for ForkRequest {
    fn default() -> Self {
        ForkRequest { n: 1 }
    }
}

/// `POST /v1/sessions/{id}/fork`: `n` new sessions sharing the session's computed
/// prefix (its pending tokens are computed once, first).
pub async fn fork(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
    ApiJson(req): ApiJson<ForkRequest>,
) -> Result<Json<Value>, ServeError> {
    if req.n == 0 || req.n > MAX_FORK {
        return Err(ServeError::invalid(
            "n",
            format!("between 1 and {MAX_FORK} branches"),
        ));
    }
    state.sessions.check_room(req.n)?;
    let lease = state.sessions.lease(&id, caller, &state.engine)?;
    let mut ids = Vec::with_capacity(req.n);
    let run = async {
        state.engine.prefill(lease.seq).await?;
        for _ in 0..req.n {
            let child = state.engine.fork(lease.seq).await?;
            let id = state
                .sessions
                .insert(caller, child, lease.tokens.clone(), lease.weight_version)
                .inspect_err(|_| state.engine.release(child))?;
            ids.push(id);
        }
        Ok::<_, ServeError>(())
    };
    let result = run.await;
    lease.finish(&[], None);
    if let Err(e) = result {
        // All or nothing: the branches made before the failure are closed again.
        for id in &ids {
            if let Some(seq) = state.sessions.remove(id) {
                state.engine.release(seq);
            }
        }
        return Err(e);
    }
    Ok(Json(json!({ "session_ids": ids })))
}

/// `GET /v1/sessions/{id}`.
pub async fn show(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
) -> Result<Json<Value>, ServeError> {
    let sessions = state.sessions.lock();
    let s = owned(sessions.get(&id), &id, caller)?;
    Ok(Json(json!({
        "session_id": id,
        "length": s.tokens.len(),
        "weight_version": s.weight_version,
        "input_ids": s.tokens,
        "busy": s.leased,
    })))
}

/// `DELETE /v1/sessions/{id}`: frees its sequence (a generation running on it ends
/// with an error for its caller).
pub async fn delete(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
) -> Result<Json<Value>, ServeError> {
    let seq = state.sessions.remove_owned(&id, caller)?;
    state.engine.free(seq).await?;
    Ok(Json(json!({ "session_id": id, "deleted": true })))
}

impl KnownFields for CreateRequest {}

impl KnownFields for AppendRequest {}

impl KnownFields for ForkRequest {}

impl KnownFields for GenerateRequest {
    fn unknown_field(body: &serde_json::Value) -> Option<String> {
        first_unknown(body, "", &[&["sampling_params"]]).or_else(|| {
            first_unknown(
                body.get("sampling_params")?,
                "sampling_params.",
                &[SamplingFields::fields()],
            )
        })
    }
}
