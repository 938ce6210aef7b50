//! Deterministic data set generators: the multi-hop QA world for
//! `search-qa` and arithmetic word problems for `calc`. Same seed and sizes,
//! same bytes, so the committed sets under `data/` can be checked against
//! their generator.

pub mod arith;
pub mod multihop;
pub mod names;
pub mod rng;
pub mod world;

use std::path::Path;

use serde_json::json;

use crate::env::corpus::{Corpus, Document};
use crate::env::error::EnvError;
use crate::env::sample::{write_samples, QaSample};

pub use arith::{generate_calc, COMMITTED_CALC_SEED, COMMITTED_CALC_SIZES};
pub use multihop::{generate_multihop, MultihopSizes, COMMITTED_MULTIHOP_SEED};

/// A generated data set.
#[derive(Debug, Clone)]
pub struct Dataset {
    /// Generator name (`multihop`, `calc`).
    pub name: String,
    /// The generator's seed: the same seed and sizes give the same bytes.
    pub seed: u64,
    /// The sizes it was generated with.
    pub params: serde_json::Value,
    /// Documents; empty for tasks without retrieval.
    pub corpus: Vec<Document>,
    /// The training split (questions with golden answers).
    pub train: Vec<QaSample>,
    /// The held-out split, disjoint from `train`.
    pub test: Vec<QaSample>,
}

impl Dataset {
    /// Writes `corpus.jsonl` (when there is a corpus), `train.jsonl`,
    /// `test.jsonl` and `manifest.json` (generator, seed, sizes, counts)
    /// into `dir`, creating it.
    pub fn write(&self, dir: &Path) -> Result<(), EnvError> {
        if !self.corpus.is_empty() {
            Corpus::new(self.corpus.clone())?.write_jsonl(&dir.join("corpus.jsonl"))?;
        }
        write_samples(&dir.join("train.jsonl"), &self.train)?;
        write_samples(&dir.join("test.jsonl"), &self.test)?;
        let manifest = json!({
            "generator": self.name,
            "seed": self.seed,
            "params": self.params,
            "documents": self.corpus.len(),
            "train": self.train.len(),
            "test": self.test.len(),
        });
        let path = dir.join("manifest.json");
        let text = serde_json::to_string_pretty(&manifest).unwrap_or_default() + "\n";
        std::fs::write(&path, text).map_err(|source| EnvError::Io {
            op: "write",
            path,
            source,
        })
    }
}
