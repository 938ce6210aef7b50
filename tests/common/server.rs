//! The server under test, in process: `treegrpo::serve::Server` bound to
//! `127.0.0.1:0` on a runtime of its own thread, stopped when dropped; and the
//! fixtures of the tests that drive it (a tiny model, JSON helpers, the oracle).

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::single_sequence::{generate, GenerateRequest};
use serde_json::Value;
use treegrpo::engine::{Engine, EngineConfig, Sampling};
use treegrpo::model::{LoadedModel, Model};
use treegrpo::serve::{ServeConfig, Server};

use super::http::Reply;

pub struct TestServer {
    pub addr: SocketAddr,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl TestServer {
    pub fn start(model: Arc<LoadedModel>, engine: EngineConfig, config: ServeConfig) -> Self {
        let (addr_tx, addr_rx) = std::sync::mpsc::channel();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let thread = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async move {
                let engine = Engine::start(model, engine).unwrap();
                let server = Server::bind("127.0.0.1:0".parse().unwrap(), engine, config)
                    .await
                    .unwrap();
                addr_tx.send(server.local_addr().unwrap()).unwrap();
                server
                    .run(async {
                        let _ = stopped.await;
                    })
                    .await
                    .unwrap();
            });
        });
        TestServer {
            addr: addr_rx.recv().expect("the test server started"),
            stop: Some(stop),
            thread: Some(thread),
        }
    }

    /// The `/metrics` text now.
    pub fn metrics(&self) -> String {
        super::http::get(self.addr, "/metrics").text()
    }

    pub fn metric(&self, series: &str) -> f64 {
        super::http::metric(&self.metrics(), series)
    }
}

impl Drop for TestServer {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// A tiny model with room for long generations (the disconnect tests need time).
pub fn tiny(dir: &Path, seed: u64) -> Arc<LoadedModel> {
    super::tiny::write_long_context(dir, seed);
    Arc::new(LoadedModel::load(dir).unwrap())
}

/// A server on a tiny model (seed 7), the model, and the folder holding its files
/// (tests write other checkpoints beside it).
pub struct Fixture {
    pub dir: tempfile::TempDir,
    pub model: Arc<LoadedModel>,
    pub server: TestServer,
}

/// [`Fixture`] with the server's config changed by `configure`.
pub fn serve_with(configure: impl FnOnce(&mut ServeConfig)) -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let model = tiny(&dir.path().join("tiny"), 7);
    let mut config = ServeConfig::new("tiny");
    // Weight loads from the fixture's folder (where tests write other checkpoints).
    config.weights_dir = Some(std::fs::canonicalize(dir.path()).unwrap());
    configure(&mut config);
    let server = TestServer::start(model.clone(), EngineConfig::default(), config);
    Fixture { dir, model, server }
}

pub fn serve() -> Fixture {
    serve_with(|_| {})
}

/// The JSON body of a 200 answer (anything else fails the test, showing the body).
pub fn ok(reply: Reply) -> Value {
    assert_eq!(reply.status, 200, "{}", reply.text());
    reply.json()
}

pub fn ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .unwrap_or_else(|| panic!("not a list: {v}"))
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}

pub fn floats(v: &Value) -> Vec<f32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_f64().unwrap() as f32)
        .collect()
}

/// Polls until no sequence is live (a dropped request's sequences are freed).
pub fn wait_until_idle(server: &TestServer) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while server.metric("treegrpo_sequences") > 0.0 {
        assert!(
            Instant::now() < deadline,
            "sequences still live:\n{}",
            server.metrics()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The oracle: `prompt` generated greedily, alone, by the single-sequence path.
pub fn greedy_oracle(
    model: &Model,
    prompt: &[u32],
    n: usize,
    stop_tokens: &[u32],
) -> (Vec<u32>, Vec<f32>) {
    let out = generate(
        model,
        &GenerateRequest {
            penalties: treegrpo::engine::Penalties::NONE,
            prompt: prompt.to_vec(),
            max_new_tokens: n,
            sampling: Sampling::Greedy,
            seed: 0,
            stop_tokens: stop_tokens.to_vec(),
            prefill_chunk: 512,
        },
    )
    .unwrap();
    out.tokens.iter().map(|t| (t.token, t.logprob)).unzip()
}

/// Sends `body` to `path` on a connection of its own and leaves it open.
pub fn send_raw(addr: SocketAddr, path: &str, body: &Value) -> std::net::TcpStream {
    use std::io::Write as _;
    let mut conn = std::net::TcpStream::connect(addr).unwrap();
    let body = body.to_string();
    write!(
        conn,
        "POST {path} HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    conn
}

pub fn wait_for(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while !done() {
        assert!(Instant::now() < deadline, "{what}");
        std::thread::sleep(Duration::from_millis(5));
    }
}
