//! Choosing the next token from logits.
//!
//! The logprob returned with each token is the natural log of its probability under
//! `softmax(logits / temperature)` over the *whole* vocabulary, before top-k / top-p
//! truncation: that is the behaviour policy's probability a PPO ratio needs when the
//! trainer recomputes logprobs without truncation (verl does). Greedy uses
//! temperature 1.

use super::rng::SeqRng;
use crate::model::logprob::{for_each_exp, log_normaliser};
use crate::model::TokenId;

/// How to pick the next token.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
pub enum Sampling {
    /// Always the most likely token (ties: the lowest id).
    Greedy,
    /// Sample from `softmax(logits / temperature)`, optionally truncated.
    Random {
        temperature: f32,
        top_k: Option<usize>,
        top_p: Option<f32>,
    },
}

impl Sampling {
    /// The temperature the reported logprobs are taken under (1 for greedy): what a
    /// trainer divides its logits by to score the same distribution.
    pub fn logprob_temperature(&self) -> f64 {
        match self {
            Sampling::Greedy => 1.0,
            Sampling::Random { temperature, .. } => *temperature as f64,
        }
    }

    /// Greedy for no or non-positive temperature, else plain sampling.
    pub fn from_temperature(t: Option<f32>) -> Self {
        match t {
            Some(t) if t > 0.0 => Sampling::Random {
                temperature: t,
                top_k: None,
                top_p: None,
            },
            _ => Sampling::Greedy,
        }
    }
}

/// A sampled token and its logprob (see the module docs for which distribution).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SampledToken {
    pub token: TokenId,
    pub logprob: f32,
}

/// Picks the next token.
pub fn sample(logits: &[f32], sampling: &Sampling, rng: &mut SeqRng) -> SampledToken {
    match *sampling {
        Sampling::Greedy => {
            let mut best = 0usize;
            for (i, &l) in logits.iter().enumerate() {
                if l > logits[best] {
                    best = i;
                }
            }
            let (lse, _) = log_normaliser(logits, 1.0);
            SampledToken {
                token: best as TokenId,
                logprob: (logits[best] as f64 - lse) as f32,
            }
        }
        Sampling::Random {
            temperature,
            top_k,
            top_p,
        } => {
            let (lse, inv_t) = log_normaliser(logits, temperature);
            let logprob = |i: usize| logits[i] as f64 * inv_t - lse;
            let truncated =
                top_k.is_some_and(|k| k > 0 && k < logits.len()) || top_p.is_some_and(|p| p < 1.0);
            let chosen = if truncated {
                sample_truncated(logits, top_k, top_p, &logprob, rng)
            } else {
                // Plain sampling needs no sort: walk the vocabulary in id order.
                // Each step subtracts `logprob(i).exp()`, the same expression.
                let mut u = rng.next_f64();
                let mut chosen = logits.len() - 1;
                for_each_exp(logits, inv_t, lse, |i, p| {
                    u -= p;
                    if u < 0.0 {
                        chosen = i;
                        return false;
                    }
                    true
                });
                chosen
            };
            SampledToken {
                token: chosen as TokenId,
                logprob: logprob(chosen) as f32,
            }
        }
    }
}

/// Top-k / top-p: candidates by probability (ties by id), truncated, renormalised.
fn sample_truncated(
    logits: &[f32],
    top_k: Option<usize>,
    top_p: Option<f32>,
    logprob: &dyn Fn(usize) -> f64,
    rng: &mut SeqRng,
) -> usize {
    let by_prob = |a: &usize, b: &usize| logits[*b].total_cmp(&logits[*a]).then(a.cmp(b));
    let all = logits.len();
    let k = top_k.filter(|&k| k > 0).unwrap_or(all).min(all);
    let p = top_p.filter(|&p| p < 1.0).map(f64::from);
    // Only the head of the ranking matters. Select a head (the exact top-h set under
    // the total order above), sort just it, and widen it until it holds mass p: the
    // result is the same as sorting the whole vocabulary, without the 49k-element sort.
    let mut h = if p.is_some() { k.min(64) } else { k };
    let mut idx: Vec<usize>;
    loop {
        idx = (0..all).collect();
        if h < all {
            idx.select_nth_unstable_by(h - 1, by_prob);
            idx.truncate(h);
        }
        idx.sort_unstable_by(by_prob);
        let Some(p) = p else { break };
        let mut mass = 0.0;
        let mut keep = None;
        for (n, &i) in idx.iter().enumerate() {
            mass += logprob(i).exp();
            if mass >= p {
                keep = Some(n + 1);
                break;
            }
        }
        match keep {
            Some(n) => {
                idx.truncate(n);
                break;
            }
            // The head is all that top-k allows: keep it whole.
            None if h >= k => break,
            None => h = (h * 4).min(k),
        }
    }
    let total: f64 = idx.iter().map(|&i| logprob(i).exp()).sum();
    let mut u = rng.next_f64() * total;
    for &i in &idx {
        u -= logprob(i).exp();
        if u < 0.0 {
            return i;
        }
    }
    idx[idx.len() - 1]
}
