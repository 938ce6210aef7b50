//! What the engine keeps per sequence ([`SeqState`]: pending tokens, the recompute a
//! preemption left, kept logits, usage) and per generation ([`GenState`]), and what a
//! finished generation returns ([`Generation`]).

use std::sync::Arc;

use crate::model::TokenId;

use super::counters::SeqUsage;
use super::error::EngineError;
use super::penalties::TokenHistory;
use super::rng::SeqRng;
use super::sampling::SampledToken;
use super::stop::{GenParams, StopReason};
use super::weight_version::WeightVersion;

/// A finished generation.
#[derive(Debug, Clone, PartialEq)]
pub struct Generation {
    /// The generated token ids, in order (a stop token that ended it is not among them).
    pub tokens: Vec<TokenId>,
    /// Natural-log probability of each token under the policy: the generation's
    /// sampling temperature, the whole vocabulary (see [`super::sampling`]).
    pub logprobs: Vec<f32>,
    /// Natural-log probability of each token under the distribution it was drawn
    /// from (truncation and renormalisation included; a boosted token's at its
    /// boost): what an importance weight divides by.
    pub behaviour_logprobs: Vec<f32>,
    /// How many of the first tokens were drawn from the params' [`BoostedStart`]
    /// (0 without one).
    ///
    /// [`BoostedStart`]: super::sampling::BoostedStart
    pub boosted: usize,
    /// Why it ended.
    pub stop: StopReason,
    /// The weights every token of it was sampled under (see [`super::weights`]).
    pub weight_version: WeightVersion,
    /// Per token, the `top_logprobs` most likely alternatives (empty lists when none
    /// were asked for).
    pub top_logprobs: Vec<Vec<SampledToken>>,
    /// Times its sequence was preempted (KV dropped, recomputed) while it generated
    /// (verl's `num_preempted`).
    pub preemptions: u32,
}

#[derive(Debug)]
pub(super) struct GenState {
    pub(super) params: GenParams,
    pub(super) rng: SeqRng,
    pub(super) tokens: Vec<TokenId>,
    pub(super) logprobs: Vec<f32>,
    pub(super) behaviour_logprobs: Vec<f32>,
    /// Alternatives of each kept token, when asked for.
    pub(super) top_logprobs: Vec<Vec<SampledToken>>,
    /// What the penalties look at; `None` when there are none.
    pub(super) history: Option<TokenHistory>,
    /// Preemptions of the sequence during this generation.
    pub(super) preemptions: u32,
    /// Each kept token is also reported through [`EngineCore::take_streamed`](super::EngineCore::take_streamed) as it
    /// is sampled (a server streaming tokens to its client).
    pub(super) stream: bool,
}

#[derive(Debug, Default)]
pub(super) struct SeqState {
    /// Tokens to feed, in order: first `recompute` tokens whose KV a preemption
    /// dropped, then `sampled_pending` sampled tokens, then prompt or appended tokens.
    pub(super) pending: Vec<TokenId>,
    /// How many of the leading pending tokens recompute KV dropped by a preemption
    /// (counted as `recomputed_preempted`, not again as prefilled or decoded).
    pub(super) recompute: usize,
    /// The recompute has started (cached blocks adopted). At most one fresh restore
    /// is admitted while another is in flight, so forks of one preempted snapshot
    /// find each other's recomputed blocks instead of computing them twice.
    pub(super) restoring: bool,
    /// How many pending tokens after the recompute were sampled (fed as "decoded").
    pub(super) sampled_pending: usize,
    /// Whether the scheduler should feed `pending`. A generation's last sampled token
    /// stays pending but idle: it is computed only if the sequence goes on (an
    /// append or another generation), so a branch that ends costs nothing more.
    pub(super) runnable: bool,
    /// Logits of the last position in the cache (when `pending` is empty).
    pub(super) last_logits: Option<Arc<Vec<f32>>>,
    pub(super) generating: Option<GenState>,
    /// What this sequence has cost so far (returned by `free`).
    pub(super) usage: SeqUsage,
    /// The engine tick of its last use: idle sequences are preempted least recently
    /// used first.
    pub(super) last_used: u64,
    /// A failure of work nobody was waiting for yet (tokens added, then failed before
    /// the caller asked for them): the next call on the sequence (fork, append,
    /// generate, prefill, score) reports it instead of doing anything.
    pub(super) unreported: Option<EngineError>,
}

impl SeqState {
    pub(super) fn push_sampled(&mut self, token: TokenId) {
        self.pending.push(token);
        self.sampled_pending += 1;
        self.last_logits = None;
    }

    /// Preempted, and its recompute not started: it must adopt cached blocks first.
    pub(super) fn awaits_restore(&self) -> bool {
        self.recompute > 0 && !self.restoring
    }
}
