//! What the training loop tells its caller while it runs ([`LoopEvent`]s, through an
//! [`EventFn`]) and how the caller stops it ([`StopSignal`]); and the hooks each wave
//! of a step's rollouts is given, which forward the wave's progress as events and the
//! stop signal as its interrupt.

use std::path::Path;
use std::sync::{Arc, Mutex};

use tokio::sync::watch;

use super::log::StepLog;
use super::step_rollout::WaveStart;
use crate::rollout::{Progress, RunHooks};
use crate::train::UpdateProgress;

/// Something the loop reports while it runs (for progress displays).
#[derive(Debug)]
pub enum LoopEvent<'a> {
    /// A wave of step `step`'s rollouts started (`prompts_done` 0), or one of its
    /// prompts finished. A budgeted step runs several waves, each counting from 0.
    Rollout {
        /// The step whose rollouts are running (1-based).
        step: u64,
        /// The step's wave (1-based; see [`crate::closed_loop::step_rollout`]).
        wave: usize,
        /// Prompts done so far, rollouts and tokens, seconds, within the wave.
        progress: Progress,
    },
    /// A micro-batch of step `step`'s update finished.
    Update {
        /// The step whose update is running.
        step: u64,
        /// Micro-batches and rows done so far.
        progress: UpdateProgress,
    },
    /// Evaluation after step `step` (0: before training) starts.
    Evaluating {
        /// The step just finished (0: before the first update).
        step: u64,
    },
    /// Step `step` is done and logged.
    Step(&'a StepLog),
    /// A checkpoint was written.
    Checkpoint {
        /// The last step whose update the checkpoint holds.
        step: u64,
        /// The checkpoint folder (the run folder's `checkpoint/`).
        dir: &'a Path,
    },
}

/// A callback for [`LoopEvent`]s; called from the rollout's task too, hence `Send`.
pub type EventFn = Box<dyn FnMut(LoopEvent<'_>) + Send>;

/// Raised (by a SIGINT handler, say) to stop the loop at the next point where stopping
/// loses nothing: a step in progress is abandoned, never logged, and the last
/// checkpoint and the log stay as they were.
#[derive(Debug)]
pub struct StopSignal(watch::Sender<bool>);

impl Default for StopSignal {
    fn default() -> Self {
        StopSignal(watch::channel(false).0)
    }
}

impl StopSignal {
    /// Asks the loop to stop; it does so at its next safe point. Raising twice is the
    /// same as once.
    pub fn raise(&self) {
        self.0.send_replace(true);
    }

    /// Whether [`Self::raise`] has been called.
    pub fn is_raised(&self) -> bool {
        *self.0.borrow()
    }

    /// Resolves once raised.
    pub async fn raised(&self) {
        let mut rx = self.0.subscribe();
        let _ = rx.wait_for(|v| *v).await;
    }
}

/// The event callback, shared between the loop and each wave's progress callback
/// (which runs on the rollout's task).
pub(super) type SharedEvents = Arc<Mutex<EventFn>>;

/// Reports `event` to the callback.
pub(super) fn emit(events: &Mutex<EventFn>, event: LoopEvent<'_>) {
    (events.lock().expect("an event callback panicked"))(event)
}

/// What wave `start` of step `step`'s rollouts is given: its start reported (no
/// prompt done yet), its progress forwarded to `events`, and the stop signal as its
/// interrupt.
pub(super) fn wave_hooks(
    step: u64,
    start: WaveStart,
    events: &SharedEvents,
    stop: &Arc<StopSignal>,
) -> RunHooks {
    let wave = start.wave;
    emit(
        events,
        LoopEvent::Rollout {
            step,
            wave,
            progress: Progress {
                prompts_done: 0,
                prompts: start.prompts,
                rollouts: 0,
                computed_tokens: 0,
                seconds: 0.0,
            },
        },
    );
    let progress_events = events.clone();
    let stop_rollout = stop.clone();
    RunHooks {
        output: None,
        progress: Some(Box::new(move |progress| {
            emit(
                &progress_events,
                LoopEvent::Rollout {
                    step,
                    wave,
                    progress,
                },
            )
        })),
        interrupt: Some(Box::pin(async move { stop_rollout.raised().await })),
    }
}
