//! `treegrpo serve`: the HTTP server for trainers (see `treegrpo::serve`).

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use clap::Args;
use treegrpo::engine::{Engine, EngineConfig};
use treegrpo::serve::{ServeConfig, Server};

#[derive(Debug, Args)]
pub struct ServeArgs {
    /// A .gguf file or an HF directory (default: the default model, fetched on first use).
    #[arg(long)]
    model: Option<PathBuf>,
    #[arg(long, default_value = "127.0.0.1")]
    host: IpAddr,
    /// Port to listen on (0: any free port; the one taken is printed).
    #[arg(long, default_value_t = 8000)]
    port: u16,
    /// KV cache budget in MiB (default: a quarter of the available memory, between
    /// 512 MiB and 8 GiB).
    #[arg(long)]
    kv_mib: Option<usize>,
    /// Most sequences per forward.
    #[arg(long, default_value_t = 64)]
    max_batch_seqs: usize,
    /// Most live fork sessions.
    #[arg(long, default_value_t = 1024)]
    max_sessions: usize,
    /// Seconds an idle session lives before it is closed and its KV freed.
    #[arg(long, default_value_t = 600.0)]
    session_ttl: f64,
    /// Require `Authorization: Bearer KEY` on every route but /health; repeat for
    /// several clients, each of which sees only the fork sessions it created.
    #[arg(long = "api-key", env = "TREEGRPO_API_KEY", value_delimiter = ',')]
    api_keys: Vec<String>,
    /// Most sequences generating for requests at once (more wait in the queue).
    #[arg(long, default_value_t = 256)]
    max_running: usize,
    /// Most requests waiting for room (503 with Retry-After beyond it).
    #[arg(long, default_value_t = 1024)]
    max_queue: usize,
    /// Seconds a request may wait for room before it gets 503.
    #[arg(long, default_value_t = 60.0)]
    queue_timeout: f64,
    /// Largest request body in MiB (413 above it).
    #[arg(long, default_value_t = 16)]
    max_body_mib: usize,
    /// Most leaves one /v1/rollouts request may grow over all its prompts (400
    /// above it).
    #[arg(long, default_value_t = 16_384)]
    max_rollout_leaves: u64,
    /// The folder /update_weights_from_disk may load checkpoints from (paths inside
    /// it only); without it the route answers 403.
    #[arg(long, value_name = "DIR")]
    weights_dir: Option<std::path::PathBuf>,
    /// Browser origins (`http://host:port`, comma-separated) whose pages may call the
    /// server; a request with any other `Origin` header is 403.
    #[arg(long, value_delimiter = ',')]
    allowed_origins: Vec<String>,
    /// Most connections open at once; one more is answered 503 and closed.
    #[arg(long, default_value_t = 1024)]
    max_connections: usize,
    /// Seconds a client may take to send a request's header (or, kept alive, to
    /// start its next request) before its connection is closed.
    #[arg(long, default_value_t = 60.0)]
    header_timeout: f64,
    /// Seconds a client may take to send a request's body (408 after it).
    #[arg(long, default_value_t = 600.0)]
    request_timeout: f64,
    /// Seconds a response may wait for the client to read before the connection is
    /// cut and the request's sequences are freed (a stalled stream reader).
    #[arg(long, default_value_t = 600.0)]
    idle_write_timeout: f64,
    /// The model id /v1/models lists (default: the model file's name).
    #[arg(long)]
    served_model_name: Option<String>,
    #[command(flatten)]
    precision: super::flags::PrecisionFlag,
}

fn seconds(flag: &str, s: f64) -> anyhow::Result<Duration> {
    Duration::try_from_secs_f64(s)
        .map_err(|_| anyhow::anyhow!("{flag} must be a non-negative number of seconds"))
}

pub fn run(a: ServeArgs) -> anyhow::Result<()> {
    anyhow::ensure!(a.max_running > 0, "--max-running must be at least 1");
    let path = treegrpo::model::fetch::model_path_or_default(a.model.as_deref(), &mut |m| {
        eprintln!("{m}")
    })?;
    let model = Arc::new(
        a.precision
            .apply(treegrpo::model::LoadedModel::load(&path)?)?,
    );
    let name = a.served_model_name.clone().unwrap_or_else(|| {
        path.file_stem().or_else(|| path.file_name()).map_or_else(
            || "treegrpo".to_string(),
            |s| s.to_string_lossy().into_owned(),
        )
    });
    let config = ServeConfig {
        api_keys: a.api_keys.clone(),
        max_sessions: a.max_sessions,
        session_ttl: seconds("--session-ttl", a.session_ttl)?,
        max_running: a.max_running,
        max_queue: a.max_queue,
        queue_timeout: seconds("--queue-timeout", a.queue_timeout)?,
        max_body_bytes: a.max_body_mib << 20,
        max_rollout_leaves: a.max_rollout_leaves,
        max_connections: a.max_connections.max(1),
        header_timeout: seconds("--header-timeout", a.header_timeout)?,
        request_timeout: seconds("--request-timeout", a.request_timeout)?,
        idle_write_timeout: seconds("--idle-write-timeout", a.idle_write_timeout)?,
        allowed_origins: a.allowed_origins.clone(),
        // A loopback bind answers loopback names only: a DNS-rebound name is 403.
        loopback_hosts_only: a.host.is_loopback(),
        weights_dir: a
            .weights_dir
            .as_ref()
            .map(|d| {
                std::fs::canonicalize(d)
                    .map_err(|e| anyhow::anyhow!("--weights-dir {}: {e}", d.display()))
            })
            .transpose()?,
        ..ServeConfig::new(name)
    };
    let engine = Engine::start(
        model,
        EngineConfig {
            kv_budget_bytes: super::flags::kv_budget_bytes(a.kv_mib),
            max_batch_seqs: a.max_batch_seqs,
            ..EngineConfig::default()
        },
    )?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    rt.block_on(async {
        let server = Server::bind(SocketAddr::new(a.host, a.port), engine, config).await?;
        let addr = server.local_addr()?;
        // Tests and scripts read the port from this line (with --port 0).
        eprintln!(
            "treegrpo serve: listening on http://{addr} (model {})",
            server.state().config.model_name
        );
        server.run(shutdown_signal()).await?;
        eprintln!("treegrpo serve: stopped");
        anyhow::Ok(())
    })
}

/// Ctrl-C or SIGTERM: stop taking requests, finish those in flight.
async fn shutdown_signal() {
    let ctrl_c = async {
        if tokio::signal::ctrl_c().await.is_err() {
            std::future::pending::<()>().await;
        }
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => {},
        _ = term => {},
    }
}
