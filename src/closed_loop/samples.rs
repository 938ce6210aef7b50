//! Trajectories as the update's samples: prompt and response in one token list, the
//! response's loss mask, and the advantage the caller assigns.

use crate::rollout::Trajectory;
use crate::train::TrainSample;

/// `t` as an update sample with `advantage` on every loss token; the engine's
/// logprobs go along as the rollout's (for the TIS weight) when `with_logprobs`.
pub fn train_sample(t: &Trajectory, advantage: f64, with_logprobs: bool) -> TrainSample {
    let mut tokens = t.prompt_ids.clone();
    tokens.extend_from_slice(&t.response_ids);
    TrainSample {
        tokens,
        prompt_len: t.prompt_ids.len(),
        response_mask: t.response_mask.clone(),
        rollout_logprobs: with_logprobs
            .then(|| t.response_logprobs.iter().map(|&l| f64::from(l)).collect()),
        old_logprobs: None,
        ref_logprobs: None,
        advantage,
    }
}
