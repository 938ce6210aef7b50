//! Choosing the next token from logits.
//!
//! Two log-probabilities come with each token:
//!
//! - the **policy logprob** (`SampledToken::logprob`): the natural log of its
//!   probability under `softmax(logits / temperature)` of the generation's own
//!   [`Sampling`] over the *whole* vocabulary, before truncation — what a trainer
//!   that recomputes logprobs at the same temperature without truncation (verl does)
//!   gets. Greedy uses temperature 1. Penalties (`engine::penalties`) and min-p shape
//!   the choice, not this logprob; the `top_logprobs` alternatives are taken from the
//!   same distribution.
//! - the **behaviour logprob** ([`Drawn::behaviour_logprob`]): the log-probability
//!   under the distribution the token was *actually* drawn from — penalties applied,
//!   truncated and renormalised, at the temperature of the draw, which for a tree
//!   branch's boosted first tokens ([`DrawOptions::draw_from`]) is not the policy's.
//!   It is what an importance weight between the rollout and the trainer must divide
//!   by. A greedy draw (a point mass, which no ratio can use) reports its policy
//!   logprob as its behaviour, as before.
//!
//! The truncations are vLLM's, in its order: min-p (keep tokens with probability at
//! least `min_p ×` the largest), then top-k, then top-p over the distribution
//! renormalised to what is left.

use super::penalties::{Penalties, TokenHistory};
use super::rng::SeqRng;
use super::sampling_error::SamplingError;
use crate::model::logprob::{for_each_exp, log_normaliser};
use crate::model::TokenId;

/// How to pick the next token. Read from a file (a run's `run.json`, a summary)
/// through [`Sampling::validate`]: a value no constructor could make is refused
/// there too, not only when built in code.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(try_from = "SamplingAsWritten")]
pub enum Sampling {
    /// Always the most likely token (ties: the lowest id).
    Greedy,
    /// Sample from `softmax(logits / temperature)`, optionally truncated.
    Random {
        /// Divides the logits before the softmax; above 0 and finite (0 is [`Sampling::Greedy`]).
        temperature: f32,
        /// Draw only among the `k` most likely tokens (`None`: no cut).
        top_k: Option<usize>,
        /// Nucleus sampling: draw only among the most likely tokens whose probabilities sum
        /// to at least `p`, in (0, 1) (`None`: no cut).
        top_p: Option<f32>,
        /// vLLM's min-p: tokens below `min_p ×` the most likely one's probability
        /// are never drawn.
        #[serde(default)]
        min_p: Option<f32>,
    },
}

/// [`Sampling`]'s serialised form, read before it is checked.
#[derive(serde::Deserialize)]
enum SamplingAsWritten {
    Greedy,
    Random {
        temperature: f32,
        top_k: Option<usize>,
        top_p: Option<f32>,
        #[serde(default)]
        min_p: Option<f32>,
    },
}

impl TryFrom<SamplingAsWritten> for Sampling {
    type Error = SamplingError;
    fn try_from(written: SamplingAsWritten) -> Result<Self, SamplingError> {
        let sampling = match written {
            SamplingAsWritten::Greedy => Sampling::Greedy,
            SamplingAsWritten::Random {
                temperature,
                top_k,
                top_p,
                min_p,
            } => Sampling::Random {
                temperature,
                top_k,
                top_p,
                min_p,
            },
        };
        sampling.validate()?;
        Ok(sampling)
    }
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

    /// Whether [`Sampling::new`] could have made this value (a hand-built
    /// `Sampling::Random` with a negative temperature could not).
    pub fn validate(&self) -> Result<(), SamplingError> {
        match *self {
            Sampling::Greedy => Ok(()),
            Sampling::Random {
                temperature,
                top_k,
                top_p,
                min_p,
            } => {
                if temperature == 0.0 {
                    return Err(SamplingError::Temperature(temperature));
                }
                let top_k = top_k.map(|k| i64::try_from(k).unwrap_or(i64::MAX));
                Sampling::new(temperature, top_k, top_p, min_p).map(|_| ())
            }
        }
    }

    /// The checked constructor, the one rule every way in (CLI, server, Python, Ray)
    /// reads sampling options through, in vLLM's conventions: temperature 0 is greedy
    /// (the truncations do not change an argmax), above 0 samples; `top_k` -1 or 0,
    /// `top_p` 1 and `min_p` 0 mean off. A negative or non-finite temperature, a
    /// `top_k` below -1, a `top_p` outside (0, 1] or a `min_p` outside [0, 1] is an
    /// error, never coerced.
    pub fn new(
        temperature: f32,
        top_k: Option<i64>,
        top_p: Option<f32>,
        min_p: Option<f32>,
    ) -> Result<Self, SamplingError> {
        if !(temperature.is_finite() && temperature >= 0.0) {
            return Err(SamplingError::Temperature(temperature));
        }
        let top_k = match top_k {
            None | Some(-1) | Some(0) => None,
            Some(k) => Some(usize::try_from(k).map_err(|_| SamplingError::TopK(k))?),
        };
        if let Some(p) = top_p.filter(|p| !(*p > 0.0 && *p <= 1.0)) {
            return Err(SamplingError::TopP(p));
        }
        if let Some(m) = min_p.filter(|m| !(0.0..=1.0).contains(m)) {
            return Err(SamplingError::MinP(m));
        }
        Ok(if temperature == 0.0 {
            Sampling::Greedy
        } else {
            Sampling::Random {
                temperature,
                top_k,
                top_p: top_p.filter(|&p| p < 1.0),
                min_p: min_p.filter(|&m| m > 0.0),
            }
        })
    }
}

/// The first tokens of a generation drawn from a wider distribution than its own
/// [`Sampling`]: a tree branch's first tokens, the ones that make it a branch, so
/// siblings differ where they fork. Each boosted token's behaviour logprob is taken
/// under `sampling`; its policy logprob stays the generation's.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct BoostedStart {
    /// What the boosted tokens are drawn from.
    pub sampling: Sampling,
    /// How many of the generation's first tokens are boosted (at least 1).
    pub tokens: usize,
}

/// How one sequence's next token is drawn beyond its [`Sampling`]: penalties over
/// what it has seen, and how many alternatives to report.
#[derive(Debug, Clone, Copy)]
pub struct DrawOptions<'a> {
    /// Penalties applied to a copy of the logits before the choice.
    pub penalties: &'a Penalties,
    /// What the sequence has seen, which the penalties count (`None`: no penalties apply).
    pub history: Option<&'a TokenHistory>,
    /// How many most likely alternatives to report with the token (0: none; at most
    /// [`MAX_TOP_LOGPROBS`](super::sampling_error::MAX_TOP_LOGPROBS) when it comes from a request).
    pub top_logprobs: usize,
    /// Draw from this distribution instead of the generation's own (a tree branch's
    /// boosted first tokens); the policy logprob and the alternatives stay under
    /// the generation's. `None`: draw from the generation's own.
    pub draw_from: Option<Sampling>,
    /// Tokens the draw may not choose (a generation short of its `min_tokens`: its
    /// stop tokens): their logits are masked in the copy the choice is made from, so
    /// the behaviour logprob is renormalised without them; the policy logprob stays
    /// the model's.
    pub banned: &'a [TokenId],
}

impl DrawOptions<'_> {
    /// No penalties, no alternatives, the generation's own distribution.
    pub const PLAIN: DrawOptions<'static> = DrawOptions {
        penalties: &Penalties::NONE,
        history: None,
        top_logprobs: 0,
        draw_from: None,
        banned: &[],
    };
}

/// One drawn token, with both of its log-probabilities (see the module docs).
#[derive(Debug, Clone, PartialEq)]
pub struct Drawn {
    /// The token and its policy logprob.
    pub sampled: SampledToken,
    /// Its log-probability under the distribution it was drawn from.
    pub behaviour_logprob: f32,
    /// The `top_logprobs` most likely alternatives under the policy's distribution.
    pub top: Vec<SampledToken>,
}

/// [`sample`] with penalties, banned tokens, alternatives and another distribution to
/// draw from: the token is chosen from the penalised, masked logits under `options.draw_from` (else
/// `sampling`); its policy logprob and the `top_logprobs` best alternatives are the
/// model's (unpenalised) under `sampling`'s temperature.
pub fn draw(
    logits: &[f32],
    sampling: &Sampling,
    options: DrawOptions<'_>,
    rng: &mut SeqRng,
) -> Drawn {
    let source = options.draw_from.unwrap_or(*sampling);
    let penalised = match options.history {
        Some(history) if !options.penalties.is_neutral() => {
            let mut shaped = logits.to_vec();
            options.penalties.apply(&mut shaped, history);
            Some(shaped)
        }
        _ => None,
    };
    let penalised = mask_banned(penalised, logits, options.banned);
    let (mut sampled, behaviour_logprob) =
        sample_with_behaviour(penalised.as_deref().unwrap_or(logits), &source, rng);
    // The policy logprob comes free with the draw when the draw was the policy's own
    // (no penalties, no other distribution); else one more pass over the vocabulary.
    if penalised.is_some() || source != *sampling {
        let (lse, inv_t) = log_normaliser(logits, sampling.logprob_temperature() as f32);
        sampled.logprob = (logits[sampled.token as usize] as f64 * inv_t - lse) as f32;
    }
    let top = top_logprobs(logits, sampling, options.top_logprobs);
    Drawn {
        sampled,
        behaviour_logprob,
        top,
    }
}

/// `shaped` (or a copy of `logits`) with every in-vocabulary `banned` token's logit at
/// −∞; `shaped` as it is when nothing is banned.
fn mask_banned(shaped: Option<Vec<f32>>, logits: &[f32], banned: &[TokenId]) -> Option<Vec<f32>> {
    if banned.is_empty() {
        return shaped;
    }
    let mut masked = shaped.unwrap_or_else(|| logits.to_vec());
    for &t in banned {
        if let Some(l) = masked.get_mut(t as usize) {
            *l = f32::NEG_INFINITY;
        }
    }
    Some(masked)
}

/// The `n` most likely tokens under the distribution logprobs are reported under,
/// most likely first (ties: the lower id).
pub fn top_logprobs(logits: &[f32], sampling: &Sampling, n: usize) -> Vec<SampledToken> {
    let n = n.min(logits.len());
    if n == 0 {
        return Vec::new();
    }
    let (lse, inv_t) = log_normaliser(logits, sampling.logprob_temperature() as f32);
    let by_logit = |a: &usize, b: &usize| logits[*b].total_cmp(&logits[*a]).then(a.cmp(b));
    let mut idx: Vec<usize> = (0..logits.len()).collect();
    if n < idx.len() {
        idx.select_nth_unstable_by(n - 1, by_logit);
        idx.truncate(n);
    }
    idx.sort_unstable_by(by_logit);
    idx.into_iter()
        .map(|i| SampledToken {
            token: i as TokenId,
            logprob: (logits[i] as f64 * inv_t - lse) as f32,
        })
        .collect()
}

/// A token and its logprob (see the module docs for which distribution): the one
/// sampled, or one of a position's `top_logprobs` alternatives.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SampledToken {
    /// The token id.
    pub token: TokenId,
    /// Natural log of its probability under the unpenalised, untruncated softmax at the
    /// sampling temperature (1 for greedy).
    pub logprob: f32,
}

/// Picks the next token.
pub fn sample(logits: &[f32], sampling: &Sampling, rng: &mut SeqRng) -> SampledToken {
    sample_with_behaviour(logits, sampling, rng).0
}

/// Picks the next token; with it, its log-probability under the distribution it was
/// drawn from: truncated and renormalised (greedy: its T = 1 logprob, see the module
/// docs).
pub fn sample_with_behaviour(
    logits: &[f32],
    sampling: &Sampling,
    rng: &mut SeqRng,
) -> (SampledToken, f32) {
    match *sampling {
        Sampling::Greedy => {
            let mut best = 0usize;
            for (i, &l) in logits.iter().enumerate() {
                if l > logits[best] {
                    best = i;
                }
            }
            let (lse, _) = log_normaliser(logits, 1.0);
            let logprob = (logits[best] as f64 - lse) as f32;
            let token = SampledToken {
                token: best as TokenId,
                logprob,
            };
            (token, logprob)
        }
        Sampling::Random {
            temperature,
            top_k,
            top_p,
            min_p,
        } => {
            let (lse, inv_t) = log_normaliser(logits, temperature);
            let logprob = |i: usize| logits[i] as f64 * inv_t - lse;
            let truncated = top_k.is_some_and(|k| k > 0 && k < logits.len())
                || top_p.is_some_and(|p| p < 1.0)
                || min_p.is_some_and(|m| m > 0.0);
            // The log of the mass the draw was renormalised to (0: the whole vocabulary).
            let (chosen, log_mass) = if truncated {
                let limits = Truncation {
                    top_k,
                    top_p,
                    min_p,
                };
                sample_truncated(logits, limits, &logprob, rng)
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
                (chosen, 0.0)
            };
            let token = SampledToken {
                token: chosen as TokenId,
                logprob: logprob(chosen) as f32,
            };
            (token, (logprob(chosen) - log_mass) as f32)
        }
    }
}

/// The truncations of one draw (see the module docs for their order).
#[derive(Clone, Copy)]
struct Truncation {
    top_k: Option<usize>,
    top_p: Option<f32>,
    min_p: Option<f32>,
}

/// Min-p, top-k, top-p: candidates by probability (ties by id), truncated,
/// renormalised, one uniform draw; the token and the log of the mass kept.
fn sample_truncated(
    logits: &[f32],
    limits: Truncation,
    logprob: &dyn Fn(usize) -> f64,
    rng: &mut SeqRng,
) -> (usize, f64) {
    let by_prob = |a: &usize, b: &usize| logits[*b].total_cmp(&logits[*a]).then(a.cmp(b));
    let all = logits.len();
    // Min-p: p_i ≥ min_p · p_max, compared as probabilities like vLLM.
    let mut candidates: Vec<usize> = match limits.min_p.filter(|&m| m > 0.0) {
        Some(m) => {
            let best = (0..all).min_by(by_prob).unwrap_or(0);
            let floor = m as f64 * logprob(best).exp();
            (0..all).filter(|&i| logprob(i).exp() >= floor).collect()
        }
        None => (0..all).collect(),
    };
    if let Some(k) = limits.top_k.filter(|&k| k > 0 && k < candidates.len()) {
        candidates.select_nth_unstable_by(k - 1, by_prob);
        candidates.truncate(k);
    }
    let Some(p) = limits.top_p.filter(|&p| p < 1.0).map(f64::from) else {
        candidates.sort_unstable_by(by_prob);
        return draw_from(&candidates, logprob, rng);
    };
    // Top-p over what min-p and top-k left, renormalised to it (vLLM); over the whole
    // vocabulary that mass is 1.
    let target = if candidates.len() == all {
        p
    } else {
        p * candidates.iter().map(|&i| logprob(i).exp()).sum::<f64>()
    };
    // Only the head of the ranking matters. Select a head (the exact top-h set under
    // the total order above), sort just it, and widen it until it holds the target
    // mass: the same as sorting every candidate, without the 49k-element sort.
    let mut h = candidates.len().min(64);
    loop {
        let mut head = candidates.clone();
        if h < head.len() {
            head.select_nth_unstable_by(h - 1, by_prob);
            head.truncate(h);
        }
        head.sort_unstable_by(by_prob);
        let mut mass = 0.0;
        for (n, &i) in head.iter().enumerate() {
            mass += logprob(i).exp();
            if mass >= target {
                head.truncate(n + 1);
                return draw_from(&head, logprob, rng);
            }
        }
        if h >= candidates.len() {
            // Rounding left the whole set short of the target: keep it whole.
            return draw_from(&head, logprob, rng);
        }
        h = (h * 4).min(candidates.len());
    }
}

/// One uniform draw from `idx` (in order) renormalised; the token and the log of
/// the mass it was renormalised by.
fn draw_from(idx: &[usize], logprob: &dyn Fn(usize) -> f64, rng: &mut SeqRng) -> (usize, f64) {
    let total: f64 = idx.iter().map(|&i| logprob(i).exp()).sum();
    let mut u = rng.next_f64() * total;
    for &i in idx {
        u -= logprob(i).exp();
        if u < 0.0 {
            return (i, total.ln());
        }
    }
    (idx[idx.len() - 1], total.ln())
}
