//! The table of fork sessions (see `sessions.rs` for the routes): session ids to
//! engine sequences, each owned by the API key that created it, leased while an
//! operation runs on it ([`Lease`]), closed after the TTL, at most `max` of them.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::engine::{Engine, WeightVersion};
use crate::kv::SeqId;
use crate::model::TokenId;

use super::error::ServeError;

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

pub(super) struct Session {
    pub(super) seq: SeqId,
    /// The caller that created it (or the session it was forked from).
    pub(super) owner: Caller,
    /// Every token of the session: the prompt, appended and generated tokens.
    pub(super) tokens: Vec<TokenId>,
    /// The weights of its last generation (or those served when it was created).
    pub(super) weight_version: WeightVersion,
    pub(super) last_used: Instant,
    pub(super) leased: bool,
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

    pub(super) fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Session>> {
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
    pub(super) fn check_room(&self, n: usize) -> Result<(), ServeError> {
        if self.len() + n > self.max {
            return Err(ServeError::SessionLimit { limit: self.max });
        }
        Ok(())
    }

    /// A new session id: 128 bits from the operating system's random source, so an
    /// id cannot be guessed from another (a counter's ids could be).
    pub(super) fn fresh_id(&self) -> Result<String, ServeError> {
        let mut bytes = [0u8; 16];
        getrandom::fill(&mut bytes).map_err(ServeError::RandomSource)?;
        Ok(format!("sess-{:032x}", u128::from_le_bytes(bytes)))
    }

    /// Adds a session over `seq` (the caller frees `seq` if this fails).
    pub(super) fn insert(
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
    pub(super) fn lease<'a>(
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

    pub(super) fn remove(&self, id: &str) -> Option<SeqId> {
        self.lock().remove(id).map(|s| s.seq)
    }

    /// Removes session `id` if `caller` owns it; its sequence, to be freed.
    pub(super) fn remove_owned(&self, id: &str, caller: Caller) -> Result<SeqId, ServeError> {
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
pub(super) fn owned<S: std::ops::Deref<Target = Session>>(
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
pub(super) struct Lease<'a> {
    pub(super) table: &'a SessionTable,
    pub(super) engine: Engine,
    pub(super) id: String,
    pub(super) seq: SeqId,
    pub(super) tokens: Vec<TokenId>,
    pub(super) weight_version: WeightVersion,
    pub(super) done: bool,
}

impl Lease<'_> {
    pub(super) fn finish(
        mut self,
        added: &[TokenId],
        weight_version: Option<WeightVersion>,
    ) -> usize {
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
