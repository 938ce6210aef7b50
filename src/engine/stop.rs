//! When a generation ends: stop tokens, stop strings, token limits.

use serde::{Deserialize, Serialize};

use crate::model::TokenId;

use super::sampling::Sampling;

/// Why a generation ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StopReason {
    /// A stop token was sampled (it is not part of the output).
    StopToken,
    /// The decoded text came to contain a stop string (the token completing it is
    /// part of the output).
    StopString,
    MaxTokens,
    /// The model's context window is full.
    ContextFull,
}

/// How to generate: sampling, limits and stop conditions, and the RNG seed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GenParams {
    pub sampling: Sampling,
    pub max_new_tokens: usize,
    pub stop_tokens: Vec<TokenId>,
    pub stop_strings: Vec<String>,
    /// Seed words of this generation's RNG, e.g. (run seed, prompt, tree, branch, step):
    /// the samples depend on these alone, never on the rest of the batch.
    pub seed: Vec<u64>,
}

impl GenParams {
    pub fn greedy(max_new_tokens: usize) -> Self {
        GenParams {
            sampling: Sampling::Greedy,
            max_new_tokens,
            stop_tokens: Vec::new(),
            stop_strings: Vec::new(),
            seed: Vec::new(),
        }
    }
}

/// Finds the first stop string in `text` that ends within its last `tail` bytes,
/// returning the byte offset just past it. Only the tail can hold a new match, so the
/// check per sampled token is O(tail · stops), not O(text).
pub fn find_stop(text: &str, stops: &[String], tail: usize) -> Option<usize> {
    let mut best: Option<usize> = None;
    for s in stops.iter().filter(|s| !s.is_empty()) {
        let from = text.len().saturating_sub(tail + s.len());
        let from = (0..=from)
            .rev()
            .find(|&i| text.is_char_boundary(i))
            .unwrap_or(0);
        if let Some(pos) = text[from..].find(s.as_str()) {
            let end = from + pos + s.len();
            best = Some(best.map_or(end, |b| b.min(end)));
        }
    }
    best
}
