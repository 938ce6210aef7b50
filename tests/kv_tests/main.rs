//! The paged KV cache (`treegrpo::kv`) on small synthetic shapes, no model needed:
//! fork without copying, copy-on-write of the partly filled last block, prefix reuse,
//! pool exhaustion and eviction order, and the memory of a tree. One test binary:
//! `forks.rs` (forks, copy-on-write, reservations), `sharing.rs` (prefix reuse,
//! eviction, pins, a tree's memory, truncation, pool sizing), `touch.rs` (pages written
//! ahead of use); the helpers below serve them.

mod forks;
mod sharing;
mod touch;

use treegrpo::kv::{BlockId, KvCache, KvConfig, KvError, SeqId, DEFAULT_BLOCK_SIZE};
use treegrpo::model::{KvSlot, KvStore, ModelError};

const LAYERS: usize = 2;
const KV_DIM: usize = 8;

/// A cache of `blocks` blocks of `block_size` rows.
fn cache(block_size: usize, blocks: usize) -> KvCache {
    let bytes = 2 * LAYERS * block_size * KV_DIM * 4;
    let c = KvCache::new(
        KvConfig {
            block_size,
            budget_bytes: bytes * blocks + bytes / 2,
            format: treegrpo::model::KvFormat::F32,
        },
        LAYERS,
        KV_DIM,
    )
    .unwrap();
    assert_eq!(c.num_blocks(), blocks);
    assert_eq!(c.bytes_per_block(), bytes);
    c
}

/// The key (`which = 0`) or value (`1`) row a fake model would compute for `token` at
/// `position` in `layer`; `tag` tells writers apart.
fn row(tag: u32, token: u32, layer: usize, position: usize, which: usize) -> Vec<f32> {
    (0..KV_DIM)
        .map(|j| {
            (tag * 100_000 + token * 1000) as f32
                + (layer * 100 + position) as f32
                + (which * KV_DIM + j) as f32 / 100.0
        })
        .collect()
}

/// Stores `tokens` at `seq`'s next positions the way a forward does (layer by layer)
/// without reserving first.
fn write(c: &mut KvCache, seq: SeqId, tokens: &[u32], tag: u32) -> Result<(), ModelError> {
    let start = c.seq_len(seq).unwrap();
    for layer in 0..LAYERS {
        for (i, &t) in tokens.iter().enumerate() {
            let p = start + i;
            c.store(
                layer,
                seq.slot(),
                p,
                &row(tag, t, layer, p, 0),
                &row(tag, t, layer, p, 1),
            )?;
        }
    }
    Ok(())
}

/// reserve + store + commit: what the engine does for one step.
fn extend(c: &mut KvCache, seq: SeqId, tokens: &[u32], tag: u32) {
    c.reserve(seq, tokens.len()).unwrap();
    write(c, seq, tokens, tag).unwrap();
    c.commit(seq, tokens).unwrap();
    c.check_invariants().unwrap();
}

/// Key and value of `position` as attention sees them (through `KvStore::chunks`).
fn read(c: &KvCache, seq: SeqId, layer: usize, position: usize) -> (Vec<f32>, Vec<f32>) {
    let chunks = c
        .chunks(layer, seq.slot(), position + 1)
        .into_f32()
        .unwrap();
    let bs = c.block_size();
    assert_eq!(chunks.len(), position / bs + 1);
    for ch in &chunks {
        assert_eq!(ch.keys.len(), bs * KV_DIM, "one whole block per chunk");
    }
    let ch = chunks[position / bs];
    let at = (position % bs) * KV_DIM;
    (
        ch.keys[at..at + KV_DIM].to_vec(),
        ch.values[at..at + KV_DIM].to_vec(),
    )
}

fn assert_row(c: &KvCache, seq: SeqId, position: usize, tag: u32, token: u32) {
    for layer in 0..LAYERS {
        let (k, v) = read(c, seq, layer, position);
        assert_eq!(
            k,
            row(tag, token, layer, position, 0),
            "{seq} key @{position}"
        );
        assert_eq!(
            v,
            row(tag, token, layer, position, 1),
            "{seq} value @{position}"
        );
    }
}

/// How many tables and pins list `b` (shared segments count once per table).
fn rc(c: &KvCache, b: BlockId) -> u32 {
    c.references()[b.index()]
}

fn toks(range: std::ops::Range<u32>) -> Vec<u32> {
    range.collect()
}
