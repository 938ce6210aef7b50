//! Fork sessions: a trainer's own tree search over HTTP. A session is one engine
//! sequence the client drives step by step — generate, append an observation, fork
//! into branches that share its computed prefix (nothing is recomputed), close.
//!
//! The table maps session ids to sequences. A session is *leased* while an operation
//! runs on it (a second one at once gets 409); an operation whose client goes away
//! mid-way (its handler is dropped) closes the session and frees its sequence, since
//! what it holds is then unknown to the client. Idle sessions close after the TTL;
//! the table holds at most `max_sessions` (429 beyond).
//!
//! With several `--api-key`s, a session belongs to the key that created it (its
//! branches too): to any other key it does not exist (404, so an id cannot even be
//! confirmed).

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use axum::extract::{Path, State};
use axum::{Extension, Json};
use serde::Deserialize;
use serde_json::{json, Value};

use crate::engine::{Engine, WeightVersion};
use crate::kv::SeqId;
use crate::model::TokenId;

use super::blocking::off_the_workers;
use super::body::{chat_prompt, text_or_ids, ApiJson, MessageInput};
use super::error::ServeError;
use super::known_fields::{first_unknown, KnownFields, SAMPLING};
use super::sampling::{finish_reason, visible_text, SamplingFields};
use super::state::AppState;

/// A session's default `max_new_tokens` (SGLang's default), so a step ends without
/// the client naming a limit.
const DEFAULT_STEP_TOKENS: usize = 128;
/// Most branches one fork makes.
const MAX_FORK: usize = 256;

/// Who sent a request: which of the server's API keys it carried (`require_key`
/// puts one on every request). Without keys everyone is the same caller.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Caller(Option<usize>);

impl Caller {
    /// The caller of a server without API keys.
    pub const ANYONE: Caller = Caller(None);

    /// The caller holding the server's `index`th key.
    pub fn key(index: usize) -> Caller {
        Caller(Some(index))
    }
}

struct Session {
    seq: SeqId,
    /// The caller that created it (or the session it was forked from).
    owner: Caller,
    /// Every token of the session: the prompt, appended and generated tokens.
    tokens: Vec<TokenId>,
    /// The weights of its last generation (or those served when it was created).
    weight_version: WeightVersion,
    last_used: Instant,
    leased: bool,
}

/// The live sessions.
pub struct SessionTable {
    sessions: Mutex<HashMap<String, Session>>,
    max: usize,
    ttl: Duration,
}

impl SessionTable {
    /// An empty table holding at most `max` sessions, each closed after `ttl` idle.
    pub fn new(max: usize, ttl: Duration) -> Self {
        SessionTable {
            sessions: Mutex::new(HashMap::new()),
            max,
            ttl,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Session>> {
        // A panic while the lock was held cannot leave a session half-written (each
        // change is one insert or field store), so a poisoned lock is still usable.
        self.sessions.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Live sessions, leased or not.
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    /// Whether no session is live.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Whether `n` more sessions fit.
    fn check_room(&self, n: usize) -> Result<(), ServeError> {
        if self.len() + n > self.max {
            return Err(ServeError::SessionLimit { limit: self.max });
        }
        Ok(())
    }

    /// A new session id: 128 bits from the operating system's random source, so an
    /// id cannot be guessed from another (a counter's ids could be).
    fn fresh_id(&self) -> Result<String, ServeError> {
        let mut bytes = [0u8; 16];
        getrandom::fill(&mut bytes).map_err(ServeError::RandomSource)?;
        Ok(format!("sess-{:032x}", u128::from_le_bytes(bytes)))
    }

    /// Adds a session over `seq` (the caller frees `seq` if this fails).
    fn insert(
        &self,
        owner: Caller,
        seq: SeqId,
        tokens: Vec<TokenId>,
        weight_version: WeightVersion,
    ) -> Result<String, ServeError> {
        let mut sessions = self.lock();
        if sessions.len() >= self.max {
            return Err(ServeError::SessionLimit { limit: self.max });
        }
        let id = self.fresh_id()?;
        sessions.insert(
            id.clone(),
            Session {
                seq,
                owner,
                tokens,
                weight_version,
                last_used: Instant::now(),
                leased: false,
            },
        );
        Ok(id)
    }

    /// Leases session `id`, which `caller` must own, for one operation.
    fn lease<'a>(
        &'a self,
        id: &str,
        caller: Caller,
        engine: &Engine,
    ) -> Result<Lease<'a>, ServeError> {
        let mut sessions = self.lock();
        let s = owned(sessions.get_mut(id), id, caller)?;
        if s.leased {
            return Err(ServeError::SessionBusy(id.to_string()));
        }
        s.leased = true;
        s.last_used = Instant::now();
        Ok(Lease {
            table: self,
            engine: engine.clone(),
            id: id.to_string(),
            seq: s.seq,
            tokens: s.tokens.clone(),
            weight_version: s.weight_version,
            done: false,
        })
    }

    fn remove(&self, id: &str) -> Option<SeqId> {
        self.lock().remove(id).map(|s| s.seq)
    }

    /// Removes session `id` if `caller` owns it; its sequence, to be freed.
    fn remove_owned(&self, id: &str, caller: Caller) -> Result<SeqId, ServeError> {
        let mut sessions = self.lock();
        owned(sessions.get_mut(id), id, caller)?;
        Ok(sessions.remove(id).expect("checked above").seq)
    }

    /// Closes sessions idle past the TTL; returns their sequences, to be freed.
    pub fn expire(&self) -> Vec<SeqId> {
        let now = Instant::now();
        let mut sessions = self.lock();
        let expired: Vec<String> = sessions
            .iter()
            .filter(|(_, s)| !s.leased && now.duration_since(s.last_used) >= self.ttl)
            .map(|(id, _)| id.clone())
            .collect();
        expired
            .iter()
            .filter_map(|id| sessions.remove(id).map(|s| s.seq))
            .collect()
    }

    /// How often the reaper should look for expired sessions.
    pub fn sweep_interval(&self) -> Duration {
        (self.ttl / 4).clamp(Duration::from_millis(50), Duration::from_secs(5))
    }

    /// Every session's sequence, emptying the table (server shutdown).
    pub fn drain(&self) -> Vec<SeqId> {
        self.lock().drain().map(|(_, s)| s.seq).collect()
    }
}

/// Session `id` if `caller` owns it; to any other caller it is unknown (404).
fn owned<S: std::ops::Deref<Target = Session>>(
    session: Option<S>,
    id: &str,
    caller: Caller,
) -> Result<S, ServeError> {
    match session {
        Some(s) if s.owner == caller => Ok(s),
        _ => Err(ServeError::UnknownSession(id.to_string())),
    }
}

/// One operation's hold on a session. [`Lease::finish`] records what it added and
/// ends the lease; dropped unfinished (the client went away mid-operation) it closes
/// the session and frees its sequence.
struct Lease<'a> {
    table: &'a SessionTable,
    engine: Engine,
    id: String,
    seq: SeqId,
    tokens: Vec<TokenId>,
    weight_version: WeightVersion,
    done: bool,
}

impl Lease<'_> {
    fn finish(mut self, added: &[TokenId], weight_version: Option<WeightVersion>) -> usize {
        self.done = true;
        let mut sessions = self.table.lock();
        match sessions.get_mut(&self.id) {
            Some(s) => {
                s.tokens.extend_from_slice(added);
                if let Some(v) = weight_version {
                    s.weight_version = v;
                }
                s.leased = false;
                s.last_used = Instant::now();
                s.tokens.len()
            }
            // Deleted while the operation ran.
            None => self.tokens.len() + added.len(),
        }
    }
}

impl Drop for Lease<'_> {
    fn drop(&mut self) {
        if !self.done {
            if let Some(seq) = self.table.remove(&self.id) {
                self.engine.release(seq);
            }
        }
    }
}

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
                &[SAMPLING],
            )
        })
    }
}
