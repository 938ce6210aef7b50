//! Pins (a prefix kept resident for later branches, whatever happens to the
//! sequence it came from) and clearing the prefix cache.

use super::KvCache;
use crate::kv::{KvError, PinId, SeqId};

impl KvCache {
    // ----- pins ---------------------------------------------------------------------

    /// Pins `seq`'s current valid positions: their blocks stay referenced (never freed,
    /// never evicted) until [`unpin`](Self::unpin), whatever happens to `seq`.
    pub fn pin(&mut self, seq: SeqId) -> Result<PinId, KvError> {
        let len = self.seq_len(seq)?;
        self.pin_prefix(seq, len)
    }

    /// Pins the first `len` positions of `seq`.
    pub fn pin_prefix(&mut self, seq: SeqId, len: usize) -> Result<PinId, KvError> {
        let bs = self.block_size();
        let st = self
            .seqs
            .get_mut(&seq)
            .ok_or(KvError::UnknownSequence(seq))?;
        if len > st.len {
            return Err(KvError::BeyondLength {
                seq,
                len: st.len,
                requested: len,
            });
        }
        st.freeze(&mut self.segments, bs);
        let st = st.clone();
        let state = self.prefix_of(&st, len);
        let id = PinId::new(self.next_pin);
        self.next_pin += 1;
        self.pins.insert(id, state);
        Ok(id)
    }

    /// Releases a pin's references.
    pub fn unpin(&mut self, pin: PinId) -> Result<(), KvError> {
        let st = self.pins.remove(&pin).ok_or(KvError::UnknownPin(pin))?;
        self.release_prefix(st);
        Ok(())
    }

    /// A new sequence holding the pinned prefix (shared, as [`fork`](Self::fork)).
    pub fn fork_pin(&mut self, pin: PinId) -> Result<SeqId, KvError> {
        let bs = self.block_size();
        let st = self.pins.get_mut(&pin).ok_or(KvError::UnknownPin(pin))?;
        st.freeze(&mut self.segments, bs);
        let st = st.clone();
        let child = self.share(&st);
        Ok(self.insert_seq(child))
    }

    /// Valid positions of a pin.
    pub fn pin_len(&self, pin: PinId) -> Result<usize, KvError> {
        Ok(self.pin_state(pin)?.len)
    }

    // ----- prefix cache -------------------------------------------------------------

    /// Forgets every prefix-index entry and frees every cached block. Call it after a
    /// weight update: cached KV is stale. Live sequences and pins keep their blocks, but
    /// nothing computed before the call is ever matched again, and blocks such
    /// sequences fill later (mixing old and new KV) are not indexed either.
    pub fn clear_prefix_cache(&mut self) {
        self.pool.clear_cache();
        self.epoch += 1;
    }

    /// Whether a new block evicts a cached one before the pool writes memory it never
    /// wrote ([`BlockPool::set_reuse_cached_first`](crate::kv::pool::BlockPool::set_reuse_cached_first)).
    pub fn set_reuse_cached_first(&mut self, on: bool) {
        self.pool.set_reuse_cached_first(on);
    }
}
