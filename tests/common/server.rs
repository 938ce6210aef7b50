//! The server under test, in process: `treegrpo::serve::Server` bound to
//! `127.0.0.1:0` on a runtime of its own thread, stopped when dropped.

use std::net::SocketAddr;
use std::sync::Arc;
use std::thread::JoinHandle;

use treegrpo::engine::{Engine, EngineConfig};
use treegrpo::model::LoadedModel;
use treegrpo::serve::{ServeConfig, Server};

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
