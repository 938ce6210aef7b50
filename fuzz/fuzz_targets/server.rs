//! The server's request bodies through the real router (no socket), on a tiny model
//! the target writes itself (`tests/common/tiny.rs`, a 64-token context, so any
//! request's work is small). The first byte picks the endpoint, the rest is the body.
//! No input may make the server fail on its own account: every answer is a success
//! or a 4xx (or a 503 under load), with a whole body.

#![no_main]

#[allow(dead_code)]
#[path = "../../tests/common/tiny.rs"]
mod tiny;

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use axum::body::Body;
use axum::http::{Method, Request, StatusCode};
use libfuzzer_sys::fuzz_target;
use tower::ServiceExt;
use treegrpo::engine::{Engine, EngineConfig};
use treegrpo::model::LoadedModel;
use treegrpo::serve::{router, AppState, ServeConfig};

struct World {
    rt: tokio::runtime::Runtime,
    app: axum::Router,
}

fn world() -> &'static World {
    static WORLD: OnceLock<World> = OnceLock::new();
    WORLD.get_or_init(|| {
        let dir = std::env::temp_dir().join(format!("treegrpo-fuzz-server-{}", std::process::id()));
        tiny::TinyModel::new(tiny::Flavour::Llama, 7).write_hf(&dir, candle_core::DType::F32, 1);
        let model = Arc::new(LoadedModel::load(&dir).expect("the tiny model loads"));
        let _ = std::fs::remove_dir_all(&dir);
        let engine = Engine::start(
            model,
            EngineConfig {
                kv_budget_bytes: 64 << 20,
                ..EngineConfig::default()
            },
        )
        .expect("the engine starts");
        let config = ServeConfig {
            max_running: 16,
            max_sessions: 64,
            queue_timeout: Duration::from_secs(2),
            max_body_bytes: 1 << 20,
            // Small enough that every rollout the server takes runs in moments.
            max_rollout_leaves: MAX_LEAVES,
            ..ServeConfig::new("tiny")
        };
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        World {
            rt,
            app: router(AppState::new(engine, config)),
        }
    })
}

/// Sends one request; the status and the JSON body if it has one.
fn send(
    w: &World,
    method: Method,
    path: &str,
    body: Vec<u8>,
) -> (StatusCode, Option<serde_json::Value>) {
    let req = Request::builder()
        .method(method)
        .uri(path)
        .body(Body::from(body))
        .unwrap();
    w.rt.block_on(async {
        let resp = w.app.clone().oneshot(req).await.unwrap();
        let status = resp.status();
        let bytes = axum::body::to_bytes(resp.into_body(), usize::MAX)
            .await
            .expect("a whole body");
        (status, serde_json::from_slice(&bytes).ok())
    })
}

/// A session to drive: created fresh for each input, closed after it (with every
/// session the input made), so sessions never pile up.
fn session(w: &World) -> String {
    let (status, body) = send(
        w,
        Method::POST,
        "/v1/sessions",
        br#"{"input_ids": [5, 6, 7, 8]}"#.to_vec(),
    );
    assert_eq!(status, StatusCode::OK, "{body:?}");
    body.unwrap()["session_id"].as_str().unwrap().to_string()
}

fn close(w: &World, id: &str) {
    let _ = send(w, Method::DELETE, &format!("/v1/sessions/{id}"), Vec::new());
}

/// Most leaves a fuzzed rollout may grow (`--max-rollout-leaves`): a rollout of more
/// than a few takes seconds even on the tiny model, and the fuzzer learns nothing
/// from its size that a small one does not show — so a larger one must be refused.
const MAX_LEAVES: u64 = 16;

/// Whether `body` asks for a rollout beyond [`MAX_LEAVES`] (a shape the server must
/// answer with 400 before any work).
fn too_big_a_rollout(body: &[u8]) -> bool {
    let Ok(v) = serde_json::from_slice::<serde_json::Value>(body) else {
        return false;
    };
    let count = |key: &str, default: u64| {
        v.get(key).map_or(Some(default), |x| {
            x.as_u64().or_else(|| x.as_array().map(|a| a.len() as u64))
        })
    };
    let prompts = count("prompts", 1).max(count("sample_ids", 1));
    let leaves = match count("chains", 0) {
        Some(g) if v.get("chains").is_some() => Some(g),
        _ => (|| {
            let branches = count("expand", 2)?.checked_mul(count("rounds", 1)?)?;
            count("trees", 2)?.checked_mul(branches.checked_add(1)?)
        })(),
    };
    match (prompts, leaves) {
        (Some(p), Some(l)) => p.checked_mul(l).is_none_or(|n| n > MAX_LEAVES),
        _ => false,
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((&which, body)) = data.split_first() else {
        return;
    };
    let w = world();
    let base = session(w);
    let path = match which % 9 {
        0 => "/v1/completions".to_string(),
        1 => "/v1/chat/completions".to_string(),
        2 => "/generate".to_string(),
        3 => "/v1/sessions".to_string(),
        4 => format!("/v1/sessions/{base}/generate"),
        5 => format!("/v1/sessions/{base}/append"),
        6 => format!("/v1/sessions/{base}/fork"),
        7 => "/update_weights_from_disk".to_string(),
        _ => "/v1/rollouts".to_string(),
    };
    let too_big = which % 9 == 8 && too_big_a_rollout(body);
    let (status, answer) = send(w, Method::POST, &path, body.to_vec());
    assert!(
        !too_big
            || status == StatusCode::BAD_REQUEST
            || status == StatusCode::PAYLOAD_TOO_LARGE,
        "{path}: a rollout beyond {MAX_LEAVES} leaves answered {status} {answer:?}"
    );
    assert!(
        status.is_success()
            || status.is_client_error()
            || status == StatusCode::SERVICE_UNAVAILABLE,
        "{path}: {status} {answer:?}"
    );
    if let Some(a) = &answer {
        for id in a["session_ids"]
            .as_array()
            .into_iter()
            .flatten()
            .chain(a.get("session_id"))
        {
            if let Some(id) = id.as_str() {
                close(w, id);
            }
        }
    }
    close(w, &base);
});
