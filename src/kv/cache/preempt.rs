//! What the engine's preemption needs from the cache: how many blocks dropping a
//! sequence's table would give back, dropping the table while the sequence lives on,
//! and adopting the cached blocks of a prefix into an empty sequence so that a
//! recompute (or a new prompt) starts from whatever KV is still in the pool.

use super::{KvCache, TableState};
use crate::kv::{KvError, SeqId};
use crate::model::TokenId;

impl KvCache {
    /// Blocks that would leave use (to the free list, or to the prefix cache where they
    /// stay matchable) if `seq` dropped its table: the own blocks it alone holds, and
    /// the blocks of the frozen segments that only its chain keeps alive. Blocks it
    /// shares with another table or pin are not counted. O(segments on its chain).
    pub fn exclusive_blocks(&self, seq: SeqId) -> Result<usize, KvError> {
        let st = self.seq(seq)?;
        let sole = |b: &&crate::kv::BlockId| self.pool.refcount(**b) == 1;
        let mut n = st.blocks.iter().filter(sole).count();
        let mut at = st.frozen;
        while let Some(id) = at {
            let seg = self.segments.get(id);
            // A segment referenced once is kept alive by this chain alone (its other
            // references would be tables, pins or child segments).
            if seg.refs != 1 {
                break;
            }
            n += seg.blocks.iter().filter(sole).count();
            at = seg.parent;
        }
        Ok(n)
    }

    /// Releases every block of `seq` and leaves it empty (length 0) under the same id:
    /// the engine preempts a sequence this way and recomputes it later. Full blocks
    /// nobody else holds stay in the prefix cache, so the recompute finds them unless
    /// they were evicted meanwhile.
    pub fn reset(&mut self, seq: SeqId) -> Result<(), KvError> {
        let empty = TableState::empty(self.epoch);
        let st = self
            .seqs
            .get_mut(&seq)
            .ok_or(KvError::UnknownSequence(seq))?;
        let old = std::mem::replace(st, empty);
        self.release_prefix(old);
        Ok(())
    }

    /// Gives the empty sequence `seq` the longest run of indexed full blocks (in use by
    /// other tables, or cached) that holds a prefix of `tokens`, one reference each and
    /// no data copied. Returns how many tokens they cover (a multiple of the block
    /// size); the caller computes `tokens[matched..]`.
    pub fn adopt_cached_prefix(
        &mut self,
        seq: SeqId,
        tokens: &[TokenId],
    ) -> Result<usize, KvError> {
        let st = self.seq(seq)?;
        if st.len > 0 || !st.blocks.is_empty() || st.frozen.is_some() {
            return Err(KvError::NotEmpty(seq));
        }
        let (blocks, hashes) = self.pool.lookup(tokens);
        for &b in &blocks {
            self.pool.retain(b);
        }
        let matched = blocks.len() * self.block_size();
        let st = self
            .seqs
            .get_mut(&seq)
            .ok_or(KvError::UnknownSequence(seq))?;
        st.blocks = blocks;
        st.tokens = tokens[..matched].to_vec();
        st.hashes = hashes;
        st.len = matched;
        Ok(matched)
    }
}
