//! The built-in tasks by name: their data (committed with the crate and embedded in
//! the binary, or a folder of the user's), how to build their environment and load
//! their prompts. The CLI's `--task` and the benchmark use this.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::calc::CalcEnv;
use super::config::EnvConfig;
use super::corpus::Corpus;
use super::environment::Environment;
use super::error::EnvError;
use super::sample::{parse_samples, QaSample};
use super::search_qa::{SearchQaEnv, DEFAULT_TOP_K};

/// A built-in task. Read from text (a flag, a request field, a Python argument, a
/// run record) through [`FromStr`](std::str::FromStr) alone, so an unknown name gets
/// the same [`UnknownTask`] answer whichever way it came in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", try_from = "String")]
pub enum Task {
    /// Multi-hop QA over a local corpus with a BM25 search tool.
    SearchQa,
    /// Arithmetic word problems with a calculator tool.
    Calc,
}

/// A task name that names no built-in task.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown task '{given}' (search-qa or calc)")]
pub struct UnknownTask {
    /// The name as given.
    pub given: String,
}

impl std::str::FromStr for Task {
    type Err = UnknownTask;
    fn from_str(s: &str) -> Result<Self, UnknownTask> {
        match s {
            "search-qa" => Ok(Task::SearchQa),
            "calc" => Ok(Task::Calc),
            other => Err(UnknownTask {
                given: other.to_owned(),
            }),
        }
    }
}

impl Task {
    /// The task's name, as `FromStr` reads it.
    pub fn name(self) -> &'static str {
        match self {
            Task::SearchQa => "search-qa",
            Task::Calc => "calc",
        }
    }
}

impl std::fmt::Display for Task {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl TryFrom<String> for Task {
    type Error = UnknownTask;
    fn try_from(s: String) -> Result<Self, UnknownTask> {
        s.parse()
    }
}

/// Where a task's data comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TaskData {
    /// The data committed with the crate, compiled into the binary (under 1 MB), so
    /// an installed `treegrpo` works from any folder.
    Embedded,
    /// A folder of the user's own in the task's layout (`--data DIR`).
    Dir(PathBuf),
}

impl TaskData {
    /// `--data DIR` if given, else the embedded data.
    pub fn from_option(dir: Option<PathBuf>) -> Self {
        dir.map_or(TaskData::Embedded, TaskData::Dir)
    }
}

/// The committed data files, by task folder and file name.
fn embedded(folder: &str, file: &str) -> Option<&'static str> {
    Some(match (folder, file) {
        ("multihop", "corpus.jsonl") => include_str!("../../data/multihop/corpus.jsonl"),
        ("multihop", "train.jsonl") => include_str!("../../data/multihop/train.jsonl"),
        ("multihop", "test.jsonl") => include_str!("../../data/multihop/test.jsonl"),
        ("calc", "train.jsonl") => include_str!("../../data/calc/train.jsonl"),
        ("calc", "test.jsonl") => include_str!("../../data/calc/test.jsonl"),
        _ => return None,
    })
}

impl Task {
    /// The folder of the task's committed data under `data/`.
    pub fn data_folder(self) -> &'static str {
        match self {
            Task::SearchQa => "multihop",
            Task::Calc => "calc",
        }
    }

    /// The text of one of the task's data files and the path errors name.
    fn read(self, data: &TaskData, file: &str) -> Result<(String, PathBuf), EnvError> {
        match data {
            TaskData::Dir(dir) => {
                let path = dir.join(file);
                let text = std::fs::read_to_string(&path).map_err(|source| EnvError::Io {
                    op: "read",
                    path: path.clone(),
                    source,
                })?;
                Ok((text, path))
            }
            TaskData::Embedded => {
                let folder = self.data_folder();
                let path = Path::new("(embedded) data").join(folder).join(file);
                let text = embedded(folder, file).ok_or_else(|| EnvError::Io {
                    op: "read",
                    path: path.clone(),
                    source: std::io::Error::from(std::io::ErrorKind::NotFound),
                })?;
                Ok((text.to_string(), path))
            }
        }
    }

    /// The task's environment over its data (search-qa: `corpus.jsonl`).
    pub fn environment(
        self,
        data: &TaskData,
        cfg: EnvConfig,
    ) -> Result<Arc<dyn Environment>, EnvError> {
        Ok(match self {
            Task::SearchQa => {
                let (text, path) = self.read(data, "corpus.jsonl")?;
                let corpus = Corpus::parse_jsonl(&text, &path)?;
                Arc::new(SearchQaEnv::with_bm25(corpus, DEFAULT_TOP_K, cfg)?)
            }
            Task::Calc => Arc::new(CalcEnv::new(cfg)?),
        })
    }

    /// The task's environment with `max_turns` tool turns and its first `n` prompts:
    /// what a run of the task needs.
    pub fn setup(
        self,
        data: &TaskData,
        max_turns: usize,
        n: usize,
    ) -> Result<(Arc<dyn Environment>, Vec<QaSample>), EnvError> {
        let cfg = EnvConfig {
            max_turns,
            ..EnvConfig::default()
        };
        Ok((self.environment(data, cfg)?, self.samples(data, n)?))
    }

    /// The first `n` prompts of the task's `train.jsonl`.
    pub fn samples(self, data: &TaskData, n: usize) -> Result<Vec<QaSample>, EnvError> {
        self.split(data, Split::Train, n)
    }

    /// The first `n` prompts of one of the task's splits.
    pub fn split(self, data: &TaskData, split: Split, n: usize) -> Result<Vec<QaSample>, EnvError> {
        let (text, path) = self.read(data, split.file())?;
        let mut samples = parse_samples(&text, &path)?;
        samples.truncate(n);
        Ok(samples)
    }
}

/// A task's data split: prompts to train on, and held-out prompts to evaluate on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Split {
    /// The prompts to train on (`train.jsonl`).
    Train,
    /// The held-out prompts to evaluate on (`test.jsonl`).
    Test,
}

impl Split {
    fn file(self) -> &'static str {
        match self {
            Split::Train => "train.jsonl",
            Split::Test => "test.jsonl",
        }
    }
}
