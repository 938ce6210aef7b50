//! Task samples in FlashRAG form: `{"id","question","golden_answers":[...]}`
//! plus optional fields this crate's generators add (`hops`,
//! `gold_doc_ids`, `metadata`). Unknown fields are ignored, so FlashRAG's own
//! files load as they are.

use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::env::error::EnvError;
use crate::env::ids::{DocId, SampleId};
use crate::env::jsonl::{parse_jsonl_lines, read_jsonl_lines, write_jsonl};

/// One question (or arithmetic problem) with its accepted answers.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct QaSample {
    /// The sample's id; its rollout trees and trajectories carry it as `prompt_uid`.
    pub id: SampleId,
    /// The question the model is asked, as plain text (the environment wraps it in
    /// its instructions).
    pub question: String,
    /// Every answer graded as correct (matched after normalisation); loading checks
    /// that at least one is not blank.
    pub golden_answers: Vec<String>,
    /// Retrieval hops the question needs (1 or 2 for generated multi-hop).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hops: Option<u32>,
    /// Documents that hold the needed facts, in hop order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub gold_doc_ids: Vec<DocId>,
    /// Free-form extras (question template, reference expression, ...).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<serde_json::Value>,
}

impl QaSample {
    /// A sample with just the FlashRAG core fields.
    pub fn new(id: impl Into<String>, question: impl Into<String>, golden: Vec<String>) -> Self {
        Self {
            id: SampleId::new(id),
            question: question.into(),
            golden_answers: golden,
            hops: None,
            gold_doc_ids: Vec::new(),
            metadata: None,
        }
    }
}

/// Loads a questions file. A sample with an empty question or without a
/// golden answer is rejected: it could never be rewarded, so it is a data
/// bug, not a hard question.
pub fn load_samples(path: &Path) -> Result<Vec<QaSample>, EnvError> {
    checked_samples(read_jsonl_lines(path)?, path)
}

/// Parses the text of a questions file that came from `path` (checked as
/// [`load_samples`] checks it).
pub fn parse_samples(text: &str, path: &Path) -> Result<Vec<QaSample>, EnvError> {
    checked_samples(parse_jsonl_lines(text, path)?, path)
}

fn checked_samples(
    samples: Vec<(usize, QaSample)>,
    path: &Path,
) -> Result<Vec<QaSample>, EnvError> {
    for (line, s) in &samples {
        let bad = |reason: &str| EnvError::BadRecord {
            path: path.to_owned(),
            line: *line,
            reason: format!("sample {}: {reason}", s.id),
        };
        if s.question.trim().is_empty() {
            return Err(bad("empty question"));
        }
        if s.golden_answers.iter().all(|a| a.trim().is_empty()) {
            return Err(bad("no golden answer"));
        }
    }
    Ok(samples.into_iter().map(|(_, s)| s).collect())
}

/// Writes samples as JSONL.
pub fn write_samples(path: &Path, samples: &[QaSample]) -> Result<(), EnvError> {
    write_jsonl(path, samples)
}
