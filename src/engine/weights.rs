//! Swapping the weights the engine serves (a trainer's new policy) between steps.
//!
//! A swap starts a new *weight version*. Everything computed under the old weights is
//! stale, and none of it may be used again (stale prefix caches after a weight sync
//! are a known bug class in RL stacks: vLLM #17103, NeMo-RL #4018):
//!
//! - the prefix index is cleared and a new KV epoch begins (`KvCache::clear_prefix_cache`):
//!   no block computed before the swap is ever matched again, and tables from before
//!   never index the blocks they fill;
//! - every live sequence's KV is dropped and its tokens become a pending recompute,
//!   exactly as after a preemption, so its next use computes them again under the new
//!   weights (counted as `recomputed_preempted`, and in `stale_drops`);
//! - kept logits of a sequence's last position are dropped with its KV.
//!
//! The engine thread applies a swap only when no generation or prefill is in flight
//! (the handle holds later commands back until then), so every [`Generation`]'s tokens
//! come from one set of weights, named by its `weight_version`.
//!
//! [`Generation`]: super::Generation

use std::sync::Arc;

use crate::model::{Model, ModelConfig};

use super::core::EngineCore;
use super::error::EngineError;
use super::weight_version::WeightVersion;

/// The config fields a KV cache and a tokenizer depend on; a swap must keep them.
fn shape_mismatch(serving: &ModelConfig, offered: &ModelConfig) -> Option<&'static str> {
    let fields = [
        ("vocab_size", serving.vocab_size, offered.vocab_size),
        ("hidden_size", serving.hidden_size, offered.hidden_size),
        ("num_layers", serving.num_layers, offered.num_layers),
        ("num_heads", serving.num_heads, offered.num_heads),
        ("num_kv_heads", serving.num_kv_heads, offered.num_kv_heads),
        ("head_dim", serving.head_dim, offered.head_dim),
        (
            "intermediate_size",
            serving.intermediate_size,
            offered.intermediate_size,
        ),
    ];
    fields
        .into_iter()
        .find(|(_, a, b)| a != b)
        .map(|(name, _, _)| name)
}

impl EngineCore {
    /// The version of the weights the engine serves now.
    pub fn weight_version(&self) -> WeightVersion {
        self.weight_version
    }

    /// The weights the engine serves now.
    pub fn weights(&self) -> &Arc<Model> {
        &self.weights
    }

    /// Whether a swap may be applied now: nothing is generating or being prefilled.
    pub fn can_swap_weights(&self) -> bool {
        self.flushing.is_empty() && self.seqs.values().all(|s| s.generating.is_none())
    }

    /// Serves `weights` from now on and returns the new weight version. Live sequences
    /// keep their tokens and recompute their KV on their next use; cached prefixes are
    /// forgotten. Fails (changing nothing) when the weights' shape differs from the
    /// served model's, they keep K/V wider than the pool (exact weights into an engine
    /// started fast), a generation or prefill is in flight, or a pin holds KV.
    pub fn swap_weights(&mut self, weights: Arc<Model>) -> Result<WeightVersion, EngineError> {
        self.swap_weights_as(weights, self.weight_version + 1)
    }

    /// [`Self::swap_weights`] naming the new version (a trainer resuming at step `k`
    /// serves its policy as version `k`); it must be above the current one.
    pub fn swap_weights_as(
        &mut self,
        weights: Arc<Model>,
        version: WeightVersion,
    ) -> Result<WeightVersion, EngineError> {
        if version <= self.weight_version {
            return Err(EngineError::StaleWeightVersion {
                offered: version,
                serving: self.weight_version,
            });
        }
        let serving = self.weights.config();
        if let Some(field) = shape_mismatch(serving, weights.config()) {
            return Err(EngineError::WeightShape { field });
        }
        // An f32 pool holds an f16 model's rounded values exactly; the other way round
        // would round exact weights' K/V.
        let (cache, offered) = (self.kv.format(), weights.kv_format());
        if offered.bytes() > cache.bytes() {
            return Err(EngineError::KvFormat {
                cache,
                weights: offered,
            });
        }
        if !self.can_swap_weights() {
            return Err(EngineError::SwapInFlight);
        }
        let pins = self.kv.pin_ids().len();
        if pins > 0 {
            return Err(EngineError::SwapWithPins { pins });
        }
        let live: Vec<_> = self.seqs.keys().copied().collect();
        for seq in live {
            if self.kv.seq_len(seq)? > 0 || self.seqs[&seq].recompute > 0 {
                self.drop_kv(seq)?;
                self.counters.stale_drops += 1;
            }
        }
        // After the tables let go, so their blocks go back to the free list instead of
        // being parked under old-version entries.
        self.kv.clear_prefix_cache();
        self.weights = weights;
        self.weight_version = version;
        self.counters.weight_swaps += 1;
        Ok(self.weight_version)
    }
}
