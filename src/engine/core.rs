//! The engine's synchronous core: sequences over a paged KV cache, advanced together
//! one ragged batch per [`EngineCore::step`].
//!
//! A sequence holds *pending* tokens (known, not yet in the KV cache) and, while it
//! generates, its sampling state. Each step feeds every runnable sequence's pending
//! tokens through one forward (see the `schedule` module). When a sequence's
//! pending tokens are all in the cache, its last row's logits are kept, so a
//! generation — or a fork's generation — can sample its first token without
//! recomputing anything.
//!
//! Under memory pressure a sequence may be *preempted* (see the `preempt` module):
//! its KV is dropped and its tokens become pending again, marked as a recompute, so it
//! is recomputed when room returns. Callers never see it: tokens, logprobs and results
//! are the same as without the preemption.
//!
//! Results never depend on batch composition: each row's arithmetic is fixed (see the
//! model layer's invariant), and each generation's RNG is seeded from its own params.

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::kv::{KvCache, KvConfig, PinId, SeqId};
use crate::model::{BatchSeq, ForwardBatch, LoadedModel, LogitsWanted, Model, StepLogits, TokenId};

pub use super::config::EngineConfig;
use super::counters::{EngineCounters, EngineStats, Histogram, SeqUsage};
use super::error::EngineError;
use super::penalties::TokenHistory;
use super::rng::SeqRng;
use super::sampling::SampledToken;
use super::sequence::{GenState, Generation, SeqState};
use super::step_log::StepLog;
use super::stop::GenParams;

/// The engine's state: model, KV cache, sequences and counters.
pub struct EngineCore {
    /// Tokenizer, chat template and the config; its `model` is the weights the engine
    /// started with, which a swap replaces in `weights`.
    pub(super) model: Arc<LoadedModel>,
    /// The weights every forward runs.
    pub(super) weights: Arc<Model>,
    pub(super) weight_version: super::WeightVersion,
    pub(super) kv: KvCache,
    pub(super) config: EngineConfig,
    pub(super) seqs: BTreeMap<SeqId, SeqState>,
    pub(super) finished: Vec<(SeqId, Result<Generation, EngineError>)>,
    /// Tokens sampled since the last [`EngineCore::take_streamed`] by streaming
    /// generations, in the order sampled.
    pub(super) streamed: Vec<(SeqId, SampledToken)>,
    /// How long each step's forward took.
    pub(super) step_latency: Histogram,
    /// Sequences whose caller waits for their pending tokens to be computed.
    pub(super) flushing: Vec<SeqId>,
    pub(super) flushed: Vec<(SeqId, Result<(), EngineError>)>,
    pub(super) counters: EngineCounters,
    /// Increases with every operation and step (the clock of `last_used`).
    pub(super) tick: u64,
    /// The last step left a sequence waiting for KV room or preempted one.
    pub(super) kv_pressure: bool,
    /// One line per step when `TREEGRPO_STEP_LOG` is set.
    pub(super) step_log: StepLog,
    /// The block each step's logits are written into, reused from step to step.
    pub(super) step_logits: StepLogits,
}

impl EngineCore {
    /// An engine with no sequences over `model`, its KV pool sized by `config`. An error
    /// if the pool cannot be made (a budget too small for one block, an allocation
    /// that fails) or the step log
    /// ([`STEP_LOG_ENV`](super::step_log::STEP_LOG_ENV)) names a file that cannot be
    /// created.
    pub fn new(model: Arc<LoadedModel>, config: EngineConfig) -> Result<Self, EngineError> {
        let mut kv = KvCache::for_model(
            KvConfig {
                block_size: config.block_size,
                budget_bytes: config.kv_budget_bytes,
                format: model.model.kv_format(),
            },
            model.model.config(),
        )?;
        kv.set_reuse_cached_first(config.reuse_cached_first);
        Ok(EngineCore {
            weights: model.model.clone(),
            weight_version: 0,
            model,
            kv,
            config,
            seqs: BTreeMap::new(),
            finished: Vec::new(),
            streamed: Vec::new(),
            step_latency: Histogram::new(&Histogram::STEP_BOUNDS),
            flushing: Vec::new(),
            flushed: Vec::new(),
            counters: EngineCounters::default(),
            tick: 0,
            kv_pressure: false,
            step_log: StepLog::from_env()?,
            step_logits: StepLogits::new(),
        })
    }

    /// The model the engine started with: its tokenizer, chat template and config (the
    /// weights it serves may since have been swapped).
    pub fn model(&self) -> &Arc<LoadedModel> {
        &self.model
    }

    /// A snapshot of the counters, the KV pool's occupancy and the step latencies.
    pub fn stats(&self) -> EngineStats {
        EngineStats {
            counters: self.counters,
            kv: self.kv.stats(),
            weight_version: self.weight_version,
            precision: self.weights.precision(),
            sequences: self.seqs.len(),
            generating: self
                .seqs
                .values()
                .filter(|s| s.generating.is_some())
                .count(),
            step_latency: self.step_latency.clone(),
        }
    }

    /// The paged KV cache, for inspection.
    pub fn kv(&self) -> &KvCache {
        &self.kv
    }

    /// The sequence's state, marked as used now.
    fn state(&mut self, seq: SeqId) -> Result<&mut SeqState, EngineError> {
        self.tick += 1;
        let tick = self.tick;
        let s = self
            .seqs
            .get_mut(&seq)
            .ok_or(EngineError::UnknownSequence(seq))?;
        s.last_used = tick;
        Ok(s)
    }

    fn check_tokens(&self, tokens: &[TokenId]) -> Result<(), EngineError> {
        let vocab = self.model.model.config().vocab_size;
        match tokens.iter().find(|&&t| t as usize >= vocab) {
            Some(&token) => Err(EngineError::BadToken { token, vocab }),
            None => Ok(()),
        }
    }

    /// Starts a sequence from `prompt`, reusing cached full blocks of an identical
    /// prefix (counted as reused); the rest is prefilled by the next steps.
    pub fn add_sequence(&mut self, prompt: &[TokenId]) -> Result<SeqId, EngineError> {
        if prompt.is_empty() {
            return Err(EngineError::EmptyPrompt);
        }
        self.check_tokens(prompt)?;
        let max = self.model.model.config().max_position_embeddings;
        if prompt.len() >= max {
            return Err(crate::model::ModelError::ContextOverflow {
                tokens: prompt.len(),
                max,
            }
            .into());
        }
        let (seq, cached) = if self.config.prefix_cache {
            self.kv.start_sequence(prompt)
        } else {
            (self.kv.new_sequence(), 0)
        };
        self.counters.reused_prefix_cache += cached as u64;
        self.tick += 1;
        self.seqs.insert(
            seq,
            SeqState {
                pending: prompt[cached..].to_vec(),
                runnable: true,
                usage: SeqUsage {
                    reused_prefix_cache: cached as u64,
                    ..SeqUsage::default()
                },
                last_used: self.tick,
                ..SeqState::default()
            },
        );
        Ok(seq)
    }

    /// A new sequence sharing everything `parent` has computed: no KV data is copied
    /// and nothing is recomputed; the cost is O(1) in the prefix length (the parent's
    /// full blocks are frozen into a segment both share). Pending tokens are copied.
    pub fn fork(&mut self, parent: SeqId) -> Result<SeqId, EngineError> {
        let p = self.state(parent)?;
        if p.generating.is_some() {
            return Err(EngineError::Busy(parent));
        }
        if let Some(err) = p.unreported.take() {
            return Err(err);
        }
        let child_state = SeqState {
            unreported: None,
            pending: p.pending.clone(),
            recompute: p.recompute,
            restoring: p.restoring,
            sampled_pending: p.sampled_pending,
            runnable: p.runnable,
            last_logits: p.last_logits.clone(),
            generating: None,
            usage: SeqUsage::default(),
            last_used: p.last_used,
        };
        let child = self.kv.fork(parent)?;
        // What the child inherits is the parent's whole history, cached or (after a
        // preemption) still to be recomputed: the same figure as without pressure.
        let inherited = (self.kv.seq_len(child)? + child_state.recompute) as u64;
        self.counters.reused_fork += inherited;
        self.seqs.insert(
            child,
            SeqState {
                usage: SeqUsage {
                    reused_fork: inherited,
                    ..SeqUsage::default()
                },
                ..child_state
            },
        );
        Ok(child)
    }

    /// Appends tokens (e.g. a tool's observation) to be prefilled.
    pub fn append(&mut self, seq: SeqId, tokens: &[TokenId]) -> Result<(), EngineError> {
        self.check_tokens(tokens)?;
        let s = self.state(seq)?;
        if s.generating.is_some() {
            return Err(EngineError::Busy(seq));
        }
        if let Some(err) = s.unreported.take() {
            return Err(err);
        }
        if !tokens.is_empty() {
            s.pending.extend_from_slice(tokens);
            s.last_logits = None;
            s.runnable = true;
        }
        Ok(())
    }

    /// Starts generating on `seq`; the result appears in [`Self::take_finished`].
    pub fn generate(&mut self, seq: SeqId, params: GenParams) -> Result<(), EngineError> {
        self.start_generation(seq, params, false)
    }

    /// [`Self::generate`], also reporting each token through [`Self::take_streamed`]
    /// as it is sampled. The tokens and the result are those of `generate`.
    pub fn generate_streaming(&mut self, seq: SeqId, params: GenParams) -> Result<(), EngineError> {
        self.start_generation(seq, params, true)
    }

    fn start_generation(
        &mut self,
        seq: SeqId,
        params: GenParams,
        stream: bool,
    ) -> Result<(), EngineError> {
        params.validate()?;
        let s = self.state(seq)?;
        if s.generating.is_some() {
            return Err(EngineError::Busy(seq));
        }
        if let Some(err) = s.unreported.take() {
            return Err(err);
        }
        if s.pending.is_empty() && s.last_logits.is_none() {
            return Err(EngineError::EmptySequence(seq));
        }
        let rng = SeqRng::from_parts(&params.seed);
        // What penalties look at: every token of the sequence, cached or still to feed.
        let history = if params.penalties.is_neutral() {
            None
        } else {
            let pending = s.pending.clone();
            Some(TokenHistory::new(
                self.kv.tokens(seq)?.into_iter().chain(pending),
            ))
        };
        let s = self
            .seqs
            .get_mut(&seq)
            .ok_or(EngineError::UnknownSequence(seq))?;
        s.runnable = true;
        s.generating = Some(GenState {
            params,
            rng,
            tokens: Vec::new(),
            logprobs: Vec::new(),
            behaviour_logprobs: Vec::new(),
            top_logprobs: Vec::new(),
            history,
            preemptions: 0,
            stream,
        });
        // Everything is cached already (a fork at a node's end): sample right away.
        if s.pending.is_empty() {
            if let Some(logits) = s.last_logits.clone() {
                self.sample_next(seq, &logits)?;
            }
        }
        Ok(())
    }

    /// Feeds `tokens` to an idle sequence at once, alone, and returns the logits at every
    /// one of their positions (teacher forcing: scoring a continuation, oracles). A
    /// preempted sequence recomputes its dropped KV in the same forward.
    pub fn score(&mut self, seq: SeqId, tokens: &[TokenId]) -> Result<Vec<Vec<f32>>, EngineError> {
        let s = self.state(seq)?;
        if let Some(err) = s.unreported.take() {
            return Err(err);
        }
        if s.generating.is_some() || s.pending.len() != s.recompute {
            return Err(EngineError::Busy(seq));
        }
        if tokens.is_empty() {
            return Ok(Vec::new());
        }
        if s.awaits_restore() {
            self.restore_from_cache(seq)?;
        }
        let s = &self.seqs[&seq];
        let recompute = s.recompute;
        let mut fed = s.pending.clone();
        fed.extend_from_slice(tokens);
        let start = self.kv.seq_len(seq)?;
        self.kv.reserve(seq, fed.len())?;
        let batch = ForwardBatch {
            seqs: vec![BatchSeq {
                slot: seq.slot(),
                start,
                tokens: fed.clone(),
                logits: LogitsWanted::All,
            }],
        };
        let out = match self.weights.forward(&batch, &mut self.kv) {
            Ok(out) => out,
            Err(e) => {
                self.kv.truncate(seq, start)?;
                return Err(e.into());
            }
        };
        self.kv.commit(seq, &fed)?;
        self.counters.steps += 1;
        self.counters.prefilled += tokens.len() as u64;
        self.counters.recomputed_preempted += recompute as u64;
        let mut rows = out.into_iter().next().map(|o| o.rows).unwrap_or_default();
        rows.drain(..recompute.min(rows.len()));
        if let Some(s) = self.seqs.get_mut(&seq) {
            s.pending.clear();
            s.recompute = 0;
            s.restoring = false;
            s.last_logits = rows.last().cloned().map(Arc::new);
            s.usage.prefilled += tokens.len() as u64;
            s.usage.recomputed_preempted += recompute as u64;
        }
        Ok(rows)
    }

    /// Computes `seq`'s pending tokens (prompt, appended observation, a generation's
    /// last token) without generating; completion appears in [`Self::take_flushed`].
    /// Afterwards the sequence holds the logits of its last position, so forks of it
    /// sample their first token without computing anything.
    pub fn prefill(&mut self, seq: SeqId) -> Result<(), EngineError> {
        let s = self.state(seq)?;
        if s.generating.is_some() {
            return Err(EngineError::Busy(seq));
        }
        if let Some(err) = s.unreported.take() {
            return Err(err);
        }
        if s.pending.is_empty() {
            self.flushed.push((seq, Ok(())));
        } else {
            s.runnable = true;
            self.flushing.push(seq);
        }
        Ok(())
    }

    /// Prefills finished since the last call.
    pub fn take_flushed(&mut self) -> Vec<(SeqId, Result<(), EngineError>)> {
        let seqs = &self.seqs;
        let (done, still): (Vec<SeqId>, Vec<SeqId>) = self
            .flushing
            .drain(..)
            // Done once nothing but a recompute is pending: a preemption after the
            // prefill dropped KV the engine recomputes on its own.
            .partition(|q| seqs.get(q).is_none_or(|s| s.pending.len() == s.recompute));
        self.flushing = still;
        for q in done {
            let r = if self.seqs.contains_key(&q) {
                Ok(())
            } else {
                Err(EngineError::UnknownSequence(q))
            };
            self.flushed.push((q, r));
        }
        std::mem::take(&mut self.flushed)
    }

    /// Drops a sequence; its blocks return to the pool (or the prefix cache). Returns
    /// what the sequence cost over its life.
    pub fn free(&mut self, seq: SeqId) -> Result<SeqUsage, EngineError> {
        let state = self
            .seqs
            .remove(&seq)
            .ok_or(EngineError::UnknownSequence(seq))?;
        // Work still owed to a caller is reported, never dropped.
        if state.generating.is_some() {
            self.finished.push((seq, Err(EngineError::Freed(seq))));
        }
        if let Some(i) = self.flushing.iter().position(|&q| q == seq) {
            self.flushing.remove(i);
            self.flushed.push((seq, Err(EngineError::Freed(seq))));
        }
        self.kv.free(seq)?;
        Ok(state.usage)
    }

    /// Keeps the positions of `seq` that are in the KV cache now resident until
    /// [`Self::unpin`] (positions a preemption dropped and not yet recomputed are not
    /// in the cache, so not pinned).
    pub fn pin(&mut self, seq: SeqId) -> Result<PinId, EngineError> {
        self.state(seq)?;
        Ok(self.kv.pin(seq)?)
    }

    /// Releases a pin taken by [`Self::pin`]; its blocks become evictable. An error if
    /// the pin is unknown (never taken, or released already).
    pub fn unpin(&mut self, pin: PinId) -> Result<(), EngineError> {
        Ok(self.kv.unpin(pin)?)
    }

    /// Tokens of `seq` the engine holds computed: those in the KV cache and those a
    /// preemption dropped, which it recomputes before anything else.
    pub fn tokens(&self, seq: SeqId) -> Result<Vec<TokenId>, EngineError> {
        self.tokens_and_pending(seq, |s| s.recompute)
    }

    /// Every token of `seq`, computed or not: the cached ones, then those still pending
    /// (a generation's last sampled token, appended tokens not yet computed) — what
    /// the sequence's next token continues.
    pub fn sequence_tokens(&self, seq: SeqId) -> Result<Vec<TokenId>, EngineError> {
        self.tokens_and_pending(seq, |s| s.pending.len())
    }

    /// The cached tokens of `seq`, then the first `pending(state)` pending ones.
    fn tokens_and_pending(
        &self,
        seq: SeqId,
        pending: impl FnOnce(&SeqState) -> usize,
    ) -> Result<Vec<TokenId>, EngineError> {
        let s = self
            .seqs
            .get(&seq)
            .ok_or(EngineError::UnknownSequence(seq))?;
        let mut tokens = self.kv.tokens(seq)?;
        tokens.extend_from_slice(&s.pending[..pending(s)]);
        Ok(tokens)
    }

    /// Drops all cached prefixes (after a weight update their KV is stale).
    pub fn clear_prefix_cache(&mut self) {
        self.kv.clear_prefix_cache();
    }

    /// Tokens streaming generations kept since the last call, in the order sampled
    /// (a generation's tokens all come before its entry in [`Self::take_finished`]).
    pub fn take_streamed(&mut self) -> Vec<(SeqId, SampledToken)> {
        std::mem::take(&mut self.streamed)
    }

    /// Generations finished since the last call.
    pub fn take_finished(&mut self) -> Vec<(SeqId, Result<Generation, EngineError>)> {
        std::mem::take(&mut self.finished)
    }

    /// Whether any sequence has tokens to feed.
    pub fn has_work(&self) -> bool {
        self.seqs
            .values()
            .any(|s| s.runnable && !s.pending.is_empty())
    }

    /// Whether new work may start without adding to memory pressure: the last step
    /// left no sequence waiting for KV room and preempted none, and at least
    /// `min_available_blocks` blocks are free or evictable. Always true when nothing
    /// runs (then waiting could never end, and preemption makes the room).
    pub fn has_kv_room(&self, min_available_blocks: usize) -> bool {
        !self.has_work()
            || (!self.kv_pressure && self.kv.available_blocks() >= min_available_blocks)
    }

    /// Runs steps until no sequence has work left.
    pub fn run_until_idle(&mut self) -> Result<(), EngineError> {
        while self.has_work() {
            self.step()?;
        }
        Ok(())
    }

    /// Fails `seq`'s current work with `err`. Its pending work is dropped; KV that a
    /// preemption dropped stays pending (it is part of what the sequence holds).
    ///
    /// Each waiter gets the error once: prefill callers through `take_flushed`, a
    /// generation through `take_finished`. With nobody waiting yet (a prompt or an
    /// appended observation failed before the caller asked for it) the next call on
    /// the sequence reports it.
    pub(super) fn fail(&mut self, seq: SeqId, mut err: EngineError) {
        let prefills = self.flushing.iter().filter(|&&q| q == seq).count();
        self.flushing.retain(|&q| q != seq);
        for _ in 0..prefills {
            self.flushed.push((seq, Err(err.replicate())));
        }
        let Some(s) = self.seqs.get_mut(&seq) else {
            return;
        };
        s.pending.truncate(s.recompute);
        s.sampled_pending = 0;
        s.runnable = false;
        s.restoring = false;
        if s.generating.take().is_some() {
            self.finished.push((seq, Err(err)));
        } else if prefills == 0 {
            s.unreported = Some(err);
        }
    }
}
