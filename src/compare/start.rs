//! `start.json`: what a run (or the shared warm-start) started from — the hash of its
//! weights, so that "every arm starts from the same weights" is checked, not assumed —
//! and the start's eval reward.

use std::path::Path;

use serde::{Deserialize, Serialize};

use super::error::CompareError;
use crate::train::Params;

/// `start.json`: what a run (or the shared warm-start) started from.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StartRecord {
    /// FNV-1a (64-bit, hex) of every trainable weight's f32 bytes, in
    /// [`Params::named`] order: equal hashes, equal weights.
    pub weights_fnv1a64: String,
    /// The greedy eval reward of the start weights on the plan's test questions (the
    /// warm-start's record only: every run starts there).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub eval_reward: Option<f64>,
}

/// The file a [`StartRecord`] is kept in.
pub const START_FILE: &str = "start.json";

impl StartRecord {
    /// The record in folder `dir`.
    pub fn read(dir: &Path) -> Result<Self, CompareError> {
        let path = dir.join(START_FILE);
        let text = std::fs::read_to_string(&path).map_err(|e| CompareError::Io(path.clone(), e))?;
        serde_json::from_str(&text).map_err(|e| CompareError::Json(path, e))
    }

    pub(super) fn write(&self, dir: &Path) -> Result<(), CompareError> {
        let path = dir.join(START_FILE);
        let text = serde_json::to_string_pretty(self).expect("a start record serialises");
        std::fs::write(&path, text + "\n").map_err(|e| CompareError::Io(path, e))
    }
}

/// FNV-1a over the weights' f32 bytes (see [`StartRecord::weights_fnv1a64`]).
pub fn weights_hash(params: &Params) -> Result<String, CompareError> {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    params.for_each_f32(|_, values| {
        for v in values {
            for b in v.to_le_bytes() {
                h ^= u64::from(b);
                h = h.wrapping_mul(0x0100_0000_01b3);
            }
        }
    })?;
    Ok(format!("{h:016x}"))
}
