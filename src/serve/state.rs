//! What every handler shares: the engine, the model's tokenizer and template, the
//! session table, the metrics, and the admission gate that bounds how much work the
//! server takes on at once.

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::engine::Engine;
use crate::model::LoadedModel;
use crate::random::{mix64, GOLDEN};

use super::error::ServeError;
use super::request_metrics::Metrics;
use super::session_table::SessionTable;

/// The server's limits and identity (`treegrpo serve`'s flags).
#[derive(Debug, Clone)]
pub struct ServeConfig {
    /// The id `/v1/models` lists and responses name (requests may name any model:
    /// the server serves one).
    pub model_name: String,
    /// With any key listed, requests must carry `Authorization: Bearer KEY` with
    /// one of them (all but `GET /health`), and a fork session belongs to the key
    /// that created it: another key neither sees nor touches it.
    pub api_keys: Vec<String>,
    /// Most live fork sessions.
    pub max_sessions: usize,
    /// A session idle this long is closed and its KV freed.
    pub session_ttl: Duration,
    /// Most sequences generating for requests at once; more wait in the queue.
    pub max_running: usize,
    /// Most requests waiting for room; beyond it a request gets 503 at once.
    pub max_queue: usize,
    /// How long a request may wait for room before it gets 503.
    pub queue_timeout: Duration,
    /// Largest request body, in bytes (413 above it).
    pub max_body_bytes: usize,
    /// Most leaves one `/v1/rollouts` request may grow over all its prompts.
    pub max_rollout_leaves: u64,
    /// The folder `/update_weights_from_disk` may load from (paths resolved inside
    /// it); `None` turns the route off (403).
    pub weights_dir: Option<PathBuf>,
    /// Browser origins (`scheme://host[:port]`) whose pages may call the server; a
    /// request carrying any other `Origin` is 403. Non-browser clients send none.
    pub allowed_origins: Vec<String>,
    /// Answer only requests whose `Host` is a loopback name or address (what a
    /// loopback bind expects; a DNS-rebound name is 403).
    pub loopback_hosts_only: bool,
    /// Most connections open at once; one more is answered 503 and closed.
    pub max_connections: usize,
    /// Longest a client may take to send a request's header (or, kept alive, to
    /// start its next request) before the connection is closed.
    pub header_timeout: Duration,
    /// Longest a client may take to send a request's body (408 after it).
    pub request_timeout: Duration,
    /// Longest a response may wait for the client to read it before the connection
    /// is cut (a stalled stream's sequences are freed then).
    pub idle_write_timeout: Duration,
}

impl ServeConfig {
    /// A config serving under `model_name` with the library's defaults: no API key,
    /// 1024 sessions idle-closed after 600 s, 256 running sequences, 1024 queued
    /// requests waiting at most 60 s, bodies up to 16 MiB, rollout requests of up to
    /// 16,384 leaves, no loading of weights from disk, no browser origin allowed,
    /// 1024 connections, 60 s for a header, 600 s for a body and for a stalled write.
    pub fn new(model_name: impl Into<String>) -> Self {
        ServeConfig {
            model_name: model_name.into(),
            api_keys: Vec::new(),
            max_sessions: 1024,
            session_ttl: Duration::from_secs(600),
            max_running: 256,
            max_queue: 1024,
            queue_timeout: Duration::from_secs(60),
            max_body_bytes: 16 << 20,
            max_rollout_leaves: 16_384,
            weights_dir: None,
            allowed_origins: Vec::new(),
            loopback_hosts_only: false,
            max_connections: 1024,
            header_timeout: Duration::from_secs(60),
            request_timeout: Duration::from_secs(600),
            idle_write_timeout: Duration::from_secs(600),
        }
    }

    /// The limits the connection layer applies.
    pub fn connection_limits(&self) -> super::connection::ConnectionLimits {
        super::connection::ConnectionLimits {
            max_connections: self.max_connections,
            header_timeout: self.header_timeout,
            idle_write_timeout: self.idle_write_timeout,
        }
    }
}

/// The handlers' shared state (cloned into each: an `Arc`).
#[derive(Clone)]
pub struct AppState(Arc<Inner>);

/// What [`AppState`] shares, reached through its `Deref`.
pub struct Inner {
    /// The engine every request runs on.
    pub engine: Engine,
    /// The served model's tokenizer, chat template and config (the model the engine
    /// started with; its shape stays the same across weight reloads).
    pub model: Arc<LoadedModel>,
    /// The server's limits and identity.
    pub config: ServeConfig,
    /// The live fork sessions of `/v1/sessions`.
    pub sessions: SessionTable,
    /// Counters and latencies `GET /metrics` reports.
    pub metrics: Metrics,
    /// Connections open, accepted, refused and timed out (`/metrics`).
    pub connections: Arc<super::connection::ConnectionCounters>,
    /// The gate bounding how many sequences run for requests at once.
    pub admission: Admission,
    /// Seeds of requests that name none: distinct per request, so two unseeded
    /// requests sample differently, as an OpenAI client expects.
    nonce: AtomicU64,
    /// Request ids (`cmpl-…`, `chatcmpl-…`).
    ids: AtomicU64,
    /// Held by the weight load in progress: one at a time (each holds a whole copy
    /// of the model).
    pub weight_load: tokio::sync::Mutex<()>,
}

impl std::ops::Deref for AppState {
    type Target = Inner;
    fn deref(&self) -> &Inner {
        &self.0
    }
}

impl AppState {
    /// The state of a server over `engine` with `config`: an empty session table,
    /// fresh metrics, an admission gate sized by `config`.
    pub fn new(engine: Engine, config: ServeConfig) -> Self {
        let model = engine.model().clone();
        let started = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
        AppState(Arc::new(Inner {
            sessions: SessionTable::new(config.max_sessions, config.session_ttl),
            admission: Admission::new(config.max_running, config.max_queue, config.queue_timeout),
            metrics: Metrics::default(),
            connections: Arc::default(),
            engine,
            model,
            config,
            nonce: AtomicU64::new(started),
            ids: AtomicU64::new(0),
            weight_load: tokio::sync::Mutex::new(()),
        }))
    }
}

impl Inner {
    /// A seed for a request that names none.
    pub fn fresh_seed(&self) -> u64 {
        // Successive nonces mixed (SplitMix64), so seeds of consecutive requests
        // share no structure.
        mix64(self.nonce.fetch_add(GOLDEN, Ordering::Relaxed))
    }

    /// A fresh response id with `prefix` (`cmpl`, `chatcmpl`).
    pub fn request_id(&self, prefix: &str) -> String {
        format!("{prefix}-{:x}", self.ids.fetch_add(1, Ordering::Relaxed))
    }

    /// Token ids below this are in the model's vocabulary.
    pub fn vocab(&self) -> usize {
        self.model.model.config().vocab_size
    }

    /// The context window in tokens.
    pub fn max_positions(&self) -> usize {
        self.model.model.config().max_position_embeddings
    }
}

/// Seconds since the Unix epoch (OpenAI's `created`).
pub fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// Bounds the sequences generating for requests at once. A request takes one permit
/// per sequence it runs; when there are none it queues, up to `max_queue` waiting
/// requests and `timeout` of waiting, and past either gets 503 with `Retry-After`.
pub struct Admission {
    permits: Arc<Semaphore>,
    max_running: usize,
    waiting: AtomicUsize,
    max_queue: usize,
    timeout: Duration,
}

impl Admission {
    fn new(max_running: usize, max_queue: usize, timeout: Duration) -> Self {
        Admission {
            permits: Arc::new(Semaphore::new(max_running)),
            max_running,
            waiting: AtomicUsize::new(0),
            max_queue,
            timeout,
        }
    }

    /// Refuses at once (400 naming `field`) a request of `sequences` sequences that
    /// could never run: more than the server runs for one request. Called before
    /// any of the request's work (tokenising, building its params).
    pub fn check_fits(&self, sequences: usize, field: &'static str) -> Result<(), ServeError> {
        if sequences > self.max_running {
            return Err(ServeError::invalid(
                field,
                format!(
                    "{sequences} sequences at once are more than the server runs for one \
                     request (--max-running {})",
                    self.max_running
                ),
            ));
        }
        Ok(())
    }

    /// Waits for room for all `sequences` of one request at once (a request never
    /// holds part of its room while waiting for the rest, so it cannot wait on
    /// itself); the permit holds the room until dropped.
    pub async fn admit(&self, sequences: usize) -> Result<OwnedSemaphorePermit, ServeError> {
        self.check_fits(sequences, "n")?;
        let wanted = sequences.max(1) as u32;
        if let Ok(permit) = self.permits.clone().try_acquire_many_owned(wanted) {
            return Ok(permit);
        }
        // The place is given back by the guard however the wait ends: a request
        // whose future is dropped while queued (its client left) frees it too.
        let Some(_place) = QueuePlace::take(&self.waiting, self.max_queue) else {
            return Err(ServeError::Overloaded("the request queue is full"));
        };
        let waited = tokio::time::timeout(
            self.timeout,
            self.permits.clone().acquire_many_owned(wanted),
        )
        .await;
        match waited {
            Ok(Ok(permit)) => Ok(permit),
            Ok(Err(_)) => Err(ServeError::Overloaded("the server is shutting down")),
            Err(_) => Err(ServeError::Overloaded(
                "the request waited past the queue timeout",
            )),
        }
    }

    /// Requests waiting for room now.
    pub fn queue_depth(&self) -> usize {
        self.waiting.load(Ordering::SeqCst)
    }

    /// Sequences running for requests now.
    pub fn running(&self) -> usize {
        self.max_running - self.permits.available_permits()
    }
}

/// A place in the admission queue, given back when dropped.
struct QueuePlace<'a>(&'a AtomicUsize);

impl<'a> QueuePlace<'a> {
    /// A place, if fewer than `max` are taken.
    fn take(waiting: &'a AtomicUsize, max: usize) -> Option<Self> {
        waiting
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |w| {
                (w < max).then_some(w + 1)
            })
            .ok()
            .map(|_| QueuePlace(waiting))
    }
}

impl Drop for QueuePlace<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}
