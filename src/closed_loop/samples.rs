//! Trajectories as the update's samples: prompt and response in one token list, the
//! response's loss mask, the advantage the caller assigns, and the rollout's
//! behaviour logprobs for the importance weight.

use serde::{Deserialize, Serialize};

use crate::rollout::Trajectory;
use crate::train::TrainSample;

/// What the update does with the tokens a branch sampling drew from its boost (off
/// the policy: a wider distribution than the one being trained).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum BoostedTokens {
    /// Trained on, weighted by the truncated importance weight
    /// `min(exp(π − μ), cap)` against the distribution they were drawn from.
    #[default]
    Corrected,
    /// Left out of the loss (loss mask 0, still in the context): no gradient, no
    /// share of the token-mean's denominator.
    Masked,
}

impl std::str::FromStr for BoostedTokens {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "corrected" => Ok(BoostedTokens::Corrected),
            "masked" => Ok(BoostedTokens::Masked),
            other => Err(format!(
                "unknown treatment of boosted tokens {other:?} (corrected, masked)"
            )),
        }
    }
}

/// `t` as an update sample with `advantage` on every loss token. With `boosted` the
/// rollout's behaviour logprobs go along for the TIS weight and its boosted tokens
/// are treated as it says; `None` (demonstrations) takes no rollout logprobs.
pub fn train_sample(t: &Trajectory, advantage: f64, boosted: Option<BoostedTokens>) -> TrainSample {
    let mut tokens = t.prompt_ids.clone();
    tokens.extend_from_slice(&t.response_ids);
    let mut response_mask = t.response_mask.clone();
    if boosted == Some(BoostedTokens::Masked) {
        for (j, m) in response_mask.iter_mut().enumerate() {
            if t.is_boosted(j) {
                *m = 0;
            }
        }
    }
    TrainSample {
        tokens,
        prompt_len: t.prompt_ids.len(),
        response_mask,
        rollout_logprobs: boosted.map(|_| {
            t.behaviour_logprobs()
                .iter()
                .map(|&l| f64::from(l))
                .collect()
        }),
        old_logprobs: None,
        ref_logprobs: None,
        advantage,
    }
}
