//! Agent environments for Tree-GRPO rollouts: Search-R1 style agents that
//! think, call a tool (search a local corpus, or a calculator), and answer.
//!
//! The rollout layer drives an [`Environment`]: [`Environment::start`] gives
//! the first chat messages; the engine generates a step until one of
//! [`Environment::stop_strings`]; [`Environment::step`] parses it and
//! returns the observation to append (prompt tokens, loss mask 0) and
//! whether the episode is done; [`Environment::score`] grades the finished
//! trajectory. Episodes are plain values, cloned to fork a tree.

pub mod action;
pub mod action_kind;
pub mod agent_loop;
pub mod bm25;
pub mod calc;
pub mod calc_eval;
pub mod config;
pub mod corpus;
pub mod datagen;
pub mod environment;
pub mod episode;
pub mod error;
pub mod format;
pub mod ids;
pub mod jsonl;
pub mod normalize;
pub mod prompts;
pub mod protocol;
pub mod reward;
pub mod sample;
pub mod search_qa;
pub mod tags;
pub mod task;
pub mod tool;
pub mod tool_env;

pub use action::{parse_action, Action, InvalidReason};
pub use action_kind::ActionKind;
pub use agent_loop::{run_agent_loop, ModelStep, StepDone, StepModel};
pub use calc::{Calc, CalcEnv, CalcTool};
pub use config::EnvConfig;
pub use corpus::{Corpus, Document};
pub use environment::{Environment, Score, ScoreDetails, StepOutcome};
pub use episode::{Episode, ExternalState, Segment, SegmentKind, StepRecord};
pub use error::{EnvError, ToolError};
pub use ids::{DocId, SampleId};
pub use reward::{RewardConfig, RewardLevels, RewardMetric};
pub use sample::{load_samples, parse_samples, QaSample};
pub use search_qa::{Bm25Retriever, SearchQa, SearchQaEnv, SearchTool, DEFAULT_TOP_K};
pub use tags::Tags;
pub use task::{Split, Task, TaskData, UnknownTask};
pub use tool::{run_tool, Tool, ToolOutcome, ToolStatus};
pub use tool_env::{ToolEnv, ToolTask};
