//! The HTTP server for trainers (`treegrpo serve`): the engine behind the APIs RL
//! stacks already speak, plus explicit fork sessions, which none of their engines
//! offer. No logic of its own: handlers parse, call the engine or the rollout layer,
//! and shape the answer.
//!
//! - [`openai`]: `/v1/models`, `/v1/completions`, `/v1/chat/completions` (with
//!   [`stream`] for `stream: true`).
//! - [`native`]: SGLang's `/generate`, token ids in and out.
//! - [`sessions`]: `/v1/sessions…`, fork sessions sharing a KV prefix.
//! - [`rollouts`]: `/v1/rollouts`, tree rollouts on a built-in task.
//! - [`admin`]: weight reload, cache flush, health; [`metrics`]: Prometheus text.
//! - [`run`]: one request's sequences on the engine, freed when it ends or its
//!   client goes away; [`state`]: what handlers share, the admission gate.
//! - [`body`], [`sampling`]: request bodies and sampling fields; [`error`]: statuses.

pub mod admin;
pub mod blocking;
pub mod body;
pub mod connection;
pub mod error;
pub mod known_fields;
pub mod limits;
pub mod logprobs;
pub mod metrics;
pub mod native;
pub mod openai;
pub mod prepared;
pub mod request_metrics;
pub mod rollouts;
pub mod run;
pub mod sampling;
pub mod session_table;
pub mod sessions;
pub mod state;
pub mod stream;

use std::future::Future;
use std::net::SocketAddr;

use axum::extract::{DefaultBodyLimit, Request, State};
use axum::middleware::{from_fn_with_state, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use tokio::net::TcpListener;

use crate::engine::Engine;

pub use error::ServeError;
pub use session_table::Caller;
pub use state::{AppState, ServeConfig};

/// Every route, with the body limit, the API key check and the metrics around them.
pub fn router(state: AppState) -> Router {
    Router::new()
        .route("/v1/models", get(openai::models))
        .route("/v1/completions", post(openai::completions))
        .route("/v1/chat/completions", post(openai::chat_completions))
        .route("/generate", post(native::generate))
        .route("/v1/sessions", post(sessions::create))
        .route(
            "/v1/sessions/{id}",
            get(sessions::show).delete(sessions::delete),
        )
        .route("/v1/sessions/{id}/generate", post(sessions::generate))
        .route("/v1/sessions/{id}/append", post(sessions::append))
        .route("/v1/sessions/{id}/fork", post(sessions::fork))
        .route("/v1/rollouts", post(rollouts::rollouts))
        .route(
            "/update_weights_from_disk",
            post(admin::update_weights_from_disk),
        )
        .route("/flush_cache", post(admin::flush_cache))
        .route("/health", get(admin::health))
        .route("/metrics", get(metrics::metrics))
        .fallback(no_route)
        .layer(from_fn_with_state(state.clone(), require_key))
        .layer(from_fn_with_state(state.clone(), same_origin))
        .layer(DefaultBodyLimit::max(state.config.max_body_bytes))
        .layer(from_fn_with_state(state.clone(), metrics::track))
        .with_state(state)
}

async fn no_route(req: Request) -> ServeError {
    ServeError::NoRoute(format!("{} {}", req.method(), req.uri().path()))
}

/// With `--api-key`, every route but `GET /health` needs `Authorization: Bearer KEY`
/// with one of the keys; the request then carries its [`Caller`] (which key), so
/// fork sessions can belong to the key that made them.
async fn require_key(State(state): State<AppState>, mut req: Request, next: Next) -> Response {
    let keys = &state.config.api_keys;
    let mut caller = Caller::ANYONE;
    if !keys.is_empty() {
        let given = req
            .headers()
            .get(axum::http::header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "));
        // Every key is compared (in constant time each), so the time taken does not
        // say which key was close.
        let matched = given.and_then(|g| {
            keys.iter().enumerate().fold(None, |found, (i, key)| {
                found.or(same_secret(g.as_bytes(), key.as_bytes()).then_some(i))
            })
        });
        match matched {
            Some(i) => caller = Caller::key(i),
            None if req.uri().path() == "/health" => {}
            None => return ServeError::Unauthorized.into_response(),
        }
    }
    req.extensions_mut().insert(caller);
    next.run(req).await
}

/// Browser-origin protection on every route: a request carrying an `Origin` that
/// `--allowed-origins` does not list is 403 (a page's "simple" cross-site POST needs
/// no preflight, so it would otherwise reach every route), and on a loopback bind a
/// `Host` that is not a loopback name or address is 403 (DNS rebinding). Python,
/// curl and trainers send no `Origin` and a loopback `Host`.
async fn same_origin(State(state): State<AppState>, req: Request, next: Next) -> Response {
    if let Some(refusal) = refuse_origin(&state, req.headers()) {
        return refusal.into_response();
    }
    next.run(req).await
}

/// Why [`same_origin`] refuses a request with these headers, if it does.
fn refuse_origin(state: &AppState, headers: &axum::http::HeaderMap) -> Option<ServeError> {
    let header = |name| headers.get(name).map(|v| v.to_str().unwrap_or("\u{fffd}"));
    if let Some(origin) = header(axum::http::header::ORIGIN) {
        if !state.config.allowed_origins.iter().any(|o| o == origin) {
            return Some(ServeError::Forbidden(format!(
                "requests from the browser origin {origin:?} are refused (--allowed-origins)"
            )));
        }
    }
    let host = header(axum::http::header::HOST);
    match host {
        Some(host) if state.config.loopback_hosts_only && !is_loopback_host(host) => {
            Some(ServeError::Forbidden(format!(
                "Host {host:?} is not a loopback name on a loopback bind"
            )))
        }
        _ => None,
    }
}

/// Whether an HTTP `Host` (name or address, with or without a port) is loopback.
fn is_loopback_host(host: &str) -> bool {
    let name = match host.strip_prefix('[') {
        Some(rest) => rest.split(']').next().unwrap_or(""),
        None => host.rsplit_once(':').map_or(host, |(h, _)| h),
    };
    name.eq_ignore_ascii_case("localhost")
        || name
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

/// Compares without stopping at the first difference, so the time taken does not
/// tell how much of a guessed key was right.
fn same_secret(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// How long a server whose engine died goes on answering (503) before it exits, so
/// requests in flight and health probes see why rather than a refused connection.
pub const ENGINE_DEATH_DRAIN: std::time::Duration = std::time::Duration::from_secs(2);

/// A bound server, not yet serving (so a caller can read the port it got for `:0`).
pub struct Server {
    listener: TcpListener,
    state: AppState,
}

impl Server {
    /// Binds `addr` (port 0 picks a free one) and prepares the routes over `engine`
    /// with `config`; nothing is served until [`Self::run`]. Fails as the socket bind
    /// does (address in use, no permission).
    pub async fn bind(
        addr: SocketAddr,
        engine: Engine,
        config: ServeConfig,
    ) -> std::io::Result<Self> {
        Ok(Server {
            listener: TcpListener::bind(addr).await?,
            state: AppState::new(engine, config),
        })
    }

    /// The address actually bound: the port the OS chose when `bind` was given port 0.
    pub fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.listener.local_addr()
    }

    /// The state the handlers will share (engine, sessions, metrics), for a caller that
    /// embeds the server and wants to inspect it.
    pub fn state(&self) -> &AppState {
        &self.state
    }

    /// Serves until `shutdown` resolves, then lets requests in flight finish and
    /// frees every session.
    ///
    /// If the engine thread dies, every request that needs it is answered 503 (so is
    /// `/health`) for [`ENGINE_DEATH_DRAIN`], then the server shuts down and returns
    /// the engine's [`EngineError::Died`](crate::engine::EngineError::Died) as the
    /// error's source: `treegrpo serve` exits non-zero and a supervisor restarts it.
    pub async fn run(
        self,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> std::io::Result<()> {
        let state = self.state.clone();
        let reaper = tokio::spawn(expire_sessions(state.clone()));
        let engine = state.engine.clone();
        let death = async move {
            let message = engine.until_died().await;
            eprintln!(
                "treegrpo serve: the engine thread panicked ({message}); answering 503 for \
                 {} s, then exiting",
                ENGINE_DEATH_DRAIN.as_secs()
            );
            tokio::time::sleep(ENGINE_DEATH_DRAIN).await;
        };
        let stop = async move {
            tokio::select! {
                () = shutdown => {}
                () = death => {}
            }
        };
        let serving = connection::serve_connections(
            self.listener,
            router(self.state),
            state.config.connection_limits(),
            state.connections.clone(),
            stop,
        );
        // After a death, requests still in flight get their 503s quickly; one that
        // does not (a client reading nothing) is not waited on past the grace.
        let engine = state.engine.clone();
        tokio::select! {
            () = serving => {}
            _ = async {
                engine.until_died().await;
                tokio::time::sleep(ENGINE_DEATH_DRAIN * 5).await;
            } => {}
        }
        reaper.abort();
        if let Some(message) = state.engine.died() {
            return Err(std::io::Error::other(crate::engine::EngineError::Died {
                message: message.to_string(),
            }));
        }
        for seq in state.sessions.drain() {
            let _ = state.engine.free(seq).await;
        }
        Ok(())
    }
}

/// Closes idle sessions past their TTL, for the server's life.
async fn expire_sessions(state: AppState) {
    let mut tick = tokio::time::interval(state.sessions.sweep_interval());
    loop {
        tick.tick().await;
        for seq in state.sessions.expire() {
            state.engine.release(seq);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::is_loopback_host;

    #[test]
    fn loopback_hosts_are_names_and_addresses_of_this_machine() {
        for host in [
            "localhost",
            "LOCALHOST:8000",
            "127.0.0.1",
            "127.0.0.1:80",
            "[::1]:8000",
            "[::1]",
        ] {
            assert!(is_loopback_host(host), "{host}");
        }
        for host in [
            "evil.example",
            "evil.example:8000",
            "10.0.0.1",
            "localhost.evil.example",
            "[::2]:80",
            "",
        ] {
            assert!(!is_loopback_host(host), "{host}");
        }
    }
}
