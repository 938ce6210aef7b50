//! A run's finished prompts, kept — and written, when the run writes files — in
//! prompt order whatever order they finish in, so the same seed always writes the same
//! bytes and an interrupted run keeps every finished forest (see `run`).

use std::collections::BTreeMap;

use super::error::RolloutError;
use super::export::TrajectoryRecord;
use super::forest::Tree;
use super::output::Output;
use super::summary::ForestSummary;

/// A finished prompt waiting for its turn to be written.
pub(super) struct Finished {
    /// Its leaves' records, with advantages.
    pub(super) records: Vec<TrajectoryRecord>,
    /// Its trees, with node values and advantages.
    pub(super) trees: Vec<Tree>,
    /// Its line in `summary.forests`.
    pub(super) summary: ForestSummary,
}

/// The finished prompts, in the order they were kept.
#[derive(Default)]
pub(super) struct Kept {
    /// Every kept prompt's records, prompt after prompt.
    pub(super) records: Vec<TrajectoryRecord>,
    /// Every kept prompt's trees, prompt after prompt.
    pub(super) trees: Vec<Tree>,
    /// Every kept prompt's summary.
    pub(super) forests: Vec<ForestSummary>,
}

impl Kept {
    /// Keeps a finished prompt, writing it out first when the run writes files.
    fn add(&mut self, out: &mut Option<Output>, f: Finished) -> Result<(), RolloutError> {
        if let Some(o) = out.as_mut() {
            o.write(&f.records, &f.trees)?;
        }
        self.records.extend(f.records);
        self.trees.extend(f.trees);
        self.forests.push(f.summary);
        Ok(())
    }
}

/// Keeps finished prompts in prompt order: a prompt waits in `ready` until every
/// prompt before it is kept.
pub(super) struct InOrderWriter {
    /// The run's files, when it writes them.
    out: Option<Output>,
    /// Finished prompts waiting for an earlier one, by prompt index.
    ready: BTreeMap<usize, Finished>,
    /// The prompt whose turn it is to be kept.
    next_to_write: usize,
    /// The prompts kept (and written) so far.
    kept: Kept,
}

impl InOrderWriter {
    /// Nothing finished yet; `out`: the files to write, if any.
    pub(super) fn new(out: Option<Output>) -> Self {
        InOrderWriter {
            out,
            ready: BTreeMap::new(),
            next_to_write: 0,
            kept: Kept::default(),
        }
    }

    /// Adds finished prompt `i`, then keeps every prompt whose turn has come.
    pub(super) fn insert(&mut self, i: usize, finished: Finished) -> Result<(), RolloutError> {
        self.ready.insert(i, finished);
        while let Some(f) = self.ready.remove(&self.next_to_write) {
            self.kept.add(&mut self.out, f)?;
            self.next_to_write += 1;
        }
        Ok(())
    }

    /// Keeps every finished prompt still waiting (an interrupted run: in prompt order,
    /// skipping the unfinished gaps).
    pub(super) fn keep_every_finished(&mut self) -> Result<(), RolloutError> {
        for (_, f) in std::mem::take(&mut self.ready) {
            self.kept.add(&mut self.out, f)?;
        }
        Ok(())
    }

    /// Trajectories finished so far, kept or waiting.
    pub(super) fn rollouts(&self) -> usize {
        self.kept.records.len() + self.ready.values().map(|f| f.records.len()).sum::<usize>()
    }

    /// The run's files (to write the summary into) and what was kept.
    pub(super) fn into_parts(self) -> (Option<Output>, Kept) {
        (self.out, self.kept)
    }
}
