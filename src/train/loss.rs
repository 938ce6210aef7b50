//! The policy loss as verl computes it (`verl/trainer/ppo/core_algos.py`:
//! `compute_policy_loss_vanilla`, `agg_loss`, `kl_penalty("low_var_kl")`), in plain
//! Rust over per-token rows, with its exact gradient with respect to each row's
//! log-probability and entropy.
//!
//! Per loss row `t` (a model token of one trajectory; observation tokens have no row):
//!
//! - `r = exp(clamp(logp − old, −20, 20))`;
//!   `A ≥ 0`: `pg = −A·min(r, 1 + ε_high)`; `A < 0`: `pg = −A·min(c, max(r, 1 − ε_low))`
//!   (dual clip); times the truncated importance weight `tis = min(exp(old − rollout),
//!   cap)`, a constant;
//! - `k3 = clamp(e^κ − κ − 1, −10, 10)` with `κ = clamp(ref − logp, −20, 20)`;
//! - `loss = agg(pg·tis) + kl_coef·agg(k3) − entropy_coef·agg(H)`.
//!
//! `agg` weighs row `t` by `w_t`: `1/N` (`token-mean`, N the update's loss rows),
//! `1/S` (`seq-mean-token-sum`), `1/(S·n_s)` (`seq-mean-token-mean`), S the update's
//! sequences with at least one loss row and `n_s` those of row `t`'s sequence.
//!
//! The loss depends on the model only through `logp` and `H`, so the trainer
//! backpropagates the surrogate `Σ_u g_u·logp_u + Σ_u e_u·H_u` with the constants
//! `g = ∂loss/∂logp`, `e = ∂loss/∂H` returned here: the same gradient, exactly. Rows
//! name the *unique* scored token they read (`unique`): in a packed tree a shared
//! token is one unique entry read by every leaf below it, so its gradient is the sum
//! of theirs — packing changes no number.

use serde::{Deserialize, Serialize};

/// How per-token losses are averaged (verl's `loss_agg_mode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum LossAgg {
    /// Sum over every loss token of the update / their count.
    TokenMean,
    /// Each sequence's token sum, averaged over sequences.
    SeqMeanTokenSum,
    /// Each sequence's token mean, averaged over sequences.
    SeqMeanTokenMean,
}

impl std::str::FromStr for LossAgg {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "token-mean" => Ok(LossAgg::TokenMean),
            "seq-mean-token-sum" => Ok(LossAgg::SeqMeanTokenSum),
            "seq-mean-token-mean" => Ok(LossAgg::SeqMeanTokenMean),
            other => Err(format!(
                "unknown loss aggregation {other:?} (token-mean, seq-mean-token-sum, seq-mean-token-mean)"
            )),
        }
    }
}

/// The loss's coefficients; defaults are the Tree-GRPO reference scripts'.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct LossConfig {
    /// `ε_low`: a negative-advantage token's ratio is clipped below at `1 − clip_low`.
    pub clip_low: f64,
    /// `ε_high`: a non-negative-advantage token's ratio is clipped above at
    /// `1 + clip_high`.
    pub clip_high: f64,
    /// Dual-clip bound `c` for negative advantages.
    pub clip_c: f64,
    /// How per-token terms are averaged over the update.
    pub agg: LossAgg,
    /// Coefficient of the k3 KL to the reference (0: no reference needed).
    pub kl_coef: f64,
    /// Coefficient of the entropy bonus (0: entropy only reported).
    pub entropy_coef: f64,
    /// Cap of the truncated importance weight between rollout engine and trainer.
    pub tis_cap: f64,
}

impl Default for LossConfig {
    fn default() -> Self {
        LossConfig {
            clip_low: 0.2,
            clip_high: 0.2,
            clip_c: 3.0,
            agg: LossAgg::TokenMean,
            kl_coef: 0.001,
            entropy_coef: 0.001,
            tis_cap: 2.0,
        }
    }
}

/// One loss token.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LossRow {
    /// Which trajectory of the update it belongs to (for the seq-mean modes).
    pub seq: usize,
    /// Which unique scored token it reads (index into `logp` and `entropy`).
    pub unique: usize,
    /// The trajectory's advantage `A`, the same for each of its loss tokens.
    pub advantage: f64,
    /// The policy's log-probability before the update (the ratio's denominator).
    pub old_logp: f64,
    /// The reference policy's (for the KL; `None` counts as equal to `old_logp`).
    pub ref_logp: Option<f64>,
    /// The rollout engine's (for the TIS weight; `None`: weight 1).
    pub rollout_logp: Option<f64>,
}

/// The loss, its parts (already aggregated), and its gradient.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct LossOutput {
    /// The total: `pg_loss + kl_coef·kl − entropy_coef·entropy`, the number the
    /// gradient is of.
    pub loss: f64,
    /// The aggregated clipped policy-gradient term, TIS-weighted.
    pub pg_loss: f64,
    /// The aggregated negative log-likelihood of the loss tokens (the SFT loss; for RL
    /// a diagnostic).
    pub nll: f64,
    /// The aggregated k3 (low-variance) KL estimate to the reference policy (nats);
    /// 0 when every row's reference equals its old log-probability.
    pub kl: f64,
    /// The aggregated entropy of the policy at the loss tokens (nats); 0 when the
    /// forward did not compute entropies.
    pub entropy: f64,
    /// Fraction of loss tokens whose clipped term is the active one (no gradient).
    pub clip_fraction: f64,
    /// Mean truncated importance weight over the loss tokens (1 when no rollout
    /// log-probabilities were given).
    pub tis_mean: f64,
    /// Number of loss rows (model tokens) this output covers.
    pub tokens: usize,
    /// `∂loss/∂logp_u` per unique scored token.
    #[serde(skip)]
    pub grad_logp: Vec<f64>,
    /// `∂loss/∂H_u` per unique scored token.
    #[serde(skip)]
    pub grad_entropy: Vec<f64>,
}

/// `(pg, ∂pg/∂logp, clipped)` of one token before the TIS weight.
fn clipped_term(logp: f64, old: f64, a: f64, cfg: &LossConfig) -> (f64, f64, bool) {
    let log_ratio = logp - old;
    let clamped = log_ratio.clamp(-20.0, 20.0);
    let r = clamped.exp();
    // ∂r/∂logp: r inside the clamp, 0 where the clamp holds it.
    let dr = if clamped == log_ratio { r } else { 0.0 };
    if a >= 0.0 {
        let hi = 1.0 + cfg.clip_high;
        if r < hi {
            (-a * r, -a * dr, false)
        } else {
            (-a * hi, 0.0, true)
        }
    } else {
        let lo = 1.0 - cfg.clip_low;
        let inner = r.max(lo);
        if inner >= cfg.clip_c {
            (-a * cfg.clip_c, 0.0, true)
        } else if r > lo {
            (-a * r, -a * dr, false)
        } else {
            (-a * lo, 0.0, true)
        }
    }
}

/// `(k3, ∂k3/∂logp)`.
fn low_var_kl(logp: f64, reference: f64) -> (f64, f64) {
    let kappa = reference - logp;
    let k = kappa.clamp(-20.0, 20.0);
    let dk = if k == kappa { -1.0 } else { 0.0 };
    let raw = k.exp() - k - 1.0;
    let k3 = raw.clamp(-10.0, 10.0);
    let d = if k3 == raw { (k.exp() - 1.0) * dk } else { 0.0 };
    (k3, d)
}

/// Each row's aggregation weight over the whole update (`rows` are all of its loss
/// rows): `1/N`, `1/S` or `1/(S·n_s)` by mode.
pub fn aggregation_weights(rows: &[LossRow], agg: LossAgg) -> Vec<f64> {
    if rows.is_empty() {
        return Vec::new();
    }
    match agg {
        LossAgg::TokenMean => vec![1.0 / rows.len() as f64; rows.len()],
        LossAgg::SeqMeanTokenSum | LossAgg::SeqMeanTokenMean => {
            let seqs = rows.iter().map(|r| r.seq).max().map_or(0, |m| m + 1);
            let mut count = vec![0usize; seqs];
            for r in rows {
                count[r.seq] += 1;
            }
            let s = count.iter().filter(|&&c| c > 0).count() as f64;
            rows.iter()
                .map(|r| match agg {
                    LossAgg::SeqMeanTokenMean => 1.0 / (s * count[r.seq] as f64),
                    _ => 1.0 / s,
                })
                .collect()
        }
    }
}

/// The loss of all of an update's `rows` given the current `logp` and `entropy` of the
/// unique scored tokens they read, and its gradient with respect to both.
pub fn policy_loss(
    rows: &[LossRow],
    logp: &[f64],
    entropy: &[f64],
    cfg: &LossConfig,
) -> LossOutput {
    let w = aggregation_weights(rows, cfg.agg);
    policy_loss_weighted(rows, &w, logp, entropy, cfg)
}

/// [`policy_loss`] of part of an update (one micro-batch): `weights` are the rows'
/// [`aggregation_weights`] over the whole update, so the parts' losses and gradients
/// add up to the whole's ([`LossOutput::merge`]).
pub fn policy_loss_weighted(
    rows: &[LossRow],
    weights: &[f64],
    logp: &[f64],
    entropy: &[f64],
    cfg: &LossConfig,
) -> LossOutput {
    assert_eq!(rows.len(), weights.len(), "one weight per loss row");
    let mut out = LossOutput {
        tokens: rows.len(),
        grad_logp: vec![0.0; logp.len()],
        grad_entropy: vec![0.0; entropy.len()],
        ..LossOutput::empty()
    };
    let mut clipped = 0usize;
    for (row, &w) in rows.iter().zip(weights) {
        let lp = logp[row.unique];
        // The rollout reports f32 log-probabilities: the old one is compared at that
        // precision, so a trainer that computes the engine's numbers gets exactly 1.
        let tis = row.rollout_logp.map_or(1.0, |r| {
            ((row.old_logp as f32) as f64 - r).exp().min(cfg.tis_cap)
        });
        out.tis_mean += tis;
        let (pg, dpg, was_clipped) = clipped_term(lp, row.old_logp, row.advantage, cfg);
        clipped += usize::from(was_clipped);
        out.pg_loss += w * tis * pg;
        out.nll -= w * lp;
        let mut g = w * tis * dpg;
        let (k3, dk3) = low_var_kl(lp, row.ref_logp.unwrap_or(row.old_logp));
        out.kl += w * k3;
        g += cfg.kl_coef * w * dk3;
        out.grad_logp[row.unique] += g;
        if let Some(&h) = entropy.get(row.unique) {
            out.entropy += w * h;
            out.grad_entropy[row.unique] -= cfg.entropy_coef * w;
        }
    }
    if !rows.is_empty() {
        out.clip_fraction = clipped as f64 / rows.len() as f64;
        out.tis_mean /= rows.len() as f64;
    }
    out.loss = out.pg_loss + cfg.kl_coef * out.kl - cfg.entropy_coef * out.entropy;
    out
}

impl LossOutput {
    /// Adds another part of the same update: sums of the weighted terms, token-weighted
    /// means of the fractions. The gradients stay each part's own (they index
    /// different unique tokens).
    pub fn merge(&mut self, other: &LossOutput) {
        let n = (self.tokens + other.tokens).max(1) as f64;
        self.clip_fraction = (self.clip_fraction * self.tokens as f64
            + other.clip_fraction * other.tokens as f64)
            / n;
        self.tis_mean =
            (self.tis_mean * self.tokens as f64 + other.tis_mean * other.tokens as f64) / n;
        self.tokens += other.tokens;
        self.loss += other.loss;
        self.pg_loss += other.pg_loss;
        self.nll += other.nll;
        self.kl += other.kl;
        self.entropy += other.entropy;
    }

    /// An empty part (no tokens).
    pub fn empty() -> Self {
        LossOutput {
            loss: 0.0,
            pg_loss: 0.0,
            nll: 0.0,
            kl: 0.0,
            entropy: 0.0,
            clip_fraction: 0.0,
            tis_mean: 0.0,
            tokens: 0,
            grad_logp: Vec::new(),
            grad_entropy: Vec::new(),
        }
    }
}
