//! Ctrl-C for the long commands (`rollout`, `train`): a count of SIGINTs kept by a
//! handler installed once, and futures that resolve when it passes a mark.
//!
//! Why not only `tokio::signal::ctrl_c`: its notice travels from the handler through a
//! pipe that a runtime worker must read, and twice in CI a rollout ran to its end with
//! a SIGINT caught (the handler installed, the signal pending) but never seen by the
//! run. Here the handler itself bumps an atomic count (async-signal-safe), and the
//! future reads it whenever it is polled (the rollout polls it after every finished
//! prompt) and on a short timer, besides listening to tokio's stream.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::OnceLock;
use std::task::Poll;
use std::time::Duration;

/// SIGINTs received since the handler was installed.
static SIGINTS: AtomicUsize = AtomicUsize::new(0);

/// How often a waiting future looks at the count when nothing else wakes it.
const CHECK_EVERY: Duration = Duration::from_millis(100);

/// Installs the counting handler (once per process; later calls do nothing). Returns
/// whether it is in place: where it cannot be, Ctrl-C keeps its default effect.
fn install() -> bool {
    static INSTALLED: OnceLock<bool> = OnceLock::new();
    *INSTALLED.get_or_init(|| {
        #[cfg(unix)]
        {
            // SAFETY: the action only increments an atomic, which is async-signal-safe.
            unsafe {
                signal_hook_registry::register(libc::SIGINT, || {
                    SIGINTS.fetch_add(1, Ordering::SeqCst);
                })
            }
            .is_ok()
        }
        #[cfg(not(unix))]
        false
    })
}

/// A future that resolves at the next SIGINT after this call (the handler is
/// installed now, not at the first poll). Must be called inside a tokio runtime
/// (for the timer and tokio's own stream).
pub fn next_sigint() -> Pin<Box<dyn Future<Output = ()> + Send>> {
    nth_sigint(1)
}

/// A future that resolves once `n` SIGINTs have arrived after this call (`train`'s
/// second Ctrl-C quits at once, however quickly it follows the first).
pub fn nth_sigint(n: usize) -> Pin<Box<dyn Future<Output = ()> + Send>> {
    let seen = SIGINTS.load(Ordering::SeqCst) + n - 1;
    if !install() {
        return Box::pin(async move {
            for _ in 0..n {
                fallback_ctrl_c().await;
            }
        });
    }
    #[cfg(unix)]
    let mut stream = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::interrupt()).ok();
    let mut tick = Box::pin(tokio::time::sleep(CHECK_EVERY));
    Box::pin(std::future::poll_fn(move |cx| {
        if SIGINTS.load(Ordering::SeqCst) > seen {
            return Poll::Ready(());
        }
        // Tokio's stream wakes this task as soon as a signal is read off its pipe (the
        // count is then already bumped: both actions run in the same handler call).
        #[cfg(unix)]
        while let Some(s) = stream.as_mut() {
            match s.poll_recv(cx) {
                Poll::Ready(Some(())) if SIGINTS.load(Ordering::SeqCst) > seen => {
                    return Poll::Ready(());
                }
                Poll::Ready(Some(())) => {}
                // The stream ended (its driver is gone): the count and timer remain.
                Poll::Ready(None) => stream = None,
                Poll::Pending => break,
            }
        }
        // Re-arm the timer until it is pending again, so this task is woken by it.
        while tick.as_mut().poll(cx).is_ready() {
            if SIGINTS.load(Ordering::SeqCst) > seen {
                return Poll::Ready(());
            }
            tick.as_mut()
                .reset(tokio::time::Instant::now() + CHECK_EVERY);
        }
        Poll::Pending
    }))
}

/// Tokio's portable Ctrl-C, where the counting handler is not available.
async fn fallback_ctrl_c() {
    if tokio::signal::ctrl_c().await.is_err() {
        std::future::pending::<()>().await;
    }
}
