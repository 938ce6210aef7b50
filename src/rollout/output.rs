//! A run's files (`--out DIR`): `trajectories.jsonl` and `forest.jsonl` written as
//! prompts finish, `summary.json` at the end, and `forest.jsonl` read back (for
//! `treegrpo view`, or a trainer) with bad lines named by file and line.

use std::io::Write;
use std::path::{Path, PathBuf};

use super::error::{LineJsonError, RolloutError};
use super::export::TrajectoryRecord;
use super::forest::Tree;
use super::summary::RunSummary;

/// Where and how to write results.
pub struct Output {
    dir: PathBuf,
    trajectories: std::fs::File,
    forest: std::fs::File,
}

impl Output {
    /// Creates `dir` (and its parents) and empty `trajectories.jsonl` and
    /// `forest.jsonl` in it, replacing earlier ones; the run appends each finished
    /// prompt to them, in prompt order, and ends with `summary.json`.
    pub fn create(dir: &Path) -> Result<Self, RolloutError> {
        let io = |e: std::io::Error| RolloutError::Io(dir.to_path_buf(), e);
        std::fs::create_dir_all(dir).map_err(io)?;
        let trajectories = std::fs::File::create(dir.join("trajectories.jsonl")).map_err(io)?;
        let forest = std::fs::File::create(dir.join("forest.jsonl")).map_err(io)?;
        Ok(Output {
            dir: dir.to_path_buf(),
            trajectories,
            forest,
        })
    }

    pub(super) fn write(
        &mut self,
        records: &[TrajectoryRecord],
        trees: &[Tree],
    ) -> Result<(), RolloutError> {
        let io = |e: std::io::Error| RolloutError::Io(self.dir.clone(), e);
        let mut buf = Vec::new();
        for r in records {
            serde_json::to_writer(&mut buf, r).map_err(|e| io(e.into()))?;
            buf.push(b'\n');
        }
        // One write per prompt, then flush: a line is either whole or absent.
        self.trajectories.write_all(&buf).map_err(io)?;
        self.trajectories.flush().map_err(io)?;
        let mut buf = Vec::new();
        for t in trees {
            serde_json::to_writer(&mut buf, t).map_err(|e| io(e.into()))?;
            buf.push(b'\n');
        }
        self.forest.write_all(&buf).map_err(io)?;
        self.forest.flush().map_err(io)?;
        Ok(())
    }

    pub(super) fn write_summary(&self, summary: &RunSummary) -> Result<(), RolloutError> {
        let path = self.dir.join("summary.json");
        let text = serde_json::to_string_pretty(summary)
            .map_err(|e| RolloutError::Io(path.clone(), e.into()))?;
        std::fs::write(&path, text + "\n").map_err(|e| RolloutError::Io(path, e))
    }
}

/// Reads `forest.jsonl` (one [`Tree`] per line; blank lines are skipped). A line that
/// is not a tree is an error naming the file and the 1-based line number.
pub fn read_forest(path: &Path) -> Result<Vec<Tree>, RolloutError> {
    let bytes = std::fs::read(path).map_err(|e| RolloutError::Io(path.to_path_buf(), e))?;
    parse_forest(&bytes, path)
}

/// [`read_forest`] of a file's bytes in memory (`path` names it in errors).
pub fn parse_forest(bytes: &[u8], path: &Path) -> Result<Vec<Tree>, RolloutError> {
    let mut trees = Vec::new();
    for (i, line) in bytes.split(|&b| b == b'\n').enumerate() {
        if line.iter().all(|b| b.is_ascii_whitespace()) {
            continue;
        }
        let tree: Tree = serde_json::from_slice(line).map_err(|e| RolloutError::ForestLine {
            path: path.to_path_buf(),
            line: i + 1,
            source: LineJsonError(e),
        })?;
        trees.push(tree);
    }
    Ok(trees)
}
