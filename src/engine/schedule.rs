//! One engine step: which sequences' pending tokens go into the next forward, the
//! forward, and what its rows mean for each sequence.
//!
//! Admission: decode tokens first, then prefill chunks, in sequence order, under a
//! per-step token cap (a long prefill cannot stall decoding) and a sequence cap. A
//! sequence that needs KV blocks the pool cannot give first takes them from idle
//! sequences (preempted least recently used first, see [`preempt`](super::preempt));
//! when no sequence at all can run, the oldest waiting one preempts whatever it needs,
//! so every sequence that fits the pool alone eventually runs. Only a sequence that
//! cannot fit even then fails, with [`EngineError::NeverFits`].

use std::sync::Arc;

use crate::kv::{KvError, SeqId};
use crate::model::{BatchSeq, ForwardBatch, LogitsWanted, ModelError, StepLogits};

use super::core::EngineCore;
use super::error::EngineError;
use super::step_log::{distinct_context, StepRecord};

/// The batch one step runs.
#[derive(Default)]
struct Plan {
    batch: ForwardBatch,
    /// Sequences in the batch and how many of their pending tokens each feeds.
    chosen: Vec<(SeqId, usize)>,
    /// Runnable sequences left out for want of KV blocks.
    blocked: Vec<SeqId>,
}

/// What admitting one sequence came to.
enum Admission {
    Reserved,
    /// It waits for KV room.
    Blocked,
    /// It was failed (it can never fit, or passes the context window).
    Failed,
}

impl EngineCore {
    /// One forward over a ragged batch of every runnable sequence's pending tokens.
    /// Returns the rows computed (0 when nothing could run).
    pub fn step(&mut self) -> Result<usize, EngineError> {
        self.tick += 1;
        let preemptions_before = self.counters.preemptions;
        let mut plan = self.plan()?;
        if plan.chosen.is_empty() {
            if let Some(&oldest) = plan.blocked.iter().min() {
                // Every runnable sequence waits for room that no running sequence will
                // free: the oldest takes it from the others.
                self.preempt_for(oldest)?;
                plan = self.plan()?;
            }
        }
        self.kv_pressure =
            !plan.blocked.is_empty() || self.counters.preemptions != preemptions_before;
        if plan.chosen.is_empty() {
            return Ok(0);
        }
        let started = std::time::Instant::now();
        let mut record = StepRecord::of_batch(&plan.batch);
        if self.step_log.is_on() {
            record.distinct_context = distinct_context(&self.kv, &plan.batch);
        }
        let rows = self.run(plan, &mut record);
        self.step_latency.record(started.elapsed().as_secs_f64());
        self.step_log.record(started, &record);
        rows
    }

    /// Chooses this step's batch and reserves its KV.
    fn plan(&mut self) -> Result<Plan, EngineError> {
        let mut order: Vec<(SeqId, usize)> = self
            .seqs
            .iter()
            .filter(|(_, s)| s.runnable && !s.pending.is_empty())
            .map(|(&id, s)| (id, s.pending.len()))
            .collect();
        order.sort_by_key(|&(id, n)| (n > 1 || self.seqs[&id].generating.is_none(), id));
        // A restore in flight: a runnable sequence part way through its recompute
        // (a `score` that could not reserve leaves an idle one behind, which must not
        // hold the others up).
        let mut restoring = self
            .seqs
            .values()
            .any(|s| s.restoring && s.runnable && !s.pending.is_empty());

        let mut plan = Plan::default();
        let mut budget = self.config.max_batch_tokens.max(1);
        for (seq, _) in order {
            if budget == 0 || plan.chosen.len() >= self.config.max_batch_seqs.max(1) {
                break;
            }
            if self.seqs[&seq].awaits_restore() {
                if restoring {
                    continue;
                }
                // A preempted sequence comes back only when the pool holds its whole
                // history without preempting others (else two sequences would keep
                // evicting each other); when nothing else can run, `preempt_for`
                // brings back the oldest.
                let history = self.seqs[&seq].pending.len();
                if self.kv.available_blocks() < self.kv.blocks_for_tokens(history) {
                    plan.blocked.push(seq);
                    continue;
                }
                self.restore_from_cache(seq)?;
                restoring = true;
            }
            let n_pending = self.seqs[&seq].pending.len();
            let n = n_pending.min(budget);
            match self.admit(seq, n, n_pending)? {
                Admission::Reserved => {}
                Admission::Blocked => {
                    plan.blocked.push(seq);
                    continue;
                }
                Admission::Failed => continue,
            }
            let s = &self.seqs[&seq];
            plan.batch.seqs.push(BatchSeq {
                slot: seq.slot(),
                start: self.kv.seq_len(seq)?,
                tokens: s.pending[..n].to_vec(),
                logits: if n == n_pending {
                    LogitsWanted::Last
                } else {
                    LogitsWanted::None
                },
            });
            plan.chosen.push((seq, n));
            budget -= n;
        }
        Ok(plan)
    }

    /// Reserves KV for `n` of `seq`'s `n_pending` tokens, preempting idle sequences
    /// if the pool is short.
    fn admit(&mut self, seq: SeqId, n: usize, n_pending: usize) -> Result<Admission, EngineError> {
        let max_pos = self.model.model.config().max_position_embeddings;
        let start = self.kv.seq_len(seq)?;
        if start + n > max_pos {
            let err = ModelError::ContextOverflow {
                tokens: start + n,
                max: max_pos,
            };
            self.fail(seq, err.into());
            return Ok(Admission::Failed);
        }
        // Fail at once, before computing a chunk of it, a sequence whose history and
        // pending tokens need more blocks than the whole pool.
        if self.kv.blocks_for_tokens(start + n_pending) > self.kv.num_blocks() {
            self.fail_never_fits(seq);
            return Ok(Admission::Failed);
        }
        loop {
            match self.kv.reserve(seq, n) {
                Ok(()) => return Ok(Admission::Reserved),
                Err(KvError::OutOfBlocks { .. }) => {
                    if !self.preempt_idle(seq)? {
                        return Ok(Admission::Blocked);
                    }
                }
                Err(e) => return Err(e.into()),
            }
        }
    }

    /// Fails `seq`, which cannot get KV room for its whole history and pending work
    /// even with every other sequence preempted.
    pub(super) fn fail_never_fits(&mut self, seq: SeqId) {
        let tokens =
            self.kv.seq_len(seq).unwrap_or(0) + self.seqs.get(&seq).map_or(0, |s| s.pending.len());
        let err = EngineError::NeverFits {
            seq,
            tokens,
            needed: self.kv.blocks_for_tokens(tokens),
            total: self.kv.num_blocks(),
            pinned: self.kv.pinned_blocks(),
        };
        self.fail(seq, err);
    }

    /// Runs the planned forward and hands each sequence its rows.
    /// Notes the forward's and the draws' times in `record`.
    fn run(&mut self, plan: Plan, record: &mut StepRecord) -> Result<usize, EngineError> {
        // The step's logits go into the engine's reused block (taken out while the
        // draws borrow it; put back whatever happens).
        let mut logits = std::mem::take(&mut self.step_logits);
        let rows = self.run_with(plan, record, &mut logits);
        self.step_logits = logits;
        rows
    }

    /// [`Self::run`]'s step, its logits written into `logits`.
    fn run_with(
        &mut self,
        plan: Plan,
        record: &mut StepRecord,
        logits: &mut StepLogits,
    ) -> Result<usize, EngineError> {
        let started = std::time::Instant::now();
        let forward = self.weights.forward_into(&plan.batch, &mut self.kv, logits);
        record.forward_s = started.elapsed().as_secs_f64();
        if let Err(e) = forward {
            // Undo the reservations so the cache stays consistent, and fail this
            // batch's sequences (each gets the error) instead of retrying forever.
            let cause = std::sync::Arc::new(e);
            for &(seq, _) in &plan.chosen {
                let len = self.kv.seq_len(seq)?;
                self.kv.truncate(seq, len)?;
                self.fail(seq, EngineError::Forward(cause.clone()));
            }
            return Ok(0);
        }
        self.counters.steps += 1;
        let tick = self.tick;
        let rows: usize = plan.chosen.iter().map(|&(_, n)| n).sum();
        // Sequences whose pending tokens are all computed now, with their index in the
        // batch (their logits' rows in the block).
        let mut caught_up: Vec<(SeqId, usize)> = Vec::new();
        for (i, (seq, n)) in plan.chosen.into_iter().enumerate() {
            let fed = self.seqs[&seq].pending[..n].to_vec();
            self.kv.commit(seq, &fed)?;
            let s = self
                .seqs
                .get_mut(&seq)
                .ok_or(EngineError::UnknownSequence(seq))?;
            s.pending.drain(..n);
            s.last_used = tick;
            // The rows are, in order: a recompute after preemption, sampled tokens fed
            // back, prompt or appended tokens.
            let recomputed = n.min(s.recompute);
            s.recompute -= recomputed;
            if s.recompute == 0 {
                s.restoring = false;
            }
            let decoded = (n - recomputed).min(s.sampled_pending);
            s.sampled_pending -= decoded;
            let prefilled = n - recomputed - decoded;
            self.counters.recomputed_preempted += recomputed as u64;
            self.counters.decoded += decoded as u64;
            self.counters.prefilled += prefilled as u64;
            s.usage.recomputed_preempted += recomputed as u64;
            s.usage.decoded += decoded as u64;
            s.usage.prefilled += prefilled as u64;
            if s.pending.is_empty() {
                if s.generating.is_none() {
                    s.runnable = false;
                }
                // A prefill asked for is done now, before a generation samples on.
                let prefills = self.flushing.iter().filter(|&&q| q == seq).count();
                if prefills > 0 {
                    self.flushing.retain(|&q| q != seq);
                    self.flushed.extend((0..prefills).map(|_| (seq, Ok(()))));
                }
                caught_up.push((seq, i));
            }
        }
        // The step's draws together, after every sequence's rows are in (a draw reads
        // only its own sequence's logits and state), straight from the block.
        let due: Vec<(SeqId, &[f32])> = caught_up
            .iter()
            .filter(|(seq, _)| self.seqs[seq].generating.is_some())
            .filter_map(|&(seq, i)| Some((seq, logits.last_row(i)?)))
            .collect();
        let sampling = std::time::Instant::now();
        let drawn = self.sample_all(&due);
        record.sample_s = sampling.elapsed().as_secs_f64();
        // A sequence left with nothing pending (a prefill, a generation that stopped
        // without a token to feed) keeps its last logits for a later generation or
        // fork; one that drew a token will compute new ones.
        for &(seq, i) in &caught_up {
            if let Some(s) = self.seqs.get_mut(&seq) {
                s.last_logits = match logits.last_row(i) {
                    Some(row) if s.pending.is_empty() => Some(Arc::new(row.to_vec())),
                    _ => None,
                };
            }
        }
        drawn?;
        self.counters.peak_kv_bytes = self
            .counters
            .peak_kv_bytes
            .max(self.kv.bytes_in_use() as u64);
        Ok(rows)
    }
}
