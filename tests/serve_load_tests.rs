//! Load on `treegrpo serve` (the default model, in process on `127.0.0.1:0`): 32
//! clients for a bounded time (60 s; `TREEGRPO_LOAD_SECONDS` to change it), each
//! looping over a mix of endpoints — completions (plain, streamed, several choices),
//! chat, SGLang's `/generate`, and a fork session's whole life. No request may fail,
//! and afterwards no session or sequence is live and every KV block is free.
//!
//! It prints p50 / p99 latency per kind of request and the aggregate tokens/s beside
//! the engine's own figures (rows per step, computed tokens/s); with
//! `TREEGRPO_LOAD_REPORT=FILE` it also writes them as JSON. Speed is reported, never
//! asserted.

mod common;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::http;
use common::server::TestServer;
use serde_json::{json, Value};
use treegrpo::engine::EngineConfig;
use treegrpo::model::LoadedModel;
use treegrpo::serve::ServeConfig;

const CLIENTS: usize = 32;
const QUESTIONS: [&str; 4] = [
    "What is the capital of France?",
    "Name a river in Africa.",
    "How many legs does a spider have?",
    "Write one word that rhymes with cat.",
];

/// One finished request: its kind, latency and the tokens it generated.
struct Sample {
    kind: &'static str,
    seconds: f64,
    tokens: u64,
}

fn post(addr: SocketAddr, path: &str, body: &Value) -> Result<Value, String> {
    let r = http::post(addr, path, body);
    if r.status == 200 {
        Ok(if path.ends_with("completions") && body["stream"] == true {
            Value::String(r.text())
        } else {
            r.json()
        })
    } else {
        Err(format!("{path}: {} {}", r.status, r.text()))
    }
}

/// One request of the mix (by `turn`), timed.
fn one_request(addr: SocketAddr, client: usize, turn: usize) -> Result<Vec<Sample>, String> {
    let question = QUESTIONS[(client + turn) % QUESTIONS.len()];
    let messages = json!([{"role": "user", "content": question}]);
    let seed = (client * 1000 + turn) as u64;
    let started = Instant::now();
    let timed = |kind, tokens| Sample {
        kind,
        seconds: started.elapsed().as_secs_f64(),
        tokens,
    };
    let generated = |v: &Value| v["usage"]["completion_tokens"].as_u64().unwrap_or(0);
    Ok(match turn % 5 {
        0 => {
            let v = post(
                addr,
                "/v1/chat/completions",
                &json!({"messages": messages, "max_tokens": 24, "seed": seed}),
            )?;
            vec![timed("chat", generated(&v))]
        }
        1 => {
            let v = post(
                addr,
                "/v1/completions",
                &json!({"prompt": question, "max_tokens": 24, "n": 2, "seed": seed}),
            )?;
            vec![timed("completions n=2", generated(&v))]
        }
        2 => {
            let v = post(
                addr,
                "/v1/completions",
                &json!({"prompt": question, "max_tokens": 24, "stream": true,
                "seed": seed, "stream_options": {"include_usage": true}}),
            )?;
            let text = v.as_str().unwrap();
            if !text.trim_end().ends_with("data: [DONE]") {
                return Err(format!("a stream did not end with [DONE]: {text}"));
            }
            let usage = text
                .lines()
                .filter_map(|l| l.strip_prefix("data: "))
                .filter_map(|d| serde_json::from_str::<Value>(d).ok())
                .find_map(|c| c["usage"]["completion_tokens"].as_u64())
                .unwrap_or(0);
            vec![timed("completions stream", usage)]
        }
        3 => {
            let v = post(
                addr,
                "/generate",
                &json!({"text": question, "sampling_params": {"max_new_tokens": 24, "seed": seed}}),
            )?;
            vec![timed(
                "generate",
                v["meta_info"]["completion_tokens"].as_u64().unwrap_or(0),
            )]
        }
        _ => {
            // A session's life: prompt, a step, two branches, each a step, closed.
            let s = post(addr, "/v1/sessions", &json!({"messages": messages}))?;
            let id = s["session_id"].as_str().unwrap().to_string();
            let step = json!({"sampling_params": {"max_new_tokens": 12, "seed": seed}});
            let mut tokens = post(addr, &format!("/v1/sessions/{id}/generate"), &step)?
                ["output_ids"]
                .as_array()
                .map_or(0, |a| a.len() as u64);
            let forks = post(addr, &format!("/v1/sessions/{id}/fork"), &json!({"n": 2}))?;
            let mut all = vec![id];
            for child in forks["session_ids"].as_array().unwrap() {
                let child = child.as_str().unwrap().to_string();
                let out = post(addr, &format!("/v1/sessions/{child}/generate"), &step)?;
                tokens += out["output_ids"].as_array().map_or(0, |a| a.len() as u64);
                all.push(child);
            }
            for id in all {
                let r = http::delete(addr, &format!("/v1/sessions/{id}"));
                if r.status != 200 {
                    return Err(format!("delete {id}: {} {}", r.status, r.text()));
                }
            }
            vec![timed("session tree", tokens)]
        }
    })
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

#[test]
fn thirty_two_clients_over_every_endpoint_leave_nothing_behind() {
    let seconds: u64 = std::env::var("TREEGRPO_LOAD_SECONDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(60);
    let model = Arc::new(LoadedModel::load(&common::default_model()).unwrap());
    let server = TestServer::start(
        model,
        EngineConfig {
            kv_budget_bytes: 512 << 20,
            ..EngineConfig::default()
        },
        ServeConfig::new("default"),
    );
    let addr = server.addr;
    let before = server.metrics();
    let stop = Arc::new(AtomicBool::new(false));
    let t0 = Instant::now();
    let clients: Vec<_> = (0..CLIENTS)
        .map(|c| {
            let stop = stop.clone();
            std::thread::spawn(move || {
                let mut samples = Vec::new();
                let mut turn = c;
                while !stop.load(Ordering::Relaxed) {
                    samples.extend(one_request(addr, c, turn)?);
                    turn += 1;
                }
                Ok::<_, String>(samples)
            })
        })
        .collect();
    std::thread::sleep(Duration::from_secs(seconds));
    stop.store(true, Ordering::Relaxed);
    let mut samples = Vec::new();
    for c in clients {
        match c.join().unwrap() {
            Ok(s) => samples.extend(s),
            Err(e) => panic!("a request failed under load: {e}"),
        }
    }
    let wall = t0.elapsed().as_secs_f64();
    // Nothing is left: no session, no sequence, no block in use; after a flush
    // every block is free.
    let m = server.metrics();
    assert_eq!(http::metric(&m, "treegrpo_sessions"), 0.0);
    assert_eq!(http::metric(&m, "treegrpo_sequences"), 0.0);
    assert_eq!(
        http::metric(&m, "treegrpo_kv_blocks{state=\"in_use\"}"),
        0.0
    );
    assert_eq!(http::metric(&m, "treegrpo_running_sequences"), 0.0);
    assert_eq!(http::post(addr, "/flush_cache", &json!({})).status, 200);
    let flushed = server.metrics();
    assert_eq!(
        http::metric(&flushed, "treegrpo_kv_blocks{state=\"free\"}"),
        http::metric(&flushed, "treegrpo_kv_blocks{state=\"total\"}")
    );
    assert!(samples.len() >= CLIENTS, "every client finished a request");

    let delta = |series: &str| http::metric(&m, series) - http::metric(&before, series);
    let computed = delta("treegrpo_tokens_prefilled_total")
        + delta("treegrpo_tokens_decoded_total")
        + delta("treegrpo_tokens_recomputed_total");
    let steps = delta("treegrpo_engine_steps_total");
    let generated: u64 = samples.iter().map(|s| s.tokens).sum();
    let mut by_kind: BTreeMap<&str, Vec<f64>> = BTreeMap::new();
    for s in &samples {
        by_kind.entry(s.kind).or_default().push(s.seconds);
    }
    let mut kinds = serde_json::Map::new();
    eprintln!("| request | count | p50 s | p99 s |\n|---|---|---|---|");
    for (kind, mut v) in by_kind {
        v.sort_by(f64::total_cmp);
        let (p50, p99) = (percentile(&v, 0.5), percentile(&v, 0.99));
        eprintln!("| {kind} | {} | {p50:.3} | {p99:.3} |", v.len());
        kinds.insert(
            kind.into(),
            json!({"count": v.len(), "p50_s": p50, "p99_s": p99}),
        );
    }
    let mut all: Vec<f64> = samples.iter().map(|s| s.seconds).collect();
    all.sort_by(f64::total_cmp);
    let report = json!({
        "clients": CLIENTS,
        "seconds": wall,
        "requests": samples.len(),
        "p50_s": percentile(&all, 0.5),
        "p99_s": percentile(&all, 0.99),
        "generated_tokens_per_second": generated as f64 / wall,
        "engine_computed_tokens_per_second": computed / wall,
        "engine_steps": steps,
        "engine_rows_per_step": computed / steps.max(1.0),
        "reused_prefix_cache_tokens": delta("treegrpo_tokens_reused_prefix_cache_total"),
        "reused_fork_tokens": delta("treegrpo_tokens_reused_fork_total"),
        "by_request": kinds,
    });
    eprintln!("{}", serde_json::to_string_pretty(&report).unwrap());
    if let Ok(path) = std::env::var("TREEGRPO_LOAD_REPORT") {
        std::fs::write(path, serde_json::to_string_pretty(&report).unwrap() + "\n").unwrap();
    }
}
