//! The server's connections: accepted up to `--max-connections`, each served by
//! hyper's HTTP/1 with a header-read timeout, and cut off when the client stops
//! reading what the server writes for longer than the idle-write timeout.
//!
//! Why not `axum::serve`: it gives no header-read timeout (hyper's needs a timer it
//! does not set), no cap on connections and no write deadline. Without them a client
//! that opens connections and sends nothing, or sends a header a byte a minute, holds
//! sockets forever, and a client that stops reading a stream holds the sequences (and
//! KV) behind it forever: the write simply never completes. Here a stalled write
//! fails the connection, hyper drops the response, and dropping it frees the
//! request's sequences as a disconnect does (`run.rs`).
//!
//! A connection beyond the cap is answered `503` with `Retry-After` and closed at
//! once, rather than left in the kernel's backlog where the client cannot tell a full
//! server from a dead one.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::Router;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
use tokio::time::Sleep;

/// Connection counts `/metrics` reports.
#[derive(Debug, Default)]
pub struct ConnectionCounters {
    /// Connections open now.
    pub open: AtomicUsize,
    /// Connections accepted since the start.
    pub accepted: AtomicU64,
    /// Connections refused (503) because `--max-connections` were open.
    pub refused: AtomicU64,
    /// Connections closed because a request's header did not arrive in time.
    pub header_timeouts: AtomicU64,
    /// Connections closed because the client read nothing of a write for the
    /// idle-write timeout.
    pub write_timeouts: AtomicU64,
}

/// How connections are bounded (from [`ServeConfig`](super::ServeConfig)).
#[derive(Debug, Clone, Copy)]
pub struct ConnectionLimits {
    /// Most connections open at once.
    pub max_connections: usize,
    /// Longest a client may take to send a request's header (and, on a kept-alive
    /// connection, to start the next one).
    pub header_timeout: Duration,
    /// Longest a write may wait for the client to read.
    pub idle_write_timeout: Duration,
}

/// Accepts and serves connections until `stop` resolves, then stops accepting and
/// lets the connections finish their requests (the caller bounds how long).
pub async fn serve_connections(
    listener: TcpListener,
    router: Router,
    limits: ConnectionLimits,
    counters: Arc<ConnectionCounters>,
    stop: impl Future<Output = ()>,
) {
    let graceful = GracefulShutdown::new();
    let room = Arc::new(Semaphore::new(limits.max_connections));
    let mut stop = std::pin::pin!(stop);
    loop {
        let stream = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                // Out of file descriptors (or a connection reset before it was
                // taken): wait a moment rather than spin, as axum does.
                Err(_) => {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            () = &mut stop => break,
        };
        let Ok(place) = room.clone().try_acquire_owned() else {
            counters.refused.fetch_add(1, Ordering::Relaxed);
            tokio::spawn(refuse(stream));
            continue;
        };
        let _ = stream.set_nodelay(true);
        counters.accepted.fetch_add(1, Ordering::Relaxed);
        counters.open.fetch_add(1, Ordering::Relaxed);
        let io = TokioIo::new(WriteDeadline::new(
            stream,
            limits.idle_write_timeout,
            counters.clone(),
        ));
        let mut http = hyper::server::conn::http1::Builder::new();
        http.timer(TokioTimer::new())
            .header_read_timeout(limits.header_timeout)
            .keep_alive(true);
        let conn =
            graceful.watch(http.serve_connection(io, TowerToHyperService::new(router.clone())));
        let counters = counters.clone();
        tokio::spawn(async move {
            if let Err(e) = conn.await {
                if e.is_timeout() {
                    counters.header_timeouts.fetch_add(1, Ordering::Relaxed);
                }
            }
            counters.open.fetch_sub(1, Ordering::Relaxed);
            drop(place);
        });
    }
    drop(listener);
    graceful.shutdown().await;
}

/// A connection over the cap: told so, and closed.
async fn refuse(stream: TcpStream) {
    let body = br#"{"error":{"message":"the server is at its connection limit (--max-connections): retry","type":"overloaded_error","code":503}}"#;
    let head = format!(
        "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\nretry-after: 1\r\n\
         content-length: {}\r\nconnection: close\r\n\r\n",
        body.len()
    );
    let mut reply = head.into_bytes();
    reply.extend_from_slice(body);
    // A client that reads nothing does not hold this task: the write is bounded.
    let _ = tokio::time::timeout(Duration::from_secs(5), async {
        let mut sent = 0;
        while sent < reply.len() {
            stream.writable().await?;
            match stream.try_write(&reply[sent..]) {
                Ok(n) => sent += n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                Err(e) => return Err(e),
            }
        }
        Ok::<(), io::Error>(())
    })
    .await;
    drop(stream);
}

/// A TCP stream whose writes fail once one has waited `limit` for the client to read.
struct WriteDeadline {
    inner: TcpStream,
    limit: Duration,
    /// Armed when a write first finds the socket full; disarmed by any progress.
    stalled: Option<Pin<Box<Sleep>>>,
    counters: Arc<ConnectionCounters>,
}

impl WriteDeadline {
    fn new(inner: TcpStream, limit: Duration, counters: Arc<ConnectionCounters>) -> Self {
        WriteDeadline {
            inner,
            limit,
            stalled: None,
            counters,
        }
    }

    /// After the inner write or flush: progress disarms the deadline; waiting arms it
    /// and, once it has passed, becomes an error.
    fn deadline<T>(
        &mut self,
        cx: &mut Context<'_>,
        poll: Poll<io::Result<T>>,
    ) -> Poll<io::Result<T>> {
        if poll.is_ready() {
            self.stalled = None;
            return poll;
        }
        let limit = self.limit;
        let timer = self
            .stalled
            .get_or_insert_with(|| Box::pin(tokio::time::sleep(limit)));
        if timer.as_mut().poll(cx).is_ready() {
            self.counters.write_timeouts.fetch_add(1, Ordering::Relaxed);
            return Poll::Ready(Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "the client read nothing for the idle-write timeout",
            )));
        }
        Poll::Pending
    }
}

impl AsyncRead for WriteDeadline {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl AsyncWrite for WriteDeadline {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let poll = Pin::new(&mut self.inner).poll_write(cx, buf);
        self.deadline(cx, poll)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let poll = Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        self.deadline(cx, poll)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let poll = Pin::new(&mut self.inner).poll_flush(cx);
        self.deadline(cx, poll)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}
