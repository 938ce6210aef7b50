//! The log-normaliser of a row of logits under a temperature: the one rule by which
//! the engine's sampler reports a token's log-probability and the trainer computes
//! it, so the two agree bit for bit on the same logits.
//!
//! Sums run in f64, in vocabulary order, over `exp`s taken through the vector kernel
//! a chunk at a time (bit for bit `f64::exp`).

use super::kernels::exp_f64_in_place;

/// Log-sum-exp of `logits / temperature` and `1 / temperature`, both f64:
/// `log p_i = logits[i] · inv_t − lse`.
pub fn log_normaliser(logits: &[f32], temperature: f32) -> (f64, f64) {
    let inv_t = 1.0 / temperature as f64;
    let max = logits
        .iter()
        .fold(f64::NEG_INFINITY, |m, &l| m.max(l as f64 * inv_t));
    let mut sum = 0f64;
    for_each_exp(logits, inv_t, max, |_, p| {
        sum += p;
        true
    });
    (max + sum.ln(), inv_t)
}

/// The entropy `−Σ p log p` of `softmax(logits · inv_t)`, whose log-normaliser is
/// `lse`, summed in f64 in vocabulary order.
pub fn entropy(logits: &[f32], inv_t: f64, lse: f64) -> f64 {
    let mut h = 0f64;
    for_each_exp(logits, inv_t, lse, |i, p| {
        h -= p * (logits[i] as f64 * inv_t - lse);
        true
    });
    h
}

/// Logits a chunk of [`for_each_exp`] takes at a time.
const EXP_CHUNK: usize = 256;

/// Calls `visit(i, exp(logits[i] · inv_t − offset))` in id order while it returns
/// true. The `exp`s go through the vector kernel a chunk at a time (bit for bit
/// `f64::exp`, so sums and draws are unchanged; one libm call per logit was 2.8% of
/// a rollout).
pub fn for_each_exp(
    logits: &[f32],
    inv_t: f64,
    offset: f64,
    mut visit: impl FnMut(usize, f64) -> bool,
) {
    let mut buf = [0f64; EXP_CHUNK];
    for (c, chunk) in logits.chunks(EXP_CHUNK).enumerate() {
        let e = &mut buf[..chunk.len()];
        for (e, &l) in e.iter_mut().zip(chunk) {
            *e = l as f64 * inv_t - offset;
        }
        exp_f64_in_place(e);
        for (i, &p) in e.iter().enumerate() {
            if !visit(c * EXP_CHUNK + i, p) {
                return;
            }
        }
    }
}
