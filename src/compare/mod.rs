//! The learning comparison (`treegrpo compare`): Tree-GRPO's claim measured — eval
//! reward per computed token of tree rollouts against independent chains and the
//! paper's ablations, at an equal computed-token budget per step. The layer above the
//! closed loop: it runs many training runs and reads their logs.
//!
//! - [`arm`]: the arms by name (`tree`, `chain`, `tree-inter`, `tree-2-4-1`, …).
//! - [`plan`]: the experiment's settings (`compare.json`) and the folder's layout.
//! - [`run`]: the shared warm-start, every arm × seed run (resumed where stopped).
//! - [`summary`]: `summary.json` and the plot, from the runs' logs.
//! - [`report`]: `report.md`.
//! - [`error`]: [`CompareError`].

pub mod arm;
pub mod error;
pub mod plan;
pub mod report;
pub mod run;
pub mod summary;

pub use arm::{parse_arms, Arm};
pub use error::{ArmError, CompareError};
pub use plan::{run_dir, warm_start_dir, ComparePlan, PLAN_FILE};
pub use run::{
    run_compare, weights_hash, CompareEvent, CompareEventFn, CompareOutcome, StartRecord,
    START_FILE,
};
pub use summary::{ArmSummary, StepSignal, Summary, PLOT_FILE, REPORT_FILE, SUMMARY_FILE};
