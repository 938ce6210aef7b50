//! The vocabulary projection and the target's scoring, forward and backward, a chunk
//! of scored rows at a time, so no `[rows, vocab]` block outlives its chunk.
//!
//! Forward: each scored row's logits through the model's own output layer (the
//! engine's kernel), then `log p_t = z_t·inv_t − lse` with the engine sampler's
//! log-normaliser ([`log_normaliser`]), so a token's log-probability here is the one
//! the rollout reported, bit for bit on the same weights; entropy `H = −Σ p log p`.
//!
//! Backward, with `g = ∂L/∂log p_t`, `e = ∂L/∂H`, `p = softmax(z·inv_t)`:
//! `∂L/∂z_k = inv_t·(g(δ_kt − p_k) − e·p_k(log p_k + H))`; then the head's two
//! products (`matmul.rs`): the normed hidden rows' gradient and the head weight's.

use rayon::prelude::*;

use super::matmul::{input_grad, weight_grad};
use crate::model::linear::Linear;
use crate::model::logprob::{entropy, for_each_exp, log_normaliser};
use crate::model::{ModelError, TokenId};

/// Scored rows per chunk: 64 rows of a 49k vocabulary are 12.6 MB of logits.
pub const CHUNK_ROWS: usize = 64;

/// A scored row's figures.
#[derive(Debug, Clone, Copy, Default)]
pub struct RowScore {
    /// The target's log-probability under `logits / temperature` (nats, ≤ 0).
    pub logp: f64,
    /// The entropy of the row's tempered distribution (nats).
    pub entropy: f64,
    /// The log-normaliser `log Σ_k exp(z_k / temperature)`, kept for the backward's
    /// softmax.
    pub lse: f64,
}

/// Scores `rows` normed hidden rows (`hs`, `[rows, hidden]`) against `targets`.
pub fn score(
    head: &Linear,
    hs: &[f32],
    targets: &[TokenId],
    temperature: f32,
) -> Result<Vec<RowScore>, ModelError> {
    let hidden = head.in_features();
    let vocab = head.out_features();
    let mut out = Vec::with_capacity(targets.len());
    for (chunk, t) in hs
        .chunks(CHUNK_ROWS * hidden)
        .zip(targets.chunks(CHUNK_ROWS))
    {
        let logits = head.forward(chunk, t.len())?;
        let scores: Vec<RowScore> = logits
            .par_chunks(vocab)
            .zip(t.par_iter())
            .map(|(row, &t)| {
                let (lse, inv_t) = log_normaliser(row, temperature);
                RowScore {
                    logp: row[t as usize] as f64 * inv_t - lse,
                    entropy: entropy(row, inv_t, lse),
                    lse,
                }
            })
            .collect();
        out.extend(scores);
    }
    Ok(out)
}

/// The head's backward: `dhs` (`[rows, hidden]`, written) and the head weight's
/// gradient `dw` (`[vocab, hidden]`, added to) from each row's `g` and `e`.
#[allow(clippy::too_many_arguments)]
pub fn backward(
    head: &Linear,
    head_weight: &[f32],
    hs: &[f32],
    targets: &[TokenId],
    scores: &[RowScore],
    g_logp: &[f64],
    g_entropy: &[f64],
    temperature: f32,
    dhs: &mut [f32],
    dw: &mut [f32],
) -> Result<(), ModelError> {
    let hidden = head.in_features();
    let vocab = head.out_features();
    let inv_t = 1.0 / temperature as f64;
    for (c, chunk) in hs.chunks(CHUNK_ROWS * hidden).enumerate() {
        let at = c * CHUNK_ROWS;
        let n = chunk.len() / hidden;
        let mut dz = head.forward(chunk, n)?;
        // Each row's logits are copied aside (a buffer per thread, reused row after
        // row) and the row is overwritten with their gradient.
        dz.par_chunks_mut(vocab).enumerate().for_each_init(
            Vec::new,
            |logits: &mut Vec<f32>, (j, row)| {
                let (i, t) = (at + j, targets[at + j] as usize);
                let (g, e, s) = (g_logp[i], g_entropy[i], scores[i]);
                logits.clear();
                logits.extend_from_slice(row);
                for_each_exp(logits, inv_t, s.lse, |k, p| {
                    let log_p = logits[k] as f64 * inv_t - s.lse;
                    let delta = if k == t { 1.0 } else { 0.0 };
                    row[k] = (inv_t * (g * (delta - p) - e * p * (log_p + s.entropy))) as f32;
                    true
                });
            },
        );
        input_grad(
            &dz,
            head_weight,
            n,
            vocab,
            hidden,
            &mut dhs[at * hidden..(at + n) * hidden],
            false,
        );
        weight_grad(&dz, chunk, n, vocab, hidden, dw);
    }
    Ok(())
}
