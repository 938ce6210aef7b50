//! Helpers shared by the integration tests.
#![allow(dead_code)]

pub mod oracle;
pub mod rng;
pub mod tiny;

use std::path::PathBuf;

/// The default model, fetched on first use (the tests need it; CI fetches it too).
pub fn default_model() -> PathBuf {
    treegrpo::model::fetch::ensure_default_model(&mut |msg| eprintln!("{msg}"))
        .expect("the default model could not be fetched")
}

/// Largest absolute difference between two equally long slices.
pub fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

pub fn argmax(v: &[f32]) -> usize {
    let mut best = 0;
    for (i, &x) in v.iter().enumerate() {
        if x > v[best] {
            best = i;
        }
    }
    best
}
