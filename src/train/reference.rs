//! A frozen reference policy for the update's KL term: the weights a training run
//! started from, kept unchanged, scoring each update's trajectories so the loss's
//! `low_var_kl` measures (and, with `kl_coef > 0`, penalises) how far the policy has
//! moved from them, as verl's reference model does.
//!
//! Without one, the update's reference is the policy before the update, whose
//! log-probabilities equal the current ones in a one-step update: the KL is then 0.

use candle_core::Var;
use serde::{Deserialize, Serialize};

use super::error::TrainError;
use super::native::NativeDecoder;
use super::params::{LayerParams, Params};
use super::update::{pack_samples, TrainSample, UpdateConfig};

/// What the KL term of a training run's updates compares the policy with.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum KlReference {
    /// The policy before each update (the KL of a one-step update is then 0).
    #[default]
    Previous,
    /// The weights the run started from (after any warm-start), frozen.
    Start,
}

impl std::str::FromStr for KlReference {
    type Err = String;
    /// `previous` or `start`, as the CLI, Python and `run.json` spell them.
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "previous" => Ok(KlReference::Previous),
            "start" => Ok(KlReference::Start),
            other => Err(format!(
                "kl_reference must be \"previous\" or \"start\", not {other:?}"
            )),
        }
    }
}

impl Params {
    /// An independent copy of every weight (new `Var`s holding copied tensors): the
    /// copy does not change when `self` is updated.
    pub fn frozen_copy(&self) -> Result<Params, TrainError> {
        // A detached tensor is no variable, so `Var::from_tensor` copies its storage
        // (once: `.copy()` first would copy twice).
        let copy =
            |v: &Var| -> Result<Var, TrainError> { Ok(Var::from_tensor(&v.as_tensor().detach())?) };
        let layers = self
            .layers
            .iter()
            .map(|l| {
                Ok(LayerParams {
                    attn_norm: copy(&l.attn_norm)?,
                    q: copy(&l.q)?,
                    k: copy(&l.k)?,
                    v: copy(&l.v)?,
                    qkv_bias: match &l.qkv_bias {
                        Some([bq, bk, bv]) => Some([copy(bq)?, copy(bk)?, copy(bv)?]),
                        None => None,
                    },
                    o: copy(&l.o)?,
                    ffn_norm: copy(&l.ffn_norm)?,
                    gate: copy(&l.gate)?,
                    up: copy(&l.up)?,
                    down: copy(&l.down)?,
                })
            })
            .collect::<Result<Vec<_>, TrainError>>()?;
        Ok(Params {
            config: self.config.clone(),
            embedding: copy(&self.embedding)?,
            layers,
            final_norm: copy(&self.final_norm)?,
            lm_head: self.lm_head.as_ref().map(copy).transpose()?,
        })
    }
}

/// Fills every sample's `ref_logprobs` with `reference`'s log-probability of each
/// loss token (under `cfg.temperature`, packed and micro-batched as the update
/// forwards them); positions outside the loss stay NaN and are never read.
pub fn fill_reference_logprobs(
    reference: &Params,
    samples: &mut [TrainSample],
    cfg: &UpdateConfig,
) -> Result<(), TrainError> {
    let batches = pack_samples(samples, cfg);
    let mut filled: Vec<Vec<f64>> = samples
        .iter()
        .map(|s| vec![f64::NAN; s.response_mask.len()])
        .collect();
    // The engine's forward, as the update scores (f32).
    let decoder = NativeDecoder::new(reference)?;
    for mb in &batches {
        if mb.batch.targets.is_empty() {
            continue;
        }
        let logp = decoder.forward(&mb.batch, cfg.temperature, false)?.logp;
        for (k, &s) in mb.seqs.iter().enumerate() {
            for (p, j) in samples[s].loss_positions() {
                let unique = mb.scored[k][p].expect("every loss position is scored");
                filled[s][j] = logp[unique as usize];
            }
        }
    }
    for (sample, logps) in samples.iter_mut().zip(filled) {
        sample.ref_logprobs = Some(logps);
    }
    Ok(())
}
