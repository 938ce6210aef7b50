//! `treegrpo serve` against hostile and careless clients (issue 55): every absurd
//! value a client controls is refused with a 400 naming its field before any work
//! (the process grows by less than 50 MiB over all of them, where several used to
//! abort it); clients dropped while queued give their places back; a request whose
//! sequences could never run together is refused at once; a rollout whose client
//! leaves stops and frees its sequences; session ids are 128 random bits, and a
//! session belongs to the API key that created it. A tiny
//! model, as in `serve_tests.rs`.

mod common;

use std::io::Write;
use std::net::TcpStream;
use std::time::Duration;

use common::http;
use common::server::{ok, send_raw, serve_with, wait_for, wait_until_idle};
use serde_json::{json, Value};

/// This process's resident memory, in bytes (the server runs in it).
fn rss_bytes() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap();
    let pages: u64 = statm.split_whitespace().nth(1).unwrap().parse().unwrap();
    pages * 4096
}

#[test]
fn every_absurd_value_is_refused_naming_its_field_before_any_work() {
    let f = serve_with(|c| c.max_running = 64);
    let a = f.server.addr;
    let huge = 1_000_000_000_000u64;
    let many_ids: Vec<String> = (0..2000).map(|i| format!("calc_train_{i:04}")).collect();
    let cases: Vec<(&str, Value, &str)> = vec![
        (
            "/v1/rollouts",
            json!({"task": "calc", "prompts": 1, "trees": huge}),
            "trees",
        ),
        (
            "/v1/rollouts",
            json!({"task": "calc", "prompts": 1, "expand": huge}),
            "trees",
        ),
        (
            "/v1/rollouts",
            json!({"task": "calc", "prompts": 1, "rounds": huge}),
            "trees",
        ),
        (
            "/v1/rollouts",
            json!({"task": "calc", "prompts": 4, "trees": 64, "expand": 64}),
            "trees",
        ),
        (
            "/v1/rollouts",
            json!({"task": "calc", "prompts": 1, "chains": huge}),
            "chains",
        ),
        (
            "/v1/rollouts",
            json!({"task": "calc", "prompts": 1, "turns": huge}),
            "turns",
        ),
        (
            "/v1/rollouts",
            json!({"task": "calc", "prompts": 1, "max_step_tokens": huge}),
            "max_step_tokens",
        ),
        (
            "/v1/rollouts",
            json!({"task": "calc", "sample_ids": many_ids}),
            "sample_ids",
        ),
        (
            "/v1/rollouts",
            json!({"task": "calc", "sample_ids": ["calc_train_0000", "calc_train_0000"]}),
            "sample_ids",
        ),
        (
            "/generate",
            json!({"input_ids": [1, 2], "sampling_params": {"n": huge}}),
            "n",
        ),
        (
            "/generate",
            json!({"input_ids": vec![vec![1]; 100_000]}),
            "input_ids",
        ),
        (
            "/generate",
            json!({"input_ids": [1, 2], "rid": "r".repeat(1 << 20)}),
            "rid",
        ),
        ("/v1/completions", json!({"prompt": [1, 2], "n": huge}), "n"),
        (
            "/v1/completions",
            json!({"prompt": vec![vec![1]; 100_000]}),
            "prompt",
        ),
        (
            "/v1/completions",
            json!({"prompt": [1, 2], "max_tokens": u64::MAX}),
            "context window",
        ),
        (
            "/v1/completions",
            json!({"prompt": [1, 2], "stop_token_ids": vec![1; 10_000]}),
            "stop_token_ids",
        ),
        (
            "/v1/completions",
            json!({"prompt": [1, 2], "stop": vec!["x"; 1000]}),
            "stop",
        ),
        (
            "/v1/chat/completions",
            json!({"messages": [{"role": "user", "content": "hi"}], "n": 100}),
            "n",
        ),
    ];
    let before = rss_bytes();
    for (path, body, field) in &cases {
        let r = http::post(a, path, body);
        assert_eq!(
            r.status,
            400,
            "{path} {}: {}",
            &body.to_string()[..80.min(body.to_string().len())],
            r.text()
        );
        let message = r.json()["error"]["message"].as_str().unwrap().to_string();
        assert!(
            message.contains(field),
            "{path}: `{message}` does not name {field}"
        );
    }
    let grown = rss_bytes().saturating_sub(before);
    assert!(grown < 50 << 20, "the server grew by {} MiB", grown >> 20);
    assert_eq!(http::get(a, "/health").status, 200);
}

#[test]
fn clients_dropped_while_queued_give_their_places_back() {
    let f = serve_with(|c| {
        c.max_running = 1;
        c.max_queue = 2;
    });
    let a = f.server.addr;
    let long =
        json!({"prompt": [1, 2, 3], "max_tokens": 3500, "ignore_eos": true, "temperature": 0});
    let short = json!({"prompt": [4, 5], "max_tokens": 1});
    // One long generation holds the only place; twice over, two clients queue behind
    // it and disconnect while they wait: four drops, twice --max-queue.
    let running = send_raw(a, "/v1/completions", &long);
    wait_for("the long generation never ran", || {
        f.server.metric("treegrpo_running_sequences") >= 1.0
    });
    for _ in 0..2 {
        let queued: Vec<TcpStream> = (0..2)
            .map(|_| send_raw(a, "/v1/completions", &short))
            .collect();
        wait_for("the clients never queued", || {
            f.server.metric("treegrpo_queue_depth") >= 2.0
        });
        drop(queued);
        wait_for("a dropped client kept its place", || {
            f.server.metric("treegrpo_queue_depth") == 0.0
        });
    }
    // Behind the long generation, a client queues (not refused) and is served once
    // the long one is gone.
    let waiting = std::thread::spawn(move || http::post(a, "/v1/completions", &short));
    wait_for("the client never queued", || {
        f.server.metric("treegrpo_queue_depth") >= 1.0
    });
    drop(running);
    let served = waiting.join().unwrap();
    assert_eq!(served.status, 200, "{}", served.text());
    wait_until_idle(&f.server);
}

#[test]
fn a_request_whose_sequences_never_fit_together_is_refused_at_once() {
    let f = serve_with(|c| {
        c.max_running = 3;
        c.queue_timeout = Duration::from_secs(600);
    });
    let a = f.server.addr;
    // Two prompts of two choices: 4 sequences where 3 run at once. Streamed, they
    // used to be admitted prompt by prompt, the second waiting on the first's places
    // for the whole queue timeout.
    for stream in [true, false] {
        let r = http::post(
            a,
            "/v1/completions",
            &json!({"prompt": [[1, 2], [3, 4]], "n": 2, "max_tokens": 4, "stream": stream}),
        );
        assert_eq!(r.status, 400, "{}", r.text());
        assert!(
            r.text().contains("prompt") && r.text().contains("--max-running"),
            "{}",
            r.text()
        );
    }
    // Three fit: served.
    let r = http::post(
        a,
        "/v1/completions",
        &json!({"prompt": [[1, 2], [3, 4], [5, 6]], "max_tokens": 4, "stream": true}),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    wait_until_idle(&f.server);
}

#[test]
fn a_rollout_whose_client_leaves_stops_and_frees_its_sequences() {
    let f = serve_with(|_| {});
    let a = f.server.addr;
    let body = json!({"task": "calc", "prompts": 16, "trees": 2, "expand": 2, "max_step_tokens": 64, "turns": 2, "seed": 3});
    let decoded = || f.server.metric("treegrpo_tokens_decoded_total");
    // The whole rollout, for what it decodes.
    let start = decoded();
    let whole = ok(http::post(a, "/v1/rollouts", &body));
    assert!(whole["trajectories"]
        .as_array()
        .is_some_and(|t| !t.is_empty()));
    wait_until_idle(&f.server);
    let full = decoded() - start;
    // The same rollout, its client gone once it runs.
    let start = decoded();
    let conn = send_raw(a, "/v1/rollouts", &body);
    wait_for("the rollout never ran", || decoded() - start > 0.0);
    drop(conn);
    wait_until_idle(&f.server);
    assert_eq!(f.server.metric("treegrpo_kv_blocks{state=\"in_use\"}"), 0.0);
    assert_eq!(
        f.server.metric("treegrpo_running_sequences"),
        0.0,
        "its places are back"
    );
    let cut = decoded() - start;
    assert!(
        cut < full,
        "the abandoned rollout decoded {cut} tokens, the whole one {full}"
    );
}

#[test]
fn session_ids_are_128_random_bits() {
    let f = serve_with(|_| {});
    let ids: Vec<String> = (0..4)
        .map(|_| {
            let s = ok(http::post(
                f.server.addr,
                "/v1/sessions",
                &json!({"input_ids": [1, 2]}),
            ));
            s["session_id"].as_str().unwrap().to_string()
        })
        .collect();
    for id in &ids {
        let hex = id.strip_prefix("sess-").unwrap();
        assert_eq!(hex.len(), 32, "{id}");
        assert!(hex.chars().all(|c| c.is_ascii_hexdigit()), "{id}");
    }
    // Consecutive ids share no structure: their halves all differ.
    let halves: std::collections::HashSet<&str> =
        ids.iter().flat_map(|id| [&id[5..21], &id[21..]]).collect();
    assert_eq!(halves.len(), 8, "{ids:?}");
}

#[test]
fn a_session_belongs_to_the_key_that_created_it() {
    let f = serve_with(|c| c.api_keys = vec!["key-a".into(), "key-b".into()]);
    let a = f.server.addr;
    let call = |key: &str, method: &str, path: &str, body: Option<Value>| {
        let auth = format!("Bearer {key}");
        let body = body.map(|b| b.to_string());
        http::request(
            a,
            method,
            path,
            &[
                ("Authorization", &auth),
                ("Content-Type", "application/json"),
            ],
            body.as_deref().map(str::as_bytes),
        )
    };
    let created = ok(call(
        "key-a",
        "POST",
        "/v1/sessions",
        Some(json!({"input_ids": [1, 2]})),
    ));
    let id = created["session_id"].as_str().unwrap().to_string();
    let forked = ok(call(
        "key-a",
        "POST",
        &format!("/v1/sessions/{id}/fork"),
        Some(json!({"n": 2})),
    ));
    let branch = forked["session_ids"][0].as_str().unwrap().to_string();

    // To the other key neither the session nor its branch exists: every route 404,
    // exactly as for an id never issued.
    for target in [
        &id,
        &branch,
        &"sess-00000000000000000000000000000000".to_string(),
    ] {
        let gen = json!({"sampling_params": {"max_new_tokens": 2}});
        let tries = [
            call("key-b", "GET", &format!("/v1/sessions/{target}"), None),
            call(
                "key-b",
                "POST",
                &format!("/v1/sessions/{target}/generate"),
                Some(gen),
            ),
            call(
                "key-b",
                "POST",
                &format!("/v1/sessions/{target}/append"),
                Some(json!({"input_ids": [3]})),
            ),
            call(
                "key-b",
                "POST",
                &format!("/v1/sessions/{target}/fork"),
                Some(json!({"n": 1})),
            ),
            call("key-b", "DELETE", &format!("/v1/sessions/{target}"), None),
        ];
        for reply in tries {
            assert_eq!(reply.status, 404, "{target}: {}", reply.text());
        }
    }
    // Nothing the other key tried changed them; their owner still drives both.
    let shown = ok(call("key-a", "GET", &format!("/v1/sessions/{id}"), None));
    assert_eq!(shown["input_ids"], json!([1, 2]));
    ok(call(
        "key-a",
        "POST",
        &format!("/v1/sessions/{branch}/append"),
        Some(json!({"input_ids": [3]})),
    ));
    ok(call(
        "key-a",
        "DELETE",
        &format!("/v1/sessions/{branch}"),
        None,
    ));
    ok(call("key-a", "DELETE", &format!("/v1/sessions/{id}"), None));
    // Key b creates and owns sessions of its own.
    let own = ok(call(
        "key-b",
        "POST",
        "/v1/sessions",
        Some(json!({"input_ids": [4]})),
    ));
    let own = own["session_id"].as_str().unwrap();
    ok(call("key-b", "GET", &format!("/v1/sessions/{own}"), None));
    assert_eq!(
        call("key-a", "GET", &format!("/v1/sessions/{own}"), None).status,
        404
    );
}

/// The status of a raw `GET /v1/models` with `Host: host`.
fn status_for_host(addr: std::net::SocketAddr, host: &str) -> u16 {
    use std::io::Read;
    let mut conn = TcpStream::connect(addr).unwrap();
    write!(
        conn,
        "GET /v1/models HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut raw = String::new();
    let _ = conn.read_to_string(&mut raw);
    raw.split_whitespace().nth(1).unwrap().parse().unwrap()
}

#[test]
fn weights_load_from_the_weights_folder_only_and_other_origins_are_refused() {
    let f = serve_with(|_| {});
    let a = f.server.addr;
    let load =
        |path: &str| http::post(a, "/update_weights_from_disk", &json!({"model_path": path}));
    // Outside the folder: refused with nothing opened and nothing said of the file.
    std::os::unix::fs::symlink("/etc", f.dir.path().join("etc-link")).unwrap();
    for path in ["/etc/passwd", "../", "etc-link/passwd", "/nonexistent"] {
        let r = load(path);
        assert_eq!(r.status, 403, "{path}: {}", r.text());
        let message = r.json()["message"].as_str().unwrap().to_string();
        assert!(
            message.contains("--weights-dir") && !message.contains("magic"),
            "{message}"
        );
    }
    assert_eq!(f.server.metric("treegrpo_weight_version"), 0.0);
    // A page's "simple" cross-site POST (text/plain, no preflight) is refused before
    // the handler runs, on every route.
    let cross = |path: &str, body: &str| {
        http::request(
            a,
            "POST",
            path,
            &[
                ("Origin", "http://evil.example"),
                ("Content-Type", "text/plain"),
            ],
            Some(body.as_bytes()),
        )
    };
    let r = cross("/update_weights_from_disk", r#"{"model_path": "tiny"}"#);
    assert_eq!(r.status, 403, "{}", r.text());
    assert_eq!(cross("/v1/completions", r#"{"prompt": [1]}"#).status, 403);
    assert_eq!(
        f.server.metric("treegrpo_weight_version"),
        0.0,
        "nothing was loaded"
    );
    // Inside the folder it loads (the fixture's own model, by a relative path).
    let r = load("tiny");
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["weight_version"], 1);

    // Without a weights folder the route is off.
    let off = serve_with(|c| c.weights_dir = None);
    let r = http::post(
        off.server.addr,
        "/update_weights_from_disk",
        &json!({"model_path": "tiny"}),
    );
    assert_eq!(r.status, 403, "{}", r.text());
    // A listed origin is served; on a loopback bind, a rebound Host name is refused.
    let listed = serve_with(|c| {
        c.allowed_origins = vec!["http://ok.example".into()];
        c.loopback_hosts_only = true;
    });
    let b = listed.server.addr;
    let models = |origin: &str| http::request(b, "GET", "/v1/models", &[("Origin", origin)], None);
    assert_eq!(models("http://ok.example").status, 200);
    assert_eq!(models("http://evil.example").status, 403);
    assert_eq!(status_for_host(b, "evil.example"), 403);
    assert_eq!(status_for_host(b, &format!("localhost:{}", b.port())), 200);
    assert_eq!(status_for_host(b, &b.to_string()), 200);
}
