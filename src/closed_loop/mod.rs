//! The closed loop: rollouts, advantages and updates in one process, the engine
//! serving each new policy. It sits above `rollout` (trees from the engine) and
//! `train` (the update), the only layer that uses both.
//!
//! - [`sft`]: the supervised warm-start on the task oracle's demonstrations.
//! - [`warm`]: the warm-start as the commands run it (evaluations, the warm weights
//!   served, its record), one implementation for `treegrpo sft` and `train`.
//! - [`config`]: [`LoopConfig`], how a run runs.
//! - [`start`]: how a run begins, fresh or resumed from its folder's record.
//! - [`folder`]: a run folder's layout and the rules for starting in one (resume,
//!   refuse, overwrite).
//! - [`record`]: the run records, `run.json` and the warm-start's, as typed structs.
//! - [`run`]: the training loop — step prompts and seeds, rollout, update, weight swap,
//!   evaluation, checkpoints with the loop's state, resume.
//! - `events`: what the loop reports as it runs ([`LoopEvent`]), its stop signal, and
//!   the hooks a step's rollout waves report through.
//! - [`step_rollout`]: a step's rollouts, in waves under a computed-token budget.
//! - [`eval`]: greedy mean reward on held-out prompts, and each question's.
//! - [`samples`]: trajectories as the update's samples.
//! - [`log`]: `log.jsonl`, one synced line per step, read back on resume.
//! - [`error`]: the layer's error type, [`LoopError`].

pub mod config;
pub mod error;
pub mod eval;
mod events;
pub mod folder;
pub mod log;
pub mod record;
pub mod run;
pub mod samples;
pub mod sft;
pub mod start;
pub mod step_rollout;
pub mod warm;

pub use config::{LoopConfig, LoopConfigError};
pub use error::LoopError;
pub use eval::{evaluate, Evaluation, QuestionReward};
pub use folder::{checkpoint_dir, prepare_fresh_folder, reference_dir, resumable};
pub use log::{read_log, read_log_for_resume, LogFile, ReadBack, StepLog, StepTokens};
pub use record::{
    RunRecord, RunSource, WarmStartRecord, RUN_RECORD_FILE, SFT_LOG_FILE, SFT_SUMMARY_FILE,
    WARM_START_FILE,
};
pub use run::{EventFn, LoopEvent, LoopOutcome, LoopState, StopSignal, TrainRun};
pub use samples::BoostedTokens;
pub use sft::{run_sft, sft_sample, warm_start, SftConfig, SftStepLog, WarmStart};
pub use start::RunStart;
pub use warm::{
    run_warm_start, EvalPoint, WarmStartConfig, WarmStartEvent, WarmStartInputs, WarmStarted,
};
