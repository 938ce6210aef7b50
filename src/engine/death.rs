//! The engine thread's death, made loud: a panic on the engine thread is caught, every
//! caller waiting on it and every later one gets [`EngineError::Died`] naming the
//! panic, and whoever holds an [`Engine`](super::Engine) can ask whether it died or
//! wait until it does (the server answers 503 and exits, so a supervisor restarts it).
//!
//! Why not keep serving: the panic left the engine core (KV refcounts, the schedule)
//! half-updated, so nothing it computes afterwards can be trusted. vLLM does the same
//! when its engine core dies.

use std::sync::OnceLock;

use tokio::sync::Notify;

/// Whether the engine thread died, and of what; shared by the thread and its handles.
#[derive(Debug, Default)]
pub struct Death {
    message: OnceLock<String>,
    notify: Notify,
}

impl Death {
    /// Records the panic's message and wakes every [`Self::wait`]er (once; a second
    /// record is ignored).
    pub fn record(&self, message: String) {
        if self.message.set(message).is_ok() {
            self.notify.notify_waiters();
        }
    }

    /// The panic's message, if the engine thread died.
    pub fn message(&self) -> Option<&str> {
        self.message.get().map(String::as_str)
    }

    /// Resolves with the panic's message once the engine thread has died.
    pub async fn wait(&self) -> String {
        loop {
            // Created before the check, so a death recorded in between still wakes it.
            let notified = self.notify.notified();
            if let Some(m) = self.message() {
                return m.to_string();
            }
            notified.await;
        }
    }
}

/// The text of a caught panic's payload (`panic!` gives a `&str` or a `String`).
pub fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        s.to_string()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "a panic without a message".to_string()
    }
}

/// A fault hook for the tests, compiled only with the `fault-injection` feature (which
/// only the test build turns on, through the crate's dev-dependency on itself): with
/// `TREEGRPO_FAULT_ENGINE_PANIC_AT_STEP=N` the engine thread panics at its N-th step,
/// so a test can watch a real `treegrpo serve` lose its engine.
#[cfg(feature = "fault-injection")]
pub fn before_step() {
    use std::sync::atomic::{AtomicU64, Ordering};
    static STEPS: AtomicU64 = AtomicU64::new(0);
    static AT: OnceLock<Option<u64>> = OnceLock::new();
    let at = AT.get_or_init(|| {
        std::env::var("TREEGRPO_FAULT_ENGINE_PANIC_AT_STEP")
            .ok()
            .and_then(|v| v.parse().ok())
    });
    if let Some(n) = *at {
        if STEPS.fetch_add(1, Ordering::Relaxed) + 1 == n {
            panic!("fault injected at engine step {n} (TREEGRPO_FAULT_ENGINE_PANIC_AT_STEP)");
        }
    }
}
