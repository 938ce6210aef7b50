//! Preemption by recompute: when the KV pool cannot make progress, a sequence's KV is
//! dropped and its tokens become pending again, to be recomputed when room returns.
//!
//! Victims, in order: idle sequences (node snapshots, branches waiting on a tool,
//! finished generations) least recently used first, each only if dropping its table
//! gives blocks back (a snapshot that shares every block with a live branch frees
//! nothing); then, only when no sequence at all can run, every other holder of blocks
//! youngest first, for the oldest waiting sequence (blocks two others share come back
//! once both are preempted). Pins are never preempted.
//!
//! A recompute first adopts whatever full blocks of its history are still in the pool
//! (shared with other tables, or parked in the prefix cache), so usually only the last
//! partly filled block and evicted blocks are computed again. Because every row's
//! arithmetic is independent of the batch, the recomputed KV and logits are
//! bit-identical to the dropped ones: preemption never changes a result.

use crate::kv::SeqId;

use super::core::EngineCore;
use super::error::EngineError;

impl EngineCore {
    /// Drops `victim`'s KV to make room; its tokens become a pending recompute.
    pub(super) fn preempt(&mut self, victim: SeqId) -> Result<(), EngineError> {
        self.drop_kv(victim)?;
        if let Some(s) = self.seqs.get_mut(&victim) {
            s.usage.preemptions += 1;
            if let Some(g) = s.generating.as_mut() {
                g.preemptions += 1;
            }
        }
        self.counters.preemptions += 1;
        Ok(())
    }

    /// Drops `seq`'s KV (under memory pressure, or stale after a weight swap): its
    /// cached tokens go back to the front of its pending tokens as a recompute.
    pub(super) fn drop_kv(&mut self, seq: SeqId) -> Result<(), EngineError> {
        let cached = self.kv.tokens(seq)?;
        self.kv.reset(seq)?;
        let s = self
            .seqs
            .get_mut(&seq)
            .ok_or(EngineError::UnknownSequence(seq))?;
        let n = cached.len();
        let mut pending = cached;
        pending.append(&mut s.pending);
        s.pending = pending;
        s.recompute += n;
        s.restoring = false;
        s.last_logits = None;
        Ok(())
    }

    /// Starts `seq`'s recompute from the blocks of its history still in the pool.
    /// At least one token is left to compute, whose logits the sequence needs next.
    pub(super) fn restore_from_cache(&mut self, seq: SeqId) -> Result<(), EngineError> {
        let s = &self.seqs[&seq];
        // Cached blocks can be adopted only into an empty table; a sequence whose
        // restore was cut short (a failure) computes on from what it holds.
        let empty = self.kv.capacity(seq)? == 0;
        let matched = if self.config.prefix_cache && empty {
            let history = s.pending[..s.recompute].to_vec();
            let mut matched = self.kv.adopt_cached_prefix(seq, &history)?;
            if matched > 0 && matched == s.pending.len() {
                self.kv.truncate(seq, matched - 1)?;
                matched -= 1;
            }
            matched
        } else {
            0
        };
        let s = self
            .seqs
            .get_mut(&seq)
            .ok_or(EngineError::UnknownSequence(seq))?;
        s.pending.drain(..matched);
        s.recompute -= matched;
        s.restoring = s.recompute > 0;
        Ok(())
    }

    /// Whether `seq` holds nothing a caller waits for right now: no generation, no
    /// prefill asked, no tokens to feed.
    fn is_idle(&self, seq: SeqId) -> bool {
        let s = &self.seqs[&seq];
        s.generating.is_none()
            && (!s.runnable || s.pending.is_empty())
            && !self.flushing.contains(&seq)
    }

    /// Whether preempting `seq` would give blocks back.
    fn frees_blocks(&self, seq: SeqId) -> bool {
        self.kv.exclusive_blocks(seq).is_ok_and(|n| n > 0)
    }

    /// Preempts an idle sequence (other than `except`) whose table holds blocks of
    /// its own. Returns whether one was found.
    ///
    /// Sequences with nothing pending go first (node snapshots, finished branches: a
    /// snapshot is used again only in the next round), then those paused with tokens
    /// pending (a branch waiting for its tool, needed again within moments); least
    /// recently used first within each.
    pub(super) fn preempt_idle(&mut self, except: SeqId) -> Result<bool, EngineError> {
        let victim = self
            .seqs
            .iter()
            .filter(|(&id, _)| id != except && self.is_idle(id) && self.frees_blocks(id))
            .min_by_key(|(&id, s)| (!s.pending.is_empty(), s.last_used, std::cmp::Reverse(id)))
            .map(|(&id, _)| id);
        match victim {
            Some(v) => {
                self.preempt(v)?;
                Ok(true)
            }
            None => Ok(false),
        }
    }

    /// Makes room for `target`'s next chunk by preempting idle sequences, then running
    /// ones youngest first. If even that is not enough, `target` cannot fit the pool
    /// (beside its pins) and is failed with [`EngineError::NeverFits`].
    pub(super) fn preempt_for(&mut self, target: SeqId) -> Result<(), EngineError> {
        if self.seqs[&target].awaits_restore() {
            self.restore_from_cache(target)?;
        }
        let n = self.seqs[&target]
            .pending
            .len()
            .min(self.config.max_batch_tokens.max(1));
        loop {
            match self.kv.reserve(target, n) {
                Ok(()) => return Ok(()),
                Err(crate::kv::KvError::OutOfBlocks { .. }) => {}
                Err(e) => return Err(e.into()),
            }
            if self.preempt_idle(target)? {
                continue;
            }
            // Any holder now, youngest first: blocks shared by two other sequences
            // come back only once both let go of them.
            let youngest = self
                .seqs
                .keys()
                .rev()
                .copied()
                .find(|&id| id != target && self.kv.capacity(id).is_ok_and(|c| c > 0));
            match youngest {
                Some(v) => self.preempt(v)?,
                None => {
                    self.fail_never_fits(target);
                    return Ok(());
                }
            }
        }
    }
}
