//! `treegrpo serve` under bad input and at its limits: each bad input's status while
//! another client's session goes on and finishes exactly as alone, 429 / 503 with
//! `Retry-After`, 401 without the key, and disconnects and idle expiry freeing their
//! sequences. A tiny model, as in `serve_tests.rs`.

mod common;

use std::io::Write;
use std::net::TcpStream;
use std::time::{Duration, Instant};

use common::http::{self, Reply};
use common::server::{greedy_oracle, ids, ok, serve, serve_with, wait_until_idle};
use serde_json::{json, Value};

const PROMPT: [u32; 6] = [40, 41, 42, 100, 101, 7];

/// Generates on a session in a thread (a long, exactly known generation).
fn background_generation(
    addr: std::net::SocketAddr,
    sid: String,
) -> std::thread::JoinHandle<Value> {
    std::thread::spawn(move || {
        ok(http::post(
            addr,
            &format!("/v1/sessions/{sid}/generate"),
            &json!({"sampling_params": {"max_new_tokens": 3500, "temperature": 0, "ignore_eos": true}}),
        ))
    })
}

#[test]
fn each_bad_input_gets_its_status_while_another_session_finishes() {
    let f = serve_with(|c| c.max_body_bytes = 64 << 10);
    let a = f.server.addr;
    let s = ok(http::post(a, "/v1/sessions", &json!({"input_ids": PROMPT})));
    let sid = s["session_id"].as_str().unwrap().to_string();
    let running = background_generation(a, sid.clone());
    let error = |r: Reply, status: u16| {
        assert_eq!(r.status, status, "{}", r.text());
        let body = r.json();
        assert!(
            body["error"]["message"]
                .as_str()
                .is_some_and(|m| !m.is_empty()),
            "{body}"
        );
        assert_eq!(body["error"]["code"], status);
        body
    };
    error(
        http::post_raw(a, "/v1/completions", b"{\"prompt\": [1, 2"),
        400,
    );
    let wrong = error(
        http::post(
            a,
            "/v1/completions",
            &json!({"prompt": [1, 2], "max_tokens": "many"}),
        ),
        400,
    );
    assert!(
        wrong["error"]["message"]
            .as_str()
            .unwrap()
            .contains("invalid"),
        "{wrong}"
    );
    let oov = error(
        http::post(
            a,
            "/v1/completions",
            &json!({"prompt": [1, 100000], "max_tokens": 2}),
        ),
        400,
    );
    assert!(oov["error"]["message"]
        .as_str()
        .unwrap()
        .contains("vocabulary"));
    error(
        http::post(
            a,
            "/v1/completions",
            &json!({"prompt": [-1], "max_tokens": 2}),
        ),
        400,
    );
    let huge: Vec<u32> = (0..30_000).map(|i| i % 200).collect();
    let big = serde_json::to_vec(&json!({"input_ids": huge})).unwrap();
    // Over the 64 KiB body limit.
    error(http::post_raw(a, "/v1/sessions", &big), 413);
    // Longer than the 4096-token context, and a prompt that fits but not with the
    // tokens asked for.
    let long: Vec<u32> = (0..4100).map(|i| i % 200).collect();
    error(
        http::post(
            a,
            "/v1/completions",
            &json!({"prompt": long, "max_tokens": 1}),
        ),
        400,
    );
    error(
        http::post(a, "/v1/sessions", &json!({"input_ids": long})),
        400,
    );
    error(
        http::post(
            a,
            "/v1/completions",
            &json!({"prompt": [1, 2, 3], "max_tokens": 4094}),
        ),
        400,
    );
    error(
        http::post(
            a,
            "/v1/completions",
            &json!({"prompt": [], "max_tokens": 2}),
        ),
        400,
    );
    error(
        http::post(
            a,
            "/v1/completions",
            &json!({"prompt": [1], "temperature": -1}),
        ),
        400,
    );
    error(
        http::post(
            a,
            "/v1/completions",
            &json!({"prompt": [1], "presence_penalty": 3.0}),
        ),
        400,
    );
    error(
        http::post(a, "/v1/chat/completions", &json!({"messages": []})),
        400,
    );
    error(http::post(a, "/v1/sessions/nope/generate", &json!({})), 404);
    error(
        http::post(a, "/v1/sessions/nope/fork", &json!({"n": 2})),
        404,
    );
    error(http::delete(a, "/v1/sessions/nope"), 404);
    error(http::get(a, "/v1/no-such-route"), 404);
    // The running session is leased: a second operation on it conflicts.
    std::thread::sleep(Duration::from_millis(50));
    let busy = http::post(
        a,
        &format!("/v1/sessions/{sid}/append"),
        &json!({"input_ids": [1]}),
    );
    if busy.status != 200 {
        error(busy, 409);
    }
    error(http::post(a, "/v1/rollouts", &json!({"task": "calc"})), 400);
    error(
        http::post(a, "/v1/rollouts", &json!({"task": "chess", "prompts": 1})),
        400,
    );
    let done = running.join().unwrap();
    // The session's generation is the one it would have been alone.
    let (want, _) = greedy_oracle(&f.model.model, &PROMPT, 3500, &[]);
    assert_eq!(ids(&done["output_ids"]), want);
    assert_eq!(done["finish_reason"], "length");
}

#[test]
fn limits_answer_429_and_503_with_retry_after_and_the_key_401() {
    let f = serve_with(|c| {
        c.max_sessions = 2;
        c.max_running = 1;
        c.max_queue = 0;
        c.api_keys = vec!["sekrit".into()];
    });
    let a = f.server.addr;
    let auth = [
        ("Authorization", "Bearer sekrit"),
        ("Content-Type", "application/json"),
    ];
    let post = |path: &str, body: &Value| {
        http::request(a, "POST", path, &auth, Some(body.to_string().as_bytes()))
    };
    let denied = http::post(a, "/v1/completions", &json!({"prompt": [1]}));
    assert_eq!(denied.status, 401);
    assert_eq!(denied.json()["error"]["type"], "authentication_error");
    let wrong = http::request(
        a,
        "GET",
        "/v1/models",
        &[("Authorization", "Bearer nope")],
        None,
    );
    assert_eq!(wrong.status, 401);
    assert_eq!(http::get(a, "/health").status, 200, "health needs no key");
    let models = http::request(a, "GET", "/v1/models", &auth, None);
    assert_eq!(models.json()["data"][0]["id"], "tiny");
    // Sessions: two fit, the third is refused.
    for _ in 0..2 {
        assert_eq!(
            post("/v1/sessions", &json!({"input_ids": [1, 2]})).status,
            200
        );
    }
    let full = post("/v1/sessions", &json!({"input_ids": [1, 2]}));
    assert_eq!(full.status, 429, "{}", full.text());
    assert_eq!(full.header("retry-after"), Some("1"));
    // One sequence runs at a time and nothing may queue: a request while another
    // runs is refused at once.
    let body =
        json!({"prompt": [1, 2, 3], "max_tokens": 3500, "ignore_eos": true, "temperature": 0});
    let first = std::thread::spawn(move || {
        http::request(
            a,
            "POST",
            "/v1/completions",
            &auth,
            Some(body.to_string().as_bytes()),
        )
    });
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let m = http::request(a, "GET", "/metrics", &auth, None).text();
        if http::metric(&m, "treegrpo_running_sequences") >= 1.0 {
            break;
        }
        assert!(Instant::now() < deadline, "the first request never ran");
        std::thread::sleep(Duration::from_millis(2));
    }
    let refused = post("/v1/completions", &json!({"prompt": [4], "max_tokens": 1}));
    assert_eq!(refused.status, 503, "{}", refused.text());
    assert_eq!(refused.header("retry-after"), Some("1"));
    let first = first.join().unwrap();
    assert_eq!(first.status, 200, "{}", first.text());
    assert_eq!(
        post("/v1/completions", &json!({"prompt": [4], "max_tokens": 1})).status,
        200
    );
}

#[test]
fn a_client_that_disconnects_mid_generation_frees_its_sequence() {
    let f = serve();
    for stream in [false, true] {
        let mut conn = TcpStream::connect(f.server.addr).unwrap();
        let body =
            json!({"prompt": [1, 2, 3], "max_tokens": 3500, "ignore_eos": true, "stream": stream})
                .to_string();
        write!(
            conn,
            "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        )
        .unwrap();
        let deadline = Instant::now() + Duration::from_secs(30);
        while f.server.metric("treegrpo_sequences_generating") < 1.0 {
            assert!(Instant::now() < deadline, "the generation never started");
            std::thread::sleep(Duration::from_millis(5));
        }
        drop(conn);
        wait_until_idle(&f.server);
        assert_eq!(
            f.server.metric("treegrpo_kv_blocks{state=\"in_use\"}"),
            0.0,
            "stream: {stream}"
        );
        let decoded = f.server.metric("treegrpo_tokens_decoded_total");
        assert!(
            decoded < 3500.0 * if stream { 2.0 } else { 1.0 },
            "the generation stopped early"
        );
    }
    // A session whose generation is abandoned is closed with it.
    let s = ok(http::post(
        f.server.addr,
        "/v1/sessions",
        &json!({"input_ids": [1, 2]}),
    ));
    let sid = s["session_id"].as_str().unwrap();
    let mut conn = TcpStream::connect(f.server.addr).unwrap();
    let body = json!({"sampling_params": {"max_new_tokens": 3500, "ignore_eos": true}}).to_string();
    write!(
        conn,
        "POST /v1/sessions/{sid}/generate HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    while f.server.metric("treegrpo_sequences_generating") < 1.0 {
        std::thread::sleep(Duration::from_millis(5));
    }
    drop(conn);
    wait_until_idle(&f.server);
    assert_eq!(f.server.metric("treegrpo_sessions"), 0.0);
}

#[test]
fn idle_sessions_expire_after_their_ttl() {
    let f = serve_with(|c| c.session_ttl = Duration::from_millis(300));
    let s = ok(http::post(
        f.server.addr,
        "/v1/sessions",
        &json!({"input_ids": [1, 2, 3]}),
    ));
    let sid = s["session_id"].as_str().unwrap();
    assert_eq!(f.server.metric("treegrpo_sessions"), 1.0);
    let deadline = Instant::now() + Duration::from_secs(10);
    while f.server.metric("treegrpo_sessions") > 0.0 {
        assert!(Instant::now() < deadline, "the session never expired");
        std::thread::sleep(Duration::from_millis(50));
    }
    wait_until_idle(&f.server);
    assert_eq!(
        http::get(f.server.addr, &format!("/v1/sessions/{sid}")).status,
        404
    );
}
