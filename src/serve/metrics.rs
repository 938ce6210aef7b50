//! `GET /metrics` in Prometheus' text format: requests by endpoint and status with
//! their latencies (counted by a middleware around every route), and the engine's own
//! figures read at scrape time — tokens prefilled, decoded, reused and recomputed,
//! KV blocks by state, live sequences and sessions, queue depth, step latencies.

use std::fmt::Write as _;
use std::time::Instant;

use axum::extract::{MatchedPath, Request, State};
use axum::http::header;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use crate::engine::{EngineCounters, EngineStats};
use crate::kv::KvStats;

use super::error::ServeError;
use super::request_metrics::{family, histogram, series};
use super::state::AppState;

/// Middleware: counts every request under its route template (`/v1/sessions/{id}`,
/// not the id) with its status and latency. Streams count when their headers go out.
pub async fn track(State(state): State<AppState>, req: Request, next: Next) -> Response {
    let route = req
        .extensions()
        .get::<MatchedPath>()
        .map_or_else(|| "unmatched".to_string(), |p| p.as_str().to_string());
    let started = Instant::now();
    let response = next.run(req).await;
    state.metrics.record(
        &route,
        response.status().as_u16(),
        started.elapsed().as_secs_f64(),
    );
    response
}

/// `GET /metrics`: the requests the middleware counted, then the engine's figures.
pub async fn metrics(State(state): State<AppState>) -> Result<Response, ServeError> {
    let stats = state.engine.stats().await?;
    let mut out = String::new();
    state.metrics.write(&mut out);
    token_counters(&mut out, &stats.counters);
    kv_blocks(&mut out, &stats.kv);
    occupancy(&mut out, &state, &stats);
    connections(&mut out, &state.connections);
    family(
        &mut out,
        "treegrpo_step_duration_seconds",
        "histogram",
        "Engine step latency (one ragged batch's forward and sampling).",
    );
    histogram(
        &mut out,
        "treegrpo_step_duration_seconds",
        "",
        &stats.step_latency,
    );
    Ok((
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        out,
    )
        .into_response())
}

/// The engine's token and step counters.
fn token_counters(out: &mut String, c: &EngineCounters) {
    let counters: [(&str, &str, u64); 9] = [
        (
            "treegrpo_tokens_prefilled_total",
            "Rows computed for prompt and appended tokens.",
            c.prefilled,
        ),
        (
            "treegrpo_tokens_decoded_total",
            "Rows computed for sampled tokens fed back in.",
            c.decoded,
        ),
        (
            "treegrpo_tokens_sampled_total",
            "Tokens sampled.",
            c.sampled,
        ),
        (
            "treegrpo_tokens_reused_prefix_cache_total",
            "Prompt tokens served from the prefix cache, not computed.",
            c.reused_prefix_cache,
        ),
        (
            "treegrpo_tokens_reused_fork_total",
            "Tokens forks inherited from their parent, not computed.",
            c.reused_fork,
        ),
        (
            "treegrpo_tokens_recomputed_total",
            "Rows computed again after a preemption or a weight swap.",
            c.recomputed_preempted,
        ),
        (
            "treegrpo_preemptions_total",
            "Sequences whose KV was dropped under memory pressure.",
            c.preemptions,
        ),
        (
            "treegrpo_weight_swaps_total",
            "Weight swaps applied.",
            c.weight_swaps,
        ),
        (
            "treegrpo_engine_steps_total",
            "Forward passes run.",
            c.steps,
        ),
    ];
    series(out, "counter", &counters);
}

/// KV blocks by state.
fn kv_blocks(out: &mut String, kv: &KvStats) {
    family(
        out,
        "treegrpo_kv_blocks",
        "gauge",
        "KV blocks by state (in_use + cached + free = total).",
    );
    for (state_name, n) in [
        ("in_use", kv.in_use),
        ("cached", kv.cached),
        ("free", kv.free),
        ("pinned", kv.pinned),
        ("total", kv.num_blocks),
    ] {
        let _ = writeln!(out, "treegrpo_kv_blocks{{state=\"{state_name}\"}} {n}");
    }
}

/// What is live now: sequences, sessions, admitted and queued requests, and the
/// version of the weights served.
fn occupancy(out: &mut String, state: &AppState, stats: &EngineStats) {
    let gauges: [(&str, &str, u64); 6] = [
        (
            "treegrpo_sequences",
            "Live engine sequences.",
            stats.sequences as u64,
        ),
        (
            "treegrpo_sequences_generating",
            "Sequences generating now.",
            stats.generating as u64,
        ),
        (
            "treegrpo_sessions",
            "Live fork sessions.",
            state.sessions.len() as u64,
        ),
        (
            "treegrpo_queue_depth",
            "Requests waiting for room to run.",
            state.admission.queue_depth() as u64,
        ),
        (
            "treegrpo_running_sequences",
            "Sequences admitted for requests now.",
            state.admission.running() as u64,
        ),
        (
            "treegrpo_weight_version",
            "Version of the weights served.",
            stats.weight_version,
        ),
    ];
    series(out, "gauge", &gauges);
}

/// The connection layer's figures (`connection.rs`).
fn connections(out: &mut String, c: &super::connection::ConnectionCounters) {
    use std::sync::atomic::Ordering::Relaxed;
    series(
        out,
        "gauge",
        &[(
            "treegrpo_connections_open",
            "Connections open now.",
            c.open.load(Relaxed) as u64,
        )],
    );
    series(
        out,
        "counter",
        &[
            (
                "treegrpo_connections_accepted_total",
                "Connections accepted.",
                c.accepted.load(Relaxed),
            ),
            (
                "treegrpo_connections_refused_total",
                "Connections answered 503 and closed at --max-connections.",
                c.refused.load(Relaxed),
            ),
            (
                "treegrpo_header_timeouts_total",
                "Connections closed because a request header did not arrive within --header-timeout.",
                c.header_timeouts.load(Relaxed),
            ),
            (
                "treegrpo_write_timeouts_total",
                "Connections cut because the client read nothing for --idle-write-timeout.",
                c.write_timeouts.load(Relaxed),
            ),
        ],
    );
}
