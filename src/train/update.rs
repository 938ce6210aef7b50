//! One policy-gradient update: trajectories in, gradients accumulated over
//! micro-batches, clipped, one optimiser step, metrics out.
//!
//! The update is one step over all its trajectories (one epoch, one mini-batch, as
//! the Tree-GRPO reference trains). So the policy before the step *is* the current
//! one: the old log-probabilities are the forward's own values, detached, and the
//! ratio is 1 — a separate "recompute old logprobs" forward would produce the same
//! numbers at a third more cost. A caller that has old log-probabilities of its own
//! (the tests, a multi-step trainer) passes them in [`TrainSample::old_logprobs`].
//! Without a reference model the KL's reference is the old policy too; a run can keep
//! a frozen one (`reference.rs`), whose log-probabilities it passes in
//! [`TrainSample::ref_logprobs`].
//!
//! Micro-batches bound memory; the loss weights are the whole update's
//! ([`aggregation_weights`]), so accumulating micro-batch gradients gives the
//! gradient of the whole loss exactly.

use std::sync::Arc;
use std::time::Instant;

use candle_core::Tensor;
use serde::{Deserialize, Serialize};

use super::decoder::Decoder;
use super::error::TrainError;
use super::loss::{aggregation_weights, policy_loss_weighted, LossConfig, LossOutput, LossRow};
use super::native::NativeDecoder;
use super::optim::{clip_scale, squared_norms, Optimizer};
use super::pack::{pack, Packed};
use super::params::Params;
use crate::model::{Model, TokenId};

/// One trajectory as the update sees it.
#[derive(Debug, Clone, PartialEq)]
pub struct TrainSample {
    /// Prompt then response.
    pub tokens: Vec<TokenId>,
    /// How many of `tokens` are the prompt; the response is `tokens[prompt_len..]`.
    pub prompt_len: usize,
    /// Per response token: 1 = model token (trained on), 0 = observation.
    pub response_mask: Vec<u8>,
    /// The rollout engine's log-probabilities of the response tokens (for the TIS
    /// weight); `None`: weight 1.
    pub rollout_logprobs: Option<Vec<f64>>,
    /// The old policy's, per response token; `None`: the forward's own (on-policy).
    pub old_logprobs: Option<Vec<f64>>,
    /// The reference policy's, per response token; `None`: equal to the old.
    pub ref_logprobs: Option<Vec<f64>>,
    /// The trajectory's advantage, applied to every one of its model tokens.
    pub advantage: f64,
}

impl TrainSample {
    /// Positions (into `tokens`) of the loss tokens, with their response index.
    pub(super) fn loss_positions(&self) -> impl Iterator<Item = (usize, usize)> + '_ {
        self.response_mask
            .iter()
            .enumerate()
            .filter(|(j, &m)| m == 1 && self.prompt_len + j > 0)
            .map(|(j, _)| (self.prompt_len + j, j))
    }

    fn wanted(&self) -> Vec<bool> {
        let mut w = vec![false; self.tokens.len()];
        for (p, _) in self.loss_positions() {
            w[p] = true;
        }
        w
    }
}

/// How one update runs.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct UpdateConfig {
    /// The loss's coefficients (clipping, KL, entropy, TIS, aggregation).
    pub loss: LossConfig,
    /// Global grad-norm clip (0: none).
    pub max_grad_norm: f64,
    /// Forward each prompt's trajectories as a trie (shared prefixes once).
    pub packed: bool,
    /// Rows per micro-batch (a longer trajectory gets one of its own).
    pub micro_batch_tokens: usize,
    /// The temperature the rollout sampled with: logits are divided by it.
    pub temperature: f64,
}

impl Default for UpdateConfig {
    fn default() -> Self {
        UpdateConfig {
            loss: LossConfig::default(),
            max_grad_norm: 1.0,
            packed: true,
            micro_batch_tokens: 4096,
            temperature: 1.0,
        }
    }
}

/// Rows forwarded, packed and as the unpacked count (each trajectory whole).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Forwarded {
    /// Rows actually forwarded: a shared prefix counts once.
    pub packed: usize,
    /// Rows an unpacked forward would take: the sum of every trajectory's length.
    pub unpacked: usize,
}

/// What one update did: `treegrpo update`'s JSON line.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct UpdateMetrics {
    /// The loss the step descended (see [`LossOutput::loss`]).
    pub loss: f64,
    /// Its clipped policy-gradient part.
    pub pg_loss: f64,
    /// Mean negative log-likelihood of the loss tokens (aggregated as the loss is).
    pub nll: f64,
    /// The aggregated k3 KL to the reference policy (nats).
    pub kl: f64,
    /// The aggregated entropy at the loss tokens (nats).
    pub entropy: f64,
    /// Global gradient norm before clipping.
    pub grad_norm: f64,
    /// Fraction of loss tokens whose ratio was clipped (they contribute no gradient).
    pub clip_fraction: f64,
    /// Mean truncated importance weight over the loss tokens.
    pub tis_mean: f64,
    /// Loss tokens.
    pub tokens: usize,
    /// Rows forwarded, packed and unpacked: what prefix sharing saved.
    pub tokens_forwarded: Forwarded,
    /// Number of micro-batches the trajectories were split into.
    pub micro_batches: usize,
    /// The learning rate of this step (after warm-up).
    pub lr: f64,
    /// Wall-clock seconds of the whole update: forwards, backwards and the step.
    pub seconds: f64,
    /// Max and mean `|trainer log p − rollout log p|` over loss tokens with a rollout
    /// log-probability (verl's `rollout_probs_diff_max` / `_mean`); `None` without.
    pub rollout_logprob_diff_max: Option<f64>,
    /// The mean of the same gap; `None` likewise.
    pub rollout_logprob_diff_mean: Option<f64>,
}

/// The loss of an update's trajectories, and its gradient if asked.
#[derive(Debug)]
pub struct Evaluated {
    /// The loss and its parts, over every micro-batch.
    pub loss: LossOutput,
    /// One per weight in [`Params::named`] order (zeros where a weight got none).
    pub grads: Option<Vec<Tensor>>,
    /// Rows forwarded, packed and unpacked.
    pub forwarded: Forwarded,
    /// Number of micro-batches forwarded.
    pub micro_batches: usize,
    /// How far the trainer's log-probabilities lie from the rollout's.
    pub rollout_gap: RolloutGap,
}

/// `|trainer log p − rollout log p|` over the loss tokens that carry a rollout
/// log-probability (verl's `rollout_probs_diff`). The rollout reports f32, so the
/// trainer's value is rounded to f32 first: on the rollout's own dense weights the
/// gap is exactly 0.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct RolloutGap {
    /// The largest gap seen (nats); 0 before any token.
    pub max: f64,
    /// Sum of the gaps (nats), for the mean.
    pub sum: f64,
    /// Number of loss tokens compared.
    pub tokens: usize,
}

impl RolloutGap {
    fn add(&mut self, trainer: f64, rollout: f64) {
        let d = ((trainer as f32) as f64 - rollout).abs();
        self.max = self.max.max(d);
        self.sum += d;
        self.tokens += 1;
    }

    /// The mean gap; `None` without rollout log-probabilities.
    pub fn mean(&self) -> Option<f64> {
        (self.tokens > 0).then(|| self.sum / self.tokens as f64)
    }

    /// The largest gap; `None` without rollout log-probabilities.
    pub fn max(&self) -> Option<f64> {
        (self.tokens > 0).then_some(self.max)
    }
}

/// Progress of an update: after each micro-batch, how many are done of how many, and
/// the rows forwarded so far.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UpdateProgress {
    /// Micro-batches finished so far (1-based after the first).
    pub micro_batches_done: usize,
    /// Micro-batches in the update.
    pub micro_batches: usize,
    /// Rows forwarded so far, packed.
    pub rows_done: usize,
    /// Rows the whole update forwards, packed.
    pub rows: usize,
}

/// One update as its caller sets it up: the weights, the trajectories and the
/// config, and the options every caller may want — the model an engine serves (no
/// second copy of the weights), a progress sink. It then runs once:
/// [`loss`](Self::loss), [`gradients`](Self::gradients) or a whole optimiser
/// [`step`](Self::step).
///
/// ```ignore
/// let metrics = Update::new(&params, &samples, &config)
///     .serving(served.as_ref())
///     .reporting(&mut |p| eprintln!("{}/{}", p.micro_batches_done, p.micro_batches))
///     .step(&mut optimizer)?;
/// ```
pub struct Update<'a> {
    params: &'a Params,
    samples: &'a [TrainSample],
    config: &'a UpdateConfig,
    served: Option<&'a Arc<Model>>,
    progress: Option<&'a mut dyn FnMut(UpdateProgress)>,
    #[cfg(feature = "autodiff-oracle")]
    by_autodiff: bool,
}

impl<'a> Update<'a> {
    /// An update of `params` over `samples` as `config` says, on the native decoder
    /// (f32 weights), reporting nothing.
    pub fn new(params: &'a Params, samples: &'a [TrainSample], config: &'a UpdateConfig) -> Self {
        Update {
            params,
            samples,
            config,
            served: None,
            progress: None,
            #[cfg(feature = "autodiff-oracle")]
            by_autodiff: false,
        }
    }

    /// Forwards on `served` — the model an engine serves — when it holds `params`'
    /// values (see [`NativeDecoder::sharing`]), else on a packed copy.
    pub fn serving(mut self, served: Option<&'a Arc<Model>>) -> Self {
        self.served = served;
        self
    }

    /// Calls `progress` after each micro-batch.
    pub fn reporting(mut self, progress: &'a mut dyn FnMut(UpdateProgress)) -> Self {
        self.progress = Some(progress);
        self
    }

    /// Tests only: forward and backward by candle's autodiff (the oracle, f32 or
    /// f64) instead of the native decoder, through the same loop.
    #[cfg(feature = "autodiff-oracle")]
    pub fn by_autodiff(mut self) -> Self {
        self.by_autodiff = true;
        self
    }

    /// The loss of the trajectories, no gradient.
    pub fn loss(self) -> Result<Evaluated, TrainError> {
        self.evaluate(false)
    }

    /// The loss and its gradient for every weight.
    pub fn gradients(self) -> Result<Evaluated, TrainError> {
        self.evaluate(true)
    }

    fn evaluate(self, want_grads: bool) -> Result<Evaluated, TrainError> {
        #[cfg(feature = "autodiff-oracle")]
        if self.by_autodiff {
            let oracle = super::oracle::AutodiffDecoder::new(self.params);
            return self.evaluate_on(&oracle, want_grads);
        }
        let native = NativeDecoder::sharing(self.params, self.served)?;
        self.evaluate_on(&native, want_grads)
    }

    /// One update: gradients, a finite check, clipping, one optimiser step. Nothing
    /// changes if a gradient is not finite.
    pub fn step(self, optimizer: &mut Optimizer) -> Result<UpdateMetrics, TrainError> {
        let t0 = Instant::now();
        let (params, max_grad_norm) = (self.params, self.config.max_grad_norm);
        let Evaluated {
            loss: out,
            grads,
            forwarded,
            micro_batches,
            rollout_gap,
        } = self.gradients()?;
        let grads = grads.expect("asked for gradients");
        // One pass over the gradients: a NaN or infinity anywhere makes its tensor's
        // squared norm non-finite.
        let squared = squared_norms(&grads)?;
        if let Some(i) = squared.iter().position(|s| !s.is_finite()) {
            let name = params.named()[i].0.clone();
            return Err(TrainError::NonFiniteGradient { name });
        }
        let grad_norm = squared.iter().sum::<f64>().sqrt();
        let lr = optimizer.current_lr();
        // Clipping's factor goes into the step: no scaled copy of every gradient.
        optimizer.step_scaled(params, &grads, clip_scale(grad_norm, max_grad_norm))?;
        drop(grads);
        Ok(UpdateMetrics {
            loss: out.loss,
            pg_loss: out.pg_loss,
            nll: out.nll,
            kl: out.kl,
            entropy: out.entropy,
            grad_norm,
            clip_fraction: out.clip_fraction,
            tis_mean: out.tis_mean,
            tokens: out.tokens,
            tokens_forwarded: forwarded,
            micro_batches,
            lr,
            seconds: t0.elapsed().as_secs_f64(),
            rollout_logprob_diff_max: rollout_gap.max(),
            rollout_logprob_diff_mean: rollout_gap.mean(),
        })
    }

    /// The loop every update runs, whichever decoder: micro-batch by micro-batch,
    /// forward, the loss on the whole update's weights, backward into one
    /// accumulator.
    fn evaluate_on<D: Decoder>(
        mut self,
        decoder: &D,
        want_grads: bool,
    ) -> Result<Evaluated, TrainError> {
        let (samples, cfg) = (self.samples, self.config);
        let all_rows = loss_rows(samples);
        let weights = aggregation_weights(&all_rows, cfg.loss.agg);
        let batches = pack_samples(samples, cfg);
        let forwarded = Forwarded {
            packed: batches.iter().map(|b| b.batch.tokens.len()).sum(),
            unpacked: samples.iter().map(|s| s.tokens.len()).sum(),
        };
        let mut grads = if want_grads {
            Some(decoder.zero_grads()?)
        } else {
            None
        };
        let mut rollout_gap = RolloutGap::default();
        let mut total = LossOutput::empty();
        let (mut row_at, mut rows_done) = (0, 0);
        for (b, mb) in batches.iter().enumerate() {
            rows_done += mb.batch.tokens.len();
            let rows = micro_batch_rows(mb, samples, &all_rows, row_at);
            let w = &weights[row_at..row_at + rows.len()];
            row_at += rows.len();
            if !mb.batch.targets.is_empty() {
                let scores = decoder.forward(&mb.batch, cfg.temperature, want_grads)?;
                let rows = on_policy(rows, &scores.logp);
                for r in &rows {
                    if let Some(rollout) = r.rollout_logp {
                        rollout_gap.add(scores.logp[r.unique], rollout);
                    }
                }
                let out = policy_loss_weighted(&rows, w, &scores.logp, &scores.entropy, &cfg.loss);
                if let Some(acc) = grads.as_mut() {
                    let (g_logp, g_entropy) = (&out.grad_logp, &out.grad_entropy);
                    decoder.backward(&mb.batch, scores.saved, g_logp, g_entropy, acc)?;
                }
                total.merge(&out);
            }
            if let Some(progress) = self.progress.as_mut() {
                progress(UpdateProgress {
                    micro_batches_done: b + 1,
                    micro_batches: batches.len(),
                    rows_done,
                    rows: forwarded.packed,
                });
            }
        }
        let grads: Option<Vec<Tensor>> = grads.map(|g| decoder.gradient_tensors(g)).transpose()?;
        Ok(Evaluated {
            loss: total,
            grads,
            forwarded,
            micro_batches: batches.len(),
            rollout_gap,
        })
    }
}

/// Every loss row of the update, in sample order, for the global weights.
fn loss_rows(samples: &[TrainSample]) -> Vec<LossRow> {
    let mut rows = Vec::new();
    for (s, sample) in samples.iter().enumerate() {
        for _ in sample.loss_positions() {
            rows.push(LossRow {
                seq: s,
                unique: 0,
                advantage: sample.advantage,
                old_logp: 0.0,
                ref_logp: None,
                rollout_logp: None,
            });
        }
    }
    rows
}

/// On-policy rows: where no old log-probability was given, the old (and reference)
/// one is the current forward's.
fn on_policy(rows: Vec<LossRow>, logp: &[f64]) -> Vec<LossRow> {
    rows.into_iter()
        .map(|mut r| {
            if r.old_logp.is_nan() {
                r.old_logp = logp[r.unique];
            }
            r
        })
        .collect()
}

/// The loss rows of one micro-batch (contiguous in the update's order from `row_at`),
/// pointing at its unique entries; `old_logp` is NaN where the forward supplies it.
fn micro_batch_rows(
    mb: &Packed,
    samples: &[TrainSample],
    all_rows: &[LossRow],
    row_at: usize,
) -> Vec<LossRow> {
    let mut rows = Vec::new();
    for (k, &s) in mb.seqs.iter().enumerate() {
        let sample = &samples[s];
        for (p, j) in sample.loss_positions() {
            let base = all_rows[row_at + rows.len()];
            let at = |v: &Option<Vec<f64>>| v.as_ref().and_then(|v| v.get(j).copied());
            rows.push(LossRow {
                unique: mb.scored[k][p].expect("every loss position is scored") as usize,
                old_logp: at(&sample.old_logprobs).unwrap_or(f64::NAN),
                ref_logp: at(&sample.ref_logprobs),
                rollout_logp: at(&sample.rollout_logprobs),
                ..base
            });
        }
    }
    rows
}

/// `samples` packed into micro-batches as `cfg` asks (a trie or one chain each), every
/// loss token scored: what the update forwards, and the reference scores alike.
pub(super) fn pack_samples(samples: &[TrainSample], cfg: &UpdateConfig) -> Vec<Packed> {
    let wanted: Vec<Vec<bool>> = samples.iter().map(TrainSample::wanted).collect();
    let seqs: Vec<(&[TokenId], &[bool])> = samples
        .iter()
        .zip(&wanted)
        .map(|(s, w)| (s.tokens.as_slice(), w.as_slice()))
        .collect();
    pack(&seqs, cfg.packed, cfg.micro_batch_tokens.max(1))
}
