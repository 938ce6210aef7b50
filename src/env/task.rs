//! The built-in tasks by name: where their committed data lives, how to build their
//! environment and load their prompts. The CLI's `--task` and the benchmark use this.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::calc::CalcEnv;
use super::environment::Environment;
use super::error::EnvError;
use super::protocol::EnvConfig;
use super::sample::{load_samples, QaSample};
use super::search_qa::SearchQaEnv;
use super::DEFAULT_TOP_K;

/// A built-in task.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Task {
    /// Multi-hop QA over a local corpus with a BM25 search tool.
    SearchQa,
    /// Arithmetic word problems with a calculator tool.
    Calc,
}

impl std::str::FromStr for Task {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "search-qa" => Ok(Task::SearchQa),
            "calc" => Ok(Task::Calc),
            other => Err(format!("unknown task '{other}' (search-qa or calc)")),
        }
    }
}

impl Task {
    /// The data committed with the crate (`data/multihop`, `data/calc`).
    pub fn default_data(self) -> PathBuf {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("data");
        match self {
            Task::SearchQa => root.join("multihop"),
            Task::Calc => root.join("calc"),
        }
    }

    /// The task's environment over the data in `data` (search-qa: `corpus.jsonl`).
    pub fn environment(
        self,
        data: &Path,
        cfg: EnvConfig,
    ) -> Result<Arc<dyn Environment>, EnvError> {
        Ok(match self {
            Task::SearchQa => Arc::new(SearchQaEnv::from_corpus_file(
                &data.join("corpus.jsonl"),
                DEFAULT_TOP_K,
                cfg,
            )?),
            Task::Calc => Arc::new(CalcEnv::new(cfg)?),
        })
    }

    /// The first `n` prompts of `data/train.jsonl`.
    pub fn samples(self, data: &Path, n: usize) -> Result<Vec<QaSample>, EnvError> {
        let mut samples = load_samples(&data.join("train.jsonl"))?;
        samples.truncate(n);
        Ok(samples)
    }
}
