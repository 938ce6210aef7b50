//! The cache's self-check, run by the property tests after every operation.

use std::collections::HashMap;

use super::KvCache;
use crate::kv::segment::SegmentId;

impl KvCache {
    // ----- self-check ---------------------------------------------------------------

    /// Checks the layer's invariants; `Err` names the first one broken. O(blocks).
    ///
    /// - every block's refcount equals its holders: the live segments listing it plus
    ///   the tables and pins listing it in their own part;
    /// - every segment's refcount equals the tables, pins and segments ending on it;
    ///   segments chain without gaps and hold whole blocks of tokens and hashes;
    /// - every block is exactly one of: in use (refcount > 0), cached, free;
    /// - cached blocks are indexed; pinned blocks are in use (so never evicted);
    /// - every table's length fits its blocks and matches its token history.
    pub fn check_invariants(&self) -> Result<(), String> {
        let n = self.num_blocks();
        let bs = self.block_size();
        let mut refs = vec![0u32; n];
        let mut seg_refs: HashMap<SegmentId, u32> = HashMap::new();
        for (id, seg) in self.segments.iter() {
            if seg.blocks.is_empty()
                || seg.tokens.len() != seg.blocks.len() * bs
                || seg.hashes.len() != seg.blocks.len()
            {
                return Err(format!("segment {id:?}: sizes out of step"));
            }
            let parent_end = seg.parent.map_or(0, |p| self.segments.get(p).end_block());
            if seg.start_block != parent_end {
                return Err(format!("segment {id:?}: starts at {}", seg.start_block));
            }
            if let Some(p) = seg.parent {
                *seg_refs.entry(p).or_default() += 1;
            }
            for b in &seg.blocks {
                refs[b.index()] += 1;
            }
        }
        for (what, st) in self
            .seqs
            .iter()
            .map(|(id, st)| (id.to_string(), st))
            .chain(self.pins.iter().map(|(id, st)| (id.to_string(), st)))
        {
            let frozen_end = st.frozen.map_or(0, |f| self.segments.get(f).end_block());
            if st.frozen_blocks != frozen_end {
                return Err(format!("{what}: frozen blocks out of step"));
            }
            if let Some(f) = st.frozen {
                *seg_refs.entry(f).or_default() += 1;
            }
            if st.len > st.capacity(bs) || st.len < st.frozen_blocks * bs {
                return Err(format!("{what}: length {} past its blocks", st.len));
            }
            if st.tokens.len() != st.len - st.frozen_blocks * bs
                || st.hashes.len() != st.len / bs - st.frozen_blocks
            {
                return Err(format!("{what}: token history out of step"));
            }
            for b in &st.blocks {
                refs[b.index()] += 1;
            }
        }
        for (id, seg) in self.segments.iter() {
            let expected = seg_refs.get(&id).copied().unwrap_or(0);
            if seg.refs != expected {
                return Err(format!(
                    "segment {id:?}: refcount {} but {expected} references",
                    seg.refs
                ));
            }
        }
        self.pool.check_states(&refs)
    }
}
