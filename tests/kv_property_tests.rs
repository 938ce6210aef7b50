//! Randomised operation sequences against the paged KV cache, checked against a plain
//! shadow model after every operation: refcounts equal the tables and pins that list
//! each block, every block is exactly one of in use / cached / free, every live
//! sequence and pin reads back exactly the KV its tokens imply, and a prefix-cache hit
//! holds the KV of the tokens it matched. At the end, with everything dropped and the
//! prefix cache cleared, every refcount is zero and every block is free.

mod common;

use std::collections::HashMap;

use common::rng::Rng;
use treegrpo::kv::{BlockId, KvCache, KvConfig, KvError, PinId, SeqId};
use treegrpo::model::KvStore;

const LAYERS: usize = 2;
const KV_DIM: usize = 8;
const VOCAB: u64 = 3;
const MAX_LEN: usize = 40;
const MAX_SEQS: usize = 8;

/// What a model would store at `position` given the tokens up to it: keys then values
/// of every layer, `2 * LAYERS * KV_DIM` floats. Depends on the whole prefix, as KV does.
fn kv_row(tokens: &[u32], position: usize) -> Vec<f32> {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &t in &tokens[..=position] {
        h = (h ^ u64::from(t) ^ 0x100).wrapping_mul(0x100_0000_01b3);
    }
    (0..2 * LAYERS * KV_DIM)
        .map(|j| {
            let x = (h ^ j as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
            (x >> 40) as f32 + position as f32 / 64.0
        })
        .collect()
}

fn key_of(row: &[f32], layer: usize) -> &[f32] {
    &row[layer * 2 * KV_DIM..][..KV_DIM]
}

fn value_of(row: &[f32], layer: usize) -> &[f32] {
    &row[layer * 2 * KV_DIM + KV_DIM..][..KV_DIM]
}

/// The shadow of one sequence or pin: its tokens and the rows read back must equal.
#[derive(Clone, Default)]
struct Shadow {
    tokens: Vec<u32>,
    rows: Vec<Vec<f32>>,
}

impl Shadow {
    fn from_tokens(tokens: &[u32]) -> Self {
        Shadow {
            tokens: tokens.to_vec(),
            rows: (0..tokens.len()).map(|p| kv_row(tokens, p)).collect(),
        }
    }

    fn truncate(&mut self, len: usize) {
        self.tokens.truncate(len);
        self.rows.truncate(len);
    }
}

struct World {
    cache: KvCache,
    seqs: HashMap<SeqId, Shadow>,
    pins: HashMap<PinId, Shadow>,
    stems: Vec<Vec<u32>>,
    out_of_blocks: usize,
    matched_tokens: usize,
}

impl World {
    fn seq_ids(&self) -> Vec<SeqId> {
        let mut v: Vec<SeqId> = self.seqs.keys().copied().collect();
        v.sort();
        v
    }

    fn pin_ids(&self) -> Vec<PinId> {
        let mut v: Vec<PinId> = self.pins.keys().copied().collect();
        v.sort();
        v
    }

    fn prompt(&self, rng: &mut Rng) -> Vec<u32> {
        let mut p = self.stems[rng.below(self.stems.len())].clone();
        let extra = rng.below(12);
        p.extend(rng.tokens(extra, VOCAB as usize));
        p
    }

    /// One engine step for `seq`: reserve (usually), the forward's writes layer by
    /// layer, commit. A failed step is rolled back with `truncate(seq, len)`.
    fn extend(&mut self, rng: &mut Rng, seq: SeqId, tokens: &[u32]) {
        let c = &mut self.cache;
        let len = c.seq_len(seq).unwrap();
        let fits = c.capacity(seq).unwrap() >= len + tokens.len();
        if !fits || rng.below(5) != 0 {
            let before = (c.stats(), c.table(seq).unwrap().clone());
            match c.reserve(seq, tokens.len()) {
                Ok(()) => {}
                Err(KvError::OutOfBlocks { .. }) => {
                    assert_eq!(
                        (c.stats(), c.table(seq).unwrap().clone()),
                        before,
                        "a failed reserve changed state"
                    );
                    self.out_of_blocks += 1;
                    return;
                }
                Err(e) => panic!("reserve: {e}"),
            }
        }
        let mut all = self.seqs[&seq].tokens.clone();
        all.extend_from_slice(tokens);
        let rows: Vec<Vec<f32>> = (len..all.len()).map(|p| kv_row(&all, p)).collect();
        for layer in 0..LAYERS {
            for (i, row) in rows.iter().enumerate() {
                let stored = c.store(
                    layer,
                    seq.slot(),
                    len + i,
                    key_of(row, layer),
                    value_of(row, layer),
                );
                if let Err(e) = stored {
                    // Only the copy-on-write fallback of an unreserved write can fail,
                    // and only for want of blocks: the store's error carries the
                    // cache's `KvError` as its source.
                    let cause = match &e {
                        treegrpo::model::ModelError::KvStore(source) => {
                            source.downcast_ref::<treegrpo::kv::KvError>()
                        }
                        _ => None,
                    };
                    assert!(
                        matches!(cause, Some(treegrpo::kv::KvError::OutOfBlocks { .. })),
                        "{e:?}"
                    );
                    self.out_of_blocks += 1;
                    c.truncate(seq, len).unwrap();
                    return;
                }
            }
        }
        c.commit(seq, tokens).unwrap();
        let sh = self.seqs.get_mut(&seq).unwrap();
        sh.tokens = all;
        sh.rows.extend(rows);
    }

    fn step(&mut self, rng: &mut Rng) {
        let seqs = self.seq_ids();
        let pins = self.pin_ids();
        let mut roll = rng.below(100);
        // Under pressure, release more often, so the pool runs out now and then rather
        // than all the time (an engine would make the work wait meanwhile).
        if self.cache.available_blocks() * 10 < self.cache.num_blocks() && rng.below(3) == 0 {
            roll = if rng.below(3) == 0 { 81 } else { 87 };
        }
        match roll {
            0..=4 if seqs.len() < MAX_SEQS => {
                let s = self.cache.new_sequence();
                self.seqs.insert(s, Shadow::default());
            }
            5..=14 if seqs.len() < MAX_SEQS => {
                let prompt = self.prompt(rng);
                let (s, cached) = self.cache.start_sequence(&prompt);
                let (_, matched) = self.cache.match_prefix(&prompt);
                assert!(cached <= matched && matched <= prompt.len());
                assert!(cached == matched || (cached + 1 == matched && matched == prompt.len()));
                assert!(prompt.is_empty() || cached < prompt.len());
                self.matched_tokens += cached;
                self.seqs.insert(s, Shadow::from_tokens(&prompt[..cached]));
                self.extend(rng, s, &prompt[cached..]);
            }
            15..=26 if seqs.len() < MAX_SEQS => {
                if let Some(s) = rng.pick(&seqs) {
                    let f = self.cache.fork(s).unwrap();
                    assert_eq!(self.cache.table(f).unwrap().len, self.seqs[&s].tokens.len());
                    self.seqs.insert(f, self.seqs[&s].clone());
                }
            }
            27..=32 if seqs.len() < MAX_SEQS => {
                if let Some(p) = rng.pick(&pins) {
                    let f = self.cache.fork_pin(p).unwrap();
                    self.seqs.insert(f, self.pins[&p].clone());
                }
            }
            33..=64 => {
                if let Some(s) = rng.pick(&seqs) {
                    let n = 1 + rng.below(6);
                    if self.seqs[&s].tokens.len() + n > MAX_LEN {
                        let len = rng.below(MAX_LEN / 2);
                        self.cache.truncate(s, len).unwrap();
                        self.seqs.get_mut(&s).unwrap().truncate(len);
                    } else {
                        let tokens = rng.tokens(n, VOCAB as usize);
                        self.extend(rng, s, &tokens);
                    }
                }
            }
            65..=72 => {
                if let Some(s) = rng.pick(&seqs) {
                    let len = rng.below(self.seqs[&s].tokens.len() + 1);
                    self.cache.truncate(s, len).unwrap();
                    self.seqs.get_mut(&s).unwrap().truncate(len);
                }
            }
            73..=80 => {
                if let Some(s) = rng.pick(&seqs) {
                    let mut sh = self.seqs[&s].clone();
                    let p = if rng.below(2) == 0 {
                        self.cache.pin(s).unwrap()
                    } else {
                        let len = rng.below(sh.tokens.len() + 1);
                        sh.truncate(len);
                        self.cache.pin_prefix(s, len).unwrap()
                    };
                    assert_eq!(self.cache.pin_len(p).unwrap(), sh.tokens.len());
                    self.pins.insert(p, sh);
                }
            }
            81..=86 => {
                if let Some(p) = rng.pick(&pins) {
                    self.cache.unpin(p).unwrap();
                    self.pins.remove(&p);
                    assert!(self.cache.unpin(p).is_err());
                }
            }
            87..=94 => {
                if let Some(s) = rng.pick(&seqs) {
                    self.cache.free(s).unwrap();
                    self.seqs.remove(&s);
                    assert!(self.cache.free(s).is_err());
                }
            }
            95..=98 => {
                // A lookup only: the blocks it names must hold the KV of these tokens.
                let prompt = self.prompt(rng);
                let (blocks, n) = self.cache.match_prefix(&prompt);
                let bs = self.cache.block_size();
                assert_eq!(n, blocks.len() * bs);
                for (i, &b) in blocks.iter().enumerate() {
                    for r in 0..bs {
                        let want = kv_row(&prompt, i * bs + r);
                        check_block_row(&self.cache, b, r, &want, "prefix hit");
                    }
                }
            }
            99 => self.cache.clear_prefix_cache(),
            _ => {}
        }
    }

    /// Everything the shadow model says must hold, checked from the public API.
    fn check(&self) {
        let c = &self.cache;
        c.check_invariants().unwrap();
        let n = c.num_blocks();
        let mut refs = vec![0u32; n];
        let mut pinned = vec![false; n];
        for s in c.sequence_ids() {
            for b in &c.table(s).unwrap().blocks {
                refs[b.index()] += 1;
            }
        }
        for p in c.pin_ids() {
            for b in &c.pin_table(p).unwrap().blocks {
                refs[b.index()] += 1;
                pinned[b.index()] = true;
            }
        }
        assert_eq!(c.references(), refs, "references != tables + pins");
        // The pool counts holders (a shared segment once): zero for the same blocks.
        for (b, (&holders, &tables)) in c.pool().refcounts().iter().zip(&refs).enumerate() {
            assert_eq!(holders == 0, tables == 0, "block {b}");
        }
        let cached = c.cached_block_ids();
        for b in cached.iter().chain(c.pool().free_blocks()) {
            assert_eq!(refs[b.index()], 0, "{b} is cached or free but referenced");
            assert!(!pinned[b.index()], "pinned {b} is evictable");
        }
        let in_use = refs.iter().filter(|&&r| r > 0).count();
        let st = c.stats();
        assert_eq!(st.in_use, in_use);
        assert_eq!(st.pinned, pinned.iter().filter(|&&p| p).count());
        assert_eq!(st.in_use + st.cached + st.free, n);
        assert_eq!(st.cached, cached.len());

        let mut live: Vec<SeqId> = c.sequence_ids();
        live.sort();
        assert_eq!(live, self.seq_ids());
        for (&s, sh) in &self.seqs {
            assert_eq!(c.tokens(s).unwrap(), &sh.tokens[..]);
            let len = sh.rows.len();
            for layer in 0..LAYERS {
                let chunks = c.chunks(layer, s.slot(), len).into_f32().unwrap();
                let bs = c.block_size();
                assert_eq!(chunks.len(), len.div_ceil(bs));
                for (p, want) in sh.rows.iter().enumerate() {
                    let ch = chunks[p / bs];
                    let at = (p % bs) * KV_DIM;
                    assert_eq!(&ch.keys[at..at + KV_DIM], key_of(want, layer), "{s} @{p}");
                    assert_eq!(
                        &ch.values[at..at + KV_DIM],
                        value_of(want, layer),
                        "{s} @{p}"
                    );
                }
            }
        }
        assert_eq!(c.pin_ids(), self.pin_ids());
        for (&p, sh) in &self.pins {
            assert_eq!(c.pin_tokens(p).unwrap(), &sh.tokens[..]);
            let table = c.pin_table(p).unwrap();
            let bs = c.block_size();
            for (pos, want) in sh.rows.iter().enumerate() {
                check_block_row(c, table.blocks[pos / bs], pos % bs, want, "pin");
            }
        }
    }
}

fn check_block_row(c: &KvCache, b: BlockId, r: usize, want: &[f32], what: &str) {
    for layer in 0..LAYERS {
        let k = &c.storage().keys(layer, b)[r * KV_DIM..][..KV_DIM];
        let v = &c.storage().values(layer, b)[r * KV_DIM..][..KV_DIM];
        assert_eq!(k, key_of(want, layer), "{what}: {b} row {r} layer {layer}");
        assert_eq!(
            v,
            value_of(want, layer),
            "{what}: {b} row {r} layer {layer}"
        );
    }
}

/// Runs `ops` random operations on a pool of `blocks` blocks of `block_size` rows.
fn run(seed: u64, block_size: usize, blocks: usize, ops: usize) {
    let mut rng = Rng::new(seed);
    let bytes_per_block = 2 * LAYERS * block_size * KV_DIM * 4;
    let cache = KvCache::new(
        KvConfig {
            block_size,
            budget_bytes: bytes_per_block * blocks,
            format: treegrpo::model::KvFormat::F32,
        },
        LAYERS,
        KV_DIM,
    )
    .unwrap();
    let stems = (0..4)
        .map(|i| {
            let n = i * block_size + rng.below(block_size);
            rng.tokens(n, VOCAB as usize)
        })
        .collect();
    let mut w = World {
        cache,
        seqs: HashMap::new(),
        pins: HashMap::new(),
        stems,
        out_of_blocks: 0,
        matched_tokens: 0,
    };
    for op in 0..ops {
        w.step(&mut rng);
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| w.check()))
            .unwrap_or_else(|e| panic!("seed {seed}, op {op}: check failed: {e:?}"));
    }
    let st = w.cache.stats();
    eprintln!(
        "seed {seed} bs {block_size}: {} OutOfBlocks, {} tokens from cache, {} copies, {} evictions",
        w.out_of_blocks, w.matched_tokens, st.cow_copies, st.evictions
    );
    assert!(
        w.out_of_blocks > 0,
        "the pool never ran out: too big to test eviction"
    );
    assert!(
        w.out_of_blocks < ops / 5,
        "the pool ran out too often to test much else"
    );
    assert!(w.matched_tokens > 0, "no prefix was ever reused");
    assert!(st.evictions > 0, "nothing was ever evicted");
    assert!(
        block_size == 1 || st.cow_copies > 0,
        "nothing was ever copied on write"
    );

    // Drop everything: all refcounts return to zero; clearing frees every block.
    for s in w.seq_ids() {
        w.cache.free(s).unwrap();
        w.seqs.remove(&s);
        w.check();
    }
    for p in w.pin_ids() {
        w.cache.unpin(p).unwrap();
        w.pins.remove(&p);
        w.check();
    }
    assert!(w.cache.pool().refcounts().iter().all(|&r| r == 0));
    assert_eq!(w.cache.blocks_in_use(), 0);
    assert_eq!(w.cache.pinned_blocks(), 0);
    w.cache.clear_prefix_cache();
    assert_eq!(w.cache.cached_blocks(), 0);
    assert_eq!(w.cache.free_blocks(), w.cache.num_blocks());
    w.cache.check_invariants().unwrap();
}

#[test]
fn random_operations_keep_refcounts_and_data_right_block_size_4() {
    for seed in 1..=4 {
        run(seed, 4, 48, 3000);
    }
}

#[test]
fn random_operations_keep_refcounts_and_data_right_block_size_16() {
    for seed in 11..=13 {
        run(seed, 16, 14, 3000);
    }
}

#[test]
fn random_operations_keep_refcounts_and_data_right_block_size_1() {
    run(21, 1, 160, 2000);
}
