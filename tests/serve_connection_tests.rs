//! The connection layer (`src/serve/connection.rs`) on a real server on
//! `127.0.0.1:0`: a connection past `max_connections` is answered 503 and closed, a
//! header that does not arrive within `header_timeout` closes its connection, and a
//! client that stops reading a stream is cut off after `idle_write_timeout` with its
//! sequences freed; each counted in `/metrics`.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use common::http;
use common::server::{send_raw, serve_with, wait_for};
use serde_json::json;

/// Reads until the server closes the connection (at most `limit`); what it sent.
fn read_until_closed(conn: &mut TcpStream, limit: Duration) -> Result<String, String> {
    conn.set_read_timeout(Some(limit)).unwrap();
    let mut out = Vec::new();
    match conn.read_to_end(&mut out) {
        Ok(_) => Ok(String::from_utf8_lossy(&out).into_owned()),
        // A reset is a close too.
        Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => {
            Ok(String::from_utf8_lossy(&out).into_owned())
        }
        Err(e) => Err(format!("still open after {limit:?} ({e})")),
    }
}

#[test]
fn a_connection_past_the_cap_is_refused_with_503_and_the_server_serves_on() {
    let f = serve_with(|c| c.max_connections = 2);
    let a = f.server.addr;
    // Two idle connections hold both places (each has sent nothing yet).
    let holders: Vec<TcpStream> = (0..2).map(|_| TcpStream::connect(a).unwrap()).collect();
    wait_for("the two connections were not counted", || {
        // Each probe is a connection of its own: wait until the holders are the
        // ones open (the probe itself may be refused while they are).
        let mut probe = TcpStream::connect(a).unwrap();
        write!(
            probe,
            "GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
        )
        .unwrap();
        read_until_closed(&mut probe, Duration::from_secs(10))
            .unwrap()
            .starts_with("HTTP/1.1 503")
    });
    let mut third = TcpStream::connect(a).unwrap();
    write!(third, "GET /health HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
    let reply = read_until_closed(&mut third, Duration::from_secs(10)).unwrap();
    assert!(reply.starts_with("HTTP/1.1 503"), "{reply}");
    assert!(
        reply.to_ascii_lowercase().contains("retry-after: 1"),
        "{reply}"
    );
    assert!(reply.contains("--max-connections"), "{reply}");

    drop(holders);
    wait_for(
        "the server did not serve again after the holders left",
        || http::get(a, "/health").status == 200,
    );
    assert!(f.server.metric("treegrpo_connections_refused_total") >= 2.0);
    assert!(f.server.metric("treegrpo_connections_accepted_total") >= 3.0);
}

#[test]
fn a_header_that_does_not_arrive_in_time_closes_its_connection() {
    let f = serve_with(|c| c.header_timeout = Duration::from_millis(300));
    let mut slow = TcpStream::connect(f.server.addr).unwrap();
    // Half a request line, then nothing (a slow-loris client).
    write!(slow, "GET /health HTTP/1.1\r\nHo").unwrap();
    let started = Instant::now();
    read_until_closed(&mut slow, Duration::from_secs(20)).unwrap();
    assert!(started.elapsed() >= Duration::from_millis(250));
    wait_for("the timeout was not counted", || {
        f.server.metric("treegrpo_header_timeouts_total") >= 1.0
    });
    // A client that sends its header is served as before.
    assert_eq!(http::get(f.server.addr, "/health").status, 200);
}

#[test]
fn a_client_that_stops_reading_a_stream_is_cut_off_and_its_sequences_freed() {
    let f = serve_with(|c| c.idle_write_timeout = Duration::from_millis(500));
    // Sixteen long streams with a logprob a token: megabytes of events,
    // more than the loopback socket buffers hold, so the server's writes stall.
    let body = json!({
        "prompt": [1, 2, 3], "max_tokens": 3000, "n": 16, "ignore_eos": true,
        "temperature": 1.0, "seed": 1, "logprobs": 0, "stream": true,
    });
    let stalled = send_raw(f.server.addr, "/v1/completions", &body);
    wait_for("the stream never ran", || {
        f.server.metric("treegrpo_running_sequences") >= 1.0
    });
    // Not a byte is read: once the buffers are full the write waits, then fails.
    wait_for("the stalled write was never cut off", || {
        f.server.metric("treegrpo_write_timeouts_total") >= 1.0
    });
    wait_for("the cut-off stream's sequences were not freed", || {
        f.server.metric("treegrpo_running_sequences") == 0.0
            && f.server.metric("treegrpo_kv_blocks{state=\"in_use\"}") == 0.0
    });
    drop(stalled);
    assert_eq!(http::get(f.server.addr, "/health").status, 200);
}
