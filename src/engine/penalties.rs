//! vLLM's repetition, presence and frequency penalties, applied to a copy of one
//! sequence's logits before its token is chosen.
//!
//! The formulas are vLLM's (`apply_penalties`): a token seen in the context (the
//! sequence before this generation: its prompt) or in the output so far has its logit
//! multiplied by `1 / repetition` if positive, by `repetition` otherwise; then every
//! output token's logit loses `frequency × its count` and `presence × 1`. Presence and
//! frequency count output tokens only, as in vLLM and OpenAI.
//!
//! Penalties shape the *choice* only. The logprob reported with each token stays the
//! model's (see `engine::sampling`), the one a trainer recomputes: a penalised
//! rollout is off-policy with respect to it, as in every engine that offers them.

use std::collections::{HashMap, HashSet};

use serde::{Deserialize, Serialize};

use super::sampling_error::SamplingError;
use crate::model::TokenId;

/// The three penalties; [`Penalties::NONE`] changes nothing.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Penalties {
    repetition: f32,
    presence: f32,
    frequency: f32,
}

impl Default for Penalties {
    fn default() -> Self {
        Self::NONE
    }
}

impl Penalties {
    /// Repetition 1, presence 0, frequency 0.
    pub const NONE: Penalties = Penalties {
        repetition: 1.0,
        presence: 0.0,
        frequency: 0.0,
    };

    /// Checked as vLLM checks them: `repetition` above 0, `presence` and
    /// `frequency` within [-2, 2] (OpenAI's range), all finite.
    pub fn new(repetition: f32, presence: f32, frequency: f32) -> Result<Self, SamplingError> {
        if !(repetition.is_finite() && repetition > 0.0) {
            return Err(SamplingError::RepetitionPenalty(repetition));
        }
        if !(-2.0..=2.0).contains(&presence) {
            return Err(SamplingError::PresencePenalty(presence));
        }
        if !(-2.0..=2.0).contains(&frequency) {
            return Err(SamplingError::FrequencyPenalty(frequency));
        }
        Ok(Penalties {
            repetition,
            presence,
            frequency,
        })
    }

    /// The repetition penalty: seen tokens' positive logits are divided by it, negative
    /// ones multiplied (1: off).
    pub fn repetition(&self) -> f32 {
        self.repetition
    }

    /// Subtracted once from the logit of every token already in the output (0: off).
    pub fn presence(&self) -> f32 {
        self.presence
    }

    /// Subtracted from an output token's logit once per time it occurs (0: off).
    pub fn frequency(&self) -> f32 {
        self.frequency
    }

    /// Whether applying them changes no logit.
    pub fn is_neutral(&self) -> bool {
        *self == Self::NONE
    }

    /// Penalises `logits` in place given what the sequence has seen.
    pub fn apply(&self, logits: &mut [f32], history: &TokenHistory) {
        if self.repetition != 1.0 {
            // vLLM multiplies by the reciprocal rather than dividing.
            let (down, up) = (1.0 / self.repetition, self.repetition);
            for &t in &history.seen {
                if let Some(l) = logits.get_mut(t as usize) {
                    *l *= if *l > 0.0 { down } else { up };
                }
            }
        }
        if self.frequency != 0.0 || self.presence != 0.0 {
            for (&t, &count) in &history.output_counts {
                if let Some(l) = logits.get_mut(t as usize) {
                    *l -= self.frequency * count as f32;
                    *l -= self.presence;
                }
            }
        }
    }
}

/// What one generation's penalties look at: every token of the context or output
/// (repetition) and how often each output token came (presence, frequency).
#[derive(Debug, Clone, Default)]
pub struct TokenHistory {
    seen: HashSet<TokenId>,
    output_counts: HashMap<TokenId, u32>,
}

impl TokenHistory {
    /// The history of a generation that starts after `context`.
    pub fn new(context: impl IntoIterator<Item = TokenId>) -> Self {
        TokenHistory {
            seen: context.into_iter().collect(),
            output_counts: HashMap::new(),
        }
    }

    /// Records a generated token.
    pub fn push_output(&mut self, token: TokenId) {
        self.seen.insert(token);
        *self.output_counts.entry(token).or_default() += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Hand-computed from vLLM's formulas: context {0, 2}, output [3, 3, 2].
    #[test]
    fn vllm_formulas_by_hand() {
        let mut h = TokenHistory::new([0, 2]);
        for t in [3, 3, 2] {
            h.push_output(t);
        }
        let p = Penalties::new(2.0, 0.5, 0.25).unwrap();
        let mut logits = vec![4.0, 1.0, -1.0, 3.0, -2.0];
        p.apply(&mut logits, &h);
        assert_eq!(
            logits,
            vec![
                4.0 * 0.5,             // context only: repetition
                1.0,                   // unseen
                -2.0 - 0.25 - 0.5,     // -1 × 2: context and output once, negative
                3.0 * 0.5 - 0.5 - 0.5, // output twice: 2 × 0.25 + 0.5
                -2.0,                  // unseen
            ]
        );
    }

    #[test]
    fn neutral_changes_nothing_and_bad_values_are_refused() {
        let h = TokenHistory::new([1, 2, 3]);
        let mut logits = vec![1.0, -2.0, 3.0, 0.0];
        Penalties::NONE.apply(&mut logits, &h);
        assert_eq!(logits, vec![1.0, -2.0, 3.0, 0.0]);
        assert!(Penalties::new(1.0, 0.0, 0.0).unwrap().is_neutral());
        for r in [0.0, -1.0, f32::NAN, f32::INFINITY] {
            assert!(
                matches!(
                    Penalties::new(r, 0.0, 0.0),
                    Err(SamplingError::RepetitionPenalty(_))
                ),
                "repetition {r}"
            );
        }
        assert!(Penalties::new(1.0, 2.5, 0.0).is_err());
        assert!(Penalties::new(1.0, 0.0, -2.1).is_err());
        assert!(Penalties::new(1.0, f32::NAN, 0.0).is_err());
    }
}
