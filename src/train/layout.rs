//! [`TreeLayout`]: which rows of a packed batch attend to which.
//!
//! A packed batch is a forest of token rows: every row has at most one parent (the
//! token before it on its own path) and attends to its ancestors and itself only. A
//! plain sequence is the special case "parent = the previous row". A row's position
//! (for RoPE) is its depth: the number of ancestors.
//!
//! Rows are laid out so that a parent comes before its children (a trie walked depth
//! first, as [`pack`](super::pack) builds it). A row's ancestors are then a few
//! contiguous runs of rows, one per trie edge on its path, which is how the attention
//! kernel walks them: a chain is a single run per row whatever its length.

use std::ops::Range;

/// Parent links of a packed batch, with each row's ancestor runs and position.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TreeLayout {
    parents: Vec<Option<u32>>,
    positions: Vec<u32>,
    /// Row `i`'s runs are `runs[run_starts[i]..run_starts[i + 1]]`, in row order; the
    /// last run ends at `i + 1` (a row attends to itself).
    runs: Vec<Range<u32>>,
    run_starts: Vec<usize>,
}

/// A parent link that does not point to an earlier row.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("row {row} has parent {parent}: a parent must be an earlier row")]
pub struct BadParent {
    /// The row whose parent link is wrong (0-based).
    pub row: usize,
    /// The parent it named: the row itself or a later one.
    pub parent: usize,
}

impl TreeLayout {
    /// A layout from each row's parent (`None` for a root). Parents must come first.
    pub fn new(parents: Vec<Option<u32>>) -> Result<Self, BadParent> {
        let n = parents.len();
        let mut positions = Vec::with_capacity(n);
        let mut runs: Vec<Range<u32>> = Vec::new();
        let mut run_starts = Vec::with_capacity(n + 1);
        for (i, p) in parents.iter().enumerate() {
            let row = i as u32;
            let start = runs.len();
            run_starts.push(start);
            match *p {
                None => {
                    positions.push(0);
                    runs.push(row..row + 1);
                }
                Some(p) if (p as usize) < i => {
                    positions.push(positions[p as usize] + 1);
                    let (a, b) = (run_starts[p as usize], run_starts[p as usize + 1]);
                    // Copy the parent's runs, then extend its last run if this row
                    // follows it directly, else open a run of its own.
                    for k in a..b {
                        let r = runs[k].clone();
                        runs.push(r);
                    }
                    let last = runs.last_mut().expect("a parent has at least one run");
                    if last.end == row {
                        last.end = row + 1;
                    } else {
                        runs.push(row..row + 1);
                    }
                }
                Some(p) => {
                    return Err(BadParent {
                        row: i,
                        parent: p as usize,
                    })
                }
            }
        }
        run_starts.push(runs.len());
        Ok(TreeLayout {
            parents,
            positions,
            runs,
            run_starts,
        })
    }

    /// Independent sequences of the given lengths, one after another.
    pub fn chains(lengths: &[usize]) -> Self {
        let mut parents = Vec::with_capacity(lengths.iter().sum());
        for &len in lengths {
            for j in 0..len {
                parents.push((j > 0).then(|| parents.len() as u32 - 1));
            }
        }
        Self::new(parents).expect("a chain's parents come first")
    }

    /// Number of rows in the batch.
    pub fn len(&self) -> usize {
        self.parents.len()
    }

    /// Whether the batch has no rows.
    pub fn is_empty(&self) -> bool {
        self.parents.is_empty()
    }

    /// The row before `row` on its own path; `None` for a root (the first token of a
    /// sequence). Panics if `row` is out of range.
    pub fn parent(&self, row: usize) -> Option<usize> {
        self.parents[row].map(|p| p as usize)
    }

    /// Each row's depth on its own path: its RoPE position.
    pub fn positions(&self) -> &[u32] {
        &self.positions
    }

    /// The runs of rows `row` attends to (its ancestors and itself), in row order.
    pub fn runs(&self, row: usize) -> &[Range<u32>] {
        &self.runs[self.run_starts[row]..self.run_starts[row + 1]]
    }

    /// Whether `row` attends to `key`.
    pub fn attends(&self, row: usize, key: usize) -> bool {
        self.runs(row)
            .iter()
            .any(|r| (r.start as usize..r.end as usize).contains(&key))
    }
}
