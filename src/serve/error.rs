//! The server layer's error type and how each error becomes an HTTP response.
//!
//! Every error answers with a JSON body in OpenAI's shape, `{"error": {"message",
//! "type", "param", "code"}}` (what the `openai` package parses into its exception
//! classes), and a status that tells a client whether to fix its request (4xx) or
//! retry later (429 and 503 carry `Retry-After`).

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::json;

use crate::engine::{EngineError, SamplingError};
use crate::env::EnvError;
use crate::model::ModelError;
use crate::rollout::{RolloutError, TreeConfigError};

/// What went wrong with a request.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// The body is not JSON, or not the JSON this endpoint takes (serde's message is
    /// the source: the response's message is the whole chain).
    #[error("invalid request body")]
    Body(#[source] serde_json::Error),
    /// The body holds a field this endpoint does not read.
    #[error("unknown field `{0}`: this endpoint does not read it (see docs/serving.md)")]
    UnknownField(String),
    /// The body is over the server's size limit (`--max-body-mib`).
    #[error("the request body is over the limit of {limit} bytes")]
    BodyTooLarge {
        /// The limit, in bytes.
        limit: usize,
    },
    /// A field holds a value the endpoint cannot serve.
    #[error("{param}: {message}")]
    Invalid {
        /// The request field at fault (OpenAI's `param`).
        param: &'static str,
        /// Why its value cannot be served.
        message: String,
    },
    /// Sampling settings the engine's rule refuses: the message names the field, the
    /// rule's own error (the source) says why.
    #[error("{}", .0.field())]
    Sampling(#[source] SamplingError),
    /// A tree shape the rollout's rule refuses (the field, then why).
    #[error("{}", .0.field())]
    TreeConfig(#[source] TreeConfigError),
    /// The prompt plus the tokens asked for do not fit the context window.
    #[error(
        "this model's context window is {max} tokens; the prompt has {prompt} and \
         {requested} more were asked for"
    )]
    ContextLength {
        /// Tokens in the prompt (or the session so far).
        prompt: usize,
        /// Tokens asked for on top (`max_tokens`, or the tokens appended).
        requested: usize,
        /// The model's context window in tokens.
        max: usize,
    },
    /// The server was started with `--api-key` and the request carries no
    /// `Authorization: Bearer KEY` header with that key (401).
    #[error("a valid API key is needed (header `Authorization: Bearer KEY`)")]
    Unauthorized,
    /// A request from a browser page of another origin (an `Origin` not listed by
    /// `--allowed-origins`), or, on a loopback bind, for a `Host` that is not a
    /// loopback name (DNS rebinding): 403.
    #[error("{0}")]
    Forbidden(String),
    /// A fork session id that is not open: closed, expired after its idle time, or
    /// never created (404). Open a new session.
    #[error("no session '{0}' (closed, expired after its idle time, or never created)")]
    UnknownSession(String),
    /// A request on a fork session that is still generating (409); a session serves
    /// one request at a time.
    #[error("session '{0}' is generating; wait for its result first")]
    SessionBusy(String),
    /// Opening (or forking) a session while the server holds `--max-sessions` of them
    /// (429): close sessions, or wait for idle ones to expire.
    #[error("the server holds its limit of {limit} sessions: close some first")]
    SessionLimit {
        /// The server's session limit (`--max-sessions`).
        limit: usize,
    },
    /// The client took longer than `--request-timeout` to send the request's body
    /// (408).
    #[error("the request body did not arrive within {seconds} s (--request-timeout)")]
    BodyTimeout {
        /// The server's limit, in seconds.
        seconds: u64,
    },
    /// More requests wait for room than the queue holds (`--max-queue`), or one waited
    /// past the queue timeout.
    #[error("the server is at capacity: {0}")]
    Overloaded(&'static str),
    /// No endpoint for this method and path (404); the message holds both.
    #[error("no route for {0}")]
    NoRoute(String),
    /// The engine refused or failed the request; the status depends on why (a bad
    /// token is 400, a busy sequence 409, a sequence that fits only once pins are
    /// released 503, an engine failure 500).
    #[error(transparent)]
    Engine(#[from] EngineError),
    /// The model failed: a context overflow, tokenizer or chat-template error is the
    /// client's (400), anything else the server's (500).
    #[error(transparent)]
    Model(#[from] ModelError),
    /// A rollout request's task data or environment could not be built from its
    /// settings (400).
    #[error(transparent)]
    Env(#[from] EnvError),
    /// A rollout request failed: a tree config it refuses is 400, an engine error
    /// keeps the engine's status, anything else is 500.
    #[error(transparent)]
    Rollout(#[from] RolloutError),
    /// A task of the server itself failed (a panic in a spawned rollout).
    #[error("server task failed")]
    Task(#[from] tokio::task::JoinError),
    /// The operating system's random source failed (a session id could not be made).
    #[error("the operating system's random source failed")]
    RandomSource(#[source] getrandom::Error),
}

/// Seconds a client should wait before retrying a 429 or 503.
const RETRY_AFTER_SECONDS: u64 = 1;

impl ServeError {
    /// A [`ServeError::Invalid`] for request field `param` (400, with `param` in
    /// the body so a client knows which field to fix).
    pub fn invalid(param: &'static str, message: impl Into<String>) -> Self {
        ServeError::Invalid {
            param,
            message: message.into(),
        }
    }

    /// The HTTP status: 4xx for what the client must change, 429/503 for what it may
    /// retry, 500 for the server's own failures.
    pub fn status(&self) -> StatusCode {
        use ServeError::*;
        match self {
            Body(_)
            | UnknownField(_)
            | Invalid { .. }
            | Sampling(_)
            | TreeConfig(_)
            | ContextLength { .. } => StatusCode::BAD_REQUEST,
            BodyTooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
            Unauthorized => StatusCode::UNAUTHORIZED,
            Forbidden(_) => StatusCode::FORBIDDEN,
            UnknownSession(_) | NoRoute(_) => StatusCode::NOT_FOUND,
            SessionBusy(_) => StatusCode::CONFLICT,
            SessionLimit { .. } => StatusCode::TOO_MANY_REQUESTS,
            Overloaded(_) => StatusCode::SERVICE_UNAVAILABLE,
            BodyTimeout { .. } => StatusCode::REQUEST_TIMEOUT,
            Engine(e) => engine_status(e),
            Rollout(RolloutError::Engine(e)) => engine_status(e),
            Model(
                ModelError::ContextOverflow { .. }
                | ModelError::Tokenizer { .. }
                | ModelError::TokenOutOfVocab { .. }
                | ModelError::EmptyEncoding,
            ) => StatusCode::BAD_REQUEST,
            Model(ModelError::Template(_) | ModelError::NoChatTemplate { .. }) => {
                StatusCode::BAD_REQUEST
            }
            Env(_) | Rollout(RolloutError::Config(_)) => StatusCode::BAD_REQUEST,
            Model(_) | Rollout(_) | Task(_) | RandomSource(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    /// OpenAI's error `type` for this status.
    fn kind(&self) -> &'static str {
        match self.status() {
            StatusCode::UNAUTHORIZED => "authentication_error",
            StatusCode::FORBIDDEN => "permission_error",
            StatusCode::NOT_FOUND => "not_found_error",
            StatusCode::TOO_MANY_REQUESTS => "rate_limit_error",
            s if s.is_client_error() => "invalid_request_error",
            _ => "server_error",
        }
    }

    fn param(&self) -> Option<String> {
        match self {
            ServeError::Invalid { param, .. } => Some(param.to_string()),
            ServeError::Sampling(e) => Some(e.field().into()),
            ServeError::TreeConfig(e) => Some(e.field().into()),
            ServeError::UnknownField(field) => Some(field.clone()),
            ServeError::Engine(EngineError::BadToken { .. }) => Some("prompt".into()),
            ServeError::Engine(EngineError::Sampling(e)) => Some(e.field().into()),
            ServeError::ContextLength { .. } => Some("max_tokens".into()),
            ServeError::Rollout(RolloutError::Config(e)) => Some(e.field().into()),
            _ => None,
        }
    }
}

/// The engine's errors: a caller's mistake is 400, a sequence that can only fit once
/// pins are released is 503 (retry), a conflict on a sequence is 409.
fn engine_status(e: &EngineError) -> StatusCode {
    use EngineError::*;
    match e {
        BadToken { .. }
        | EmptyPrompt
        | EmptySequence(_)
        | WeightShape { .. }
        | KvFormat { .. }
        | Sampling(_) => StatusCode::BAD_REQUEST,
        StaleWeightVersion { .. } => StatusCode::BAD_REQUEST,
        Model(ModelError::ContextOverflow { .. }) => StatusCode::BAD_REQUEST,
        NeverFits { pinned, .. } if *pinned > 0 => StatusCode::SERVICE_UNAVAILABLE,
        NeverFits { .. } => StatusCode::BAD_REQUEST,
        Busy(_) | SwapWithPins { .. } => StatusCode::CONFLICT,
        UnknownSequence(_) => StatusCode::NOT_FOUND,
        Freed(_) => StatusCode::GONE,
        // The engine is gone: retry elsewhere, or once a supervisor restarted us.
        Died { .. } | Stopped => StatusCode::SERVICE_UNAVAILABLE,
        Shared(original) => engine_status(original),
        _ => StatusCode::INTERNAL_SERVER_ERROR,
    }
}

impl IntoResponse for ServeError {
    fn into_response(self) -> Response {
        let status = self.status();
        let body = json!({
            "error": {
                "message": error_chain(&self),
                "type": self.kind(),
                "param": self.param(),
                "code": status.as_u16(),
            }
        });
        let mut response = (status, Json(body)).into_response();
        if matches!(
            status,
            StatusCode::TOO_MANY_REQUESTS | StatusCode::SERVICE_UNAVAILABLE
        ) {
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(RETRY_AFTER_SECONDS));
        }
        response
    }
}

/// The error's message followed by its causes, so a client sees the whole story
/// (a failed forward says why it failed).
pub use crate::error_chain;
