//! Ctrl-C for the long commands (`rollout`, `train`): a count of SIGINTs kept by a
//! handler installed once, and futures that resolve when it passes a mark.
//!
//! The handler bumps an atomic count (async-signal-safe), and the future reads it
//! whenever it is polled (the rollout polls it after every finished prompt) and every
//! 100 ms on a timer: no pipe for a runtime worker to drain, as tokio's signal stream
//! has. (That stream was suspected when CI's interrupt test saw a rollout run to its
//! end; the cause was elsewhere: prompts took their turns in arbitrary order, so with
//! one prompt at a time nothing reached disk until the run was over, and the test,
//! which waits for the first written forest, sent its SIGINT after the end. Fixed in
//! `rollout/run.rs`.)

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
/// installed now, not at the first poll). Must be polled inside a tokio runtime (its
/// timer).
pub fn next_sigint() -> Pin<Box<dyn Future<Output = ()> + Send>> {
    nth_sigint(1)
}

/// A future that resolves once `n` (at least 1) SIGINTs have arrived after this call
/// (`train`'s second Ctrl-C quits at once, however quickly it follows the first).
pub fn nth_sigint(n: usize) -> Pin<Box<dyn Future<Output = ()> + Send>> {
    let seen = SIGINTS.load(Ordering::SeqCst) + n.max(1) - 1;
    if !install() {
        return Box::pin(async move {
            for _ in 0..n {
                fallback_ctrl_c().await;
            }
        });
    }
    // The timer is made at the first poll, inside the runtime that polls it.
    let mut tick: Option<Pin<Box<tokio::time::Sleep>>> = None;
    Box::pin(std::future::poll_fn(move |cx| {
        let tick = tick.get_or_insert_with(|| Box::pin(tokio::time::sleep(CHECK_EVERY)));
        loop {
            if SIGINTS.load(Ordering::SeqCst) > seen {
                return Poll::Ready(());
            }
            // Re-armed until it is pending again, so this task is woken by it.
            if tick.as_mut().poll(cx).is_pending() {
                return Poll::Pending;
            }
            tick.as_mut()
                .reset(tokio::time::Instant::now() + CHECK_EVERY);
        }
    }))
}

/// Tokio's portable Ctrl-C, where the counting handler is not available.
async fn fallback_ctrl_c() {
    if tokio::signal::ctrl_c().await.is_err() {
        std::future::pending::<()>().await;
    }
}
