//! The learning comparison (`treegrpo compare`): Tree-GRPO's claim measured — eval
//! reward per computed token of tree rollouts against independent chains and the
//! paper's ablations, at an equal computed-token budget per step. The layer above the
//! closed loop: it runs many training runs and reads their logs.
//!
//! - [`arm`]: the arms by name (`tree`, `chain`, `tree-inter`, `tree-2-4-1`, …).
//! - [`plan`]: the experiment's settings (`compare.json`) and the folder's layout.
//! - [`run`]: the shared warm-start, every arm × seed run (resumed where stopped).
//! - [`start`]: `start.json`, the hash of the weights a run started from.
//! - [`summary`]: `summary.json`, from the runs' logs.
//! - [`paired`]: an arm against chain, paired by seed and question, with a
//!   cluster-bootstrap interval.
//! - [`report`]: `report.md` and the plot, and writing all three.
//! - [`error`]: the layer's error type, [`CompareError`].

pub mod arm;
pub mod error;
pub mod paired;
pub mod plan;
pub mod report;
pub mod run;
pub mod start;
pub mod summary;

pub use arm::{parse_arms, Arm};
pub use error::{ArmError, CompareError};
pub use paired::PairedDiff;
pub use plan::{run_dir, warm_start_dir, ComparePlan, PLAN_FILE};
pub use report::{write_outputs, PLOT_FILE, REPORT_FILE};
pub use run::{run_compare, CompareEvent, CompareEventFn, CompareOutcome};
pub use start::{weights_hash, StartRecord, START_FILE};
pub use summary::{ArmSummary, StepSignal, Summary, SUMMARY_FILE};
