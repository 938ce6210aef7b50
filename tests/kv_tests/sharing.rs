//! Prefix reuse across sequences, pool exhaustion and eviction order, pins, the
//! memory of a tree, truncation, pool sizing and frozen segments.

use super::*;

#[test]
fn sequences_from_the_same_prompt_share_its_full_blocks() {
    const M: usize = 4;
    let mut c = cache(16, 64);
    let prompt = toks(100..140);
    let (first, cached) = c.start_sequence(&prompt);
    assert_eq!(cached, 0, "nothing cached yet");
    extend(&mut c, first, &prompt, 1);
    assert_eq!(c.blocks_in_use(), 3);
    let (blocks, n) = c.match_prefix(&prompt);
    assert_eq!(n, 32);
    assert_eq!(blocks, c.table(first).unwrap().blocks[..2]);

    let mut seqs = vec![first];
    for _ in 1..M {
        let (s, cached) = c.start_sequence(&prompt);
        assert_eq!(cached, 32, "the two full blocks come from the cache");
        assert_eq!(c.seq_len(s).unwrap(), 32);
        extend(&mut c, s, &prompt[cached..], 1);
        seqs.push(s);
    }
    // 2 shared full blocks + one partial block per sequence, not 3 per sequence.
    assert_eq!(c.blocks_in_use(), 2 + M);
    for &b in &blocks {
        assert_eq!(rc(&c, b), M as u32);
    }
    for &s in &seqs {
        assert_eq!(c.table(s).unwrap().blocks[..2], blocks[..]);
        for (p, &t) in prompt.iter().enumerate() {
            assert_row(&c, s, p, 1, t);
        }
    }

    // A prompt that differs from token 20 on shares only the first full block.
    let mut other = prompt.clone();
    for t in &mut other[20..] {
        *t += 1000;
    }
    assert_eq!(c.match_prefix(&other).1, 16);
    let (o, cached) = c.start_sequence(&other);
    assert_eq!(cached, 16);
    extend(&mut c, o, &other[16..], 2);
    assert_eq!(c.table(o).unwrap().blocks[0], blocks[0]);
    assert_ne!(c.table(o).unwrap().blocks[1], blocks[1]);
    assert_eq!(c.blocks_in_use(), 2 + M + 2);
    assert_eq!(rc(&c, blocks[0]), M as u32 + 1);
    c.check_invariants().unwrap();

    // Freed, the full blocks stay cached and are found again.
    for s in seqs.into_iter().chain([o]) {
        c.free(s).unwrap();
    }
    assert_eq!(c.blocks_in_use(), 0);
    assert_eq!(
        c.cached_blocks(),
        3,
        "the prompt's 2 full blocks + the other's 2nd"
    );
    let (again, cached) = c.start_sequence(&prompt);
    assert_eq!(cached, 32);
    assert_eq!(c.table(again).unwrap().blocks[..2], blocks[..]);
    assert_eq!(c.cached_blocks(), 1);
    c.free(again).unwrap();

    // After a weight update nothing is reused.
    c.clear_prefix_cache();
    assert_eq!(c.cached_blocks(), 0);
    assert_eq!(c.free_blocks(), c.num_blocks());
    assert_eq!(c.match_prefix(&prompt).1, 0);
    assert_eq!(c.start_sequence(&prompt).1, 0);
}

#[test]
fn a_fully_cached_prompt_leaves_its_last_token_to_compute() {
    let mut c = cache(16, 16);
    let prompt = toks(0..32);
    let (s, _) = c.start_sequence(&prompt);
    extend(&mut c, s, &prompt, 1);
    let (t, cached) = c.start_sequence(&prompt);
    assert_eq!(
        cached, 31,
        "one token left so the forward yields its logits"
    );
    assert_eq!(c.tokens(t).unwrap(), &prompt[..31]);
    extend(&mut c, t, &prompt[31..], 1);
    assert_eq!(c.stats().cow_copies, 1, "the shared last block was copied");
    for (p, &tok) in prompt.iter().enumerate() {
        assert_row(&c, t, p, 1, tok);
    }
    assert_eq!(c.blocks_in_use(), 3);
}

#[test]
fn out_of_blocks_is_an_error_and_changes_nothing() {
    let mut c = cache(4, 6);
    let a = c.new_sequence();
    extend(&mut c, a, &toks(0..22), 1);
    assert_eq!(c.blocks_in_use(), 6);
    let before = (c.stats(), c.table(a).unwrap().clone());
    let err = c.reserve(a, 3).unwrap_err();
    assert_eq!(
        err,
        KvError::OutOfBlocks {
            needed: 1,
            available: 0,
            total: 6
        }
    );
    assert_eq!((c.stats(), c.table(a).unwrap().clone()), before);
    c.reserve(a, 2).expect("fits the last block");
    let b = c.new_sequence();
    assert!(matches!(c.reserve(b, 1), Err(KvError::OutOfBlocks { .. })));
    // A fork that must copy its shared partial block cannot write either; no panic.
    let f = c.fork(a).unwrap();
    assert!(c.reserve(f, 1).is_err());
    assert!(write(&mut c, f, &[9], 2).is_err());
    c.check_invariants().unwrap();
    c.free(f).unwrap();
    c.free(a).unwrap();
    assert_eq!(c.cached_blocks(), 5, "the five full blocks stay cached");
    assert_eq!(c.free_blocks(), 1);
    c.reserve(b, 24)
        .expect("cached blocks are evicted to make room");
    assert_eq!(c.stats().evictions, 5);
    c.check_invariants().unwrap();
}

#[test]
fn cached_blocks_are_evicted_least_recently_released_first() {
    let mut c = cache(4, 6);
    let prompts = [toks(0..8), toks(10..18), toks(20..28)];
    let mut seqs = Vec::new();
    for p in &prompts {
        let s = c.new_sequence();
        extend(&mut c, s, p, 1);
        seqs.push(s);
    }
    for s in seqs {
        c.free(s).unwrap();
    }
    assert_eq!(c.cached_blocks(), 6);
    let matched =
        |c: &KvCache| -> Vec<usize> { prompts.iter().map(|p| c.match_prefix(p).1).collect() };
    assert_eq!(matched(&c), [8, 8, 8]);

    // Reusing a cached chain refreshes it: the first prompt's blocks go back to the
    // cache as the most recently released.
    let (r, cached) = c.start_sequence(&toks(0..9));
    assert_eq!(cached, 8);
    assert_eq!(c.cached_blocks(), 4);
    c.free(r).unwrap();

    let n = c.new_sequence();
    c.reserve(n, 4).unwrap();
    assert_eq!(
        matched(&c),
        [8, 4, 8],
        "second prompt's last block went first"
    );
    c.reserve(n, 8).unwrap();
    assert_eq!(matched(&c), [8, 0, 8]);
    c.reserve(n, 12).unwrap();
    assert_eq!(matched(&c), [8, 0, 4]);
    c.reserve(n, 16).unwrap();
    assert_eq!(matched(&c), [8, 0, 0]);
    assert_eq!(c.stats().evictions, 4);
    c.check_invariants().unwrap();
}

#[test]
fn pinned_blocks_are_never_evicted() {
    let mut c = cache(4, 6);
    let root = c.new_sequence();
    let prompt = toks(0..10);
    extend(&mut c, root, &prompt, 1);
    let pin = c.pin(root).unwrap();
    let pinned = c.pin_table(pin).unwrap().blocks.clone();
    assert_eq!(pinned.len(), 3);
    c.free(root).unwrap();
    assert_eq!(c.pinned_blocks(), 3);
    assert_eq!(
        c.blocks_in_use(),
        3,
        "the pin keeps them in use, not cached"
    );
    assert_eq!(c.cached_blocks(), 0);

    let other = c.new_sequence();
    c.reserve(other, 12).unwrap();
    let err = c.reserve(other, 13).unwrap_err();
    assert!(
        matches!(err, KvError::OutOfBlocks { available: 0, .. }),
        "{err}"
    );
    c.check_invariants().unwrap();

    // A branch from the pin still sees the prefix intact.
    let branch = c.fork_pin(pin).unwrap();
    assert_eq!(c.table(branch).unwrap().blocks, pinned);
    for (p, &t) in prompt.iter().enumerate() {
        assert_row(&c, branch, p, 1, t);
    }
    c.free(branch).unwrap();

    // Unpinned, the full blocks become cached and evictable.
    c.unpin(pin).unwrap();
    assert_eq!(c.pinned_blocks(), 0);
    assert_eq!(c.cached_blocks(), 2);
    assert_eq!(c.free_blocks(), 1);
    c.free(other).unwrap();
    let n = c.new_sequence();
    c.reserve(n, 24).expect("everything is reclaimable now");
    assert!(matches!(c.unpin(pin), Err(KvError::UnknownPin(_))));
    c.check_invariants().unwrap();
}

#[test]
fn a_tree_uses_its_unique_tokens_rounded_up_per_table() {
    let mut c = cache(16, 64);
    assert_eq!(c.bytes_per_token(), 2 * LAYERS * KV_DIM * 4);
    assert_eq!(c.bytes_per_block(), 16 * c.bytes_per_token());
    let root = c.new_sequence();
    extend(&mut c, root, &toks(0..37), 1);
    let pin = c.pin(root).unwrap();
    let branches: Vec<SeqId> = (0..3).map(|_| c.fork(root).unwrap()).collect();
    assert_eq!(c.blocks_in_use(), 3, "forking costs no blocks");
    for (i, &b) in branches.iter().enumerate() {
        let tokens = toks(1000 * (i as u32 + 1)..1000 * (i as u32 + 1) + 20);
        extend(&mut c, b, &tokens, 2 + i as u32);
    }
    c.free(root).unwrap();

    // root: ceil(37/16) = 3 blocks; each branch (57 tokens): ceil(57/16) = 4 blocks of
    // which floor(37/16) = 2 are shared with the root.
    let expected = c.blocks_for_tokens(37) + 3 * (c.blocks_for_tokens(57) - c.shared_blocks(37));
    assert_eq!(expected, 9);
    assert_eq!(c.blocks_in_use(), expected);
    assert_eq!(c.bytes_in_use(), expected * c.bytes_per_block());
    assert_eq!(
        c.stats().cow_copies,
        3,
        "one partial block copied per branch"
    );
    // Unique tokens: 37 + 3 * 20 = 97; the blocks exceed them by less than one block
    // per table (root + 3 branches).
    let unique = c.unique_tokens_bytes(97);
    assert!(c.bytes_in_use() >= unique);
    assert!(c.bytes_in_use() < unique + 4 * c.bytes_per_block());
    // Without sharing, 4 tables would take 3 + 3 * 4 = 15 blocks.
    assert!(c.blocks_in_use() < 15);
    for (i, &b) in branches.iter().enumerate() {
        for p in 0..37 {
            assert_row(&c, b, p, 1, p as u32);
        }
        assert_row(&c, b, 37, 2 + i as u32, 1000 * (i as u32 + 1));
    }

    for b in branches {
        c.free(b).unwrap();
    }
    c.unpin(pin).unwrap();
    assert_eq!(c.blocks_in_use(), 0);
    assert!(c.pool().refcounts().iter().all(|&r| r == 0));
    c.clear_prefix_cache();
    assert_eq!(c.free_blocks(), c.num_blocks());
    c.check_invariants().unwrap();
}

#[test]
fn truncate_rewinds_and_rewrites_without_touching_cached_blocks() {
    let mut c = cache(4, 16);
    let s = c.new_sequence();
    extend(&mut c, s, &toks(0..8), 1);
    let full = c.table(s).unwrap().blocks[1];
    assert!(c.is_indexed(full));
    // Rewind into the indexed block and write different tokens: the block is copied,
    // so the cache still holds the original KV for the original tokens.
    c.truncate(s, 6).unwrap();
    extend(&mut c, s, &[90, 91], 2);
    assert_ne!(c.table(s).unwrap().blocks[1], full);
    assert!(c.is_cached(full));
    let (blocks, n) = c.match_prefix(&toks(0..8));
    assert_eq!((blocks[1], n), (full, 8));
    let t = c.start_sequence(&toks(0..9)).0;
    for p in 0..8 {
        assert_row(&c, t, p, 1, p as u32);
    }
    assert_row(&c, s, 6, 2, 90);
    assert_row(&c, s, 5, 1, 5);
    c.truncate(s, 0).unwrap();
    assert!(c.table(s).unwrap().blocks.is_empty());
    c.check_invariants().unwrap();
}

#[test]
fn pools_are_sized_from_the_budget() {
    let budget = 16 << 20;
    let c = KvCache::new(KvConfig::with_budget(budget), 30, 192).unwrap();
    assert_eq!(c.block_size(), DEFAULT_BLOCK_SIZE);
    assert_eq!(c.bytes_per_block(), 2 * 30 * DEFAULT_BLOCK_SIZE * 192 * 4);
    assert_eq!(c.num_blocks(), budget / c.bytes_per_block());
    assert!(matches!(
        KvCache::new(KvConfig::with_budget(1000), 30, 192),
        Err(KvError::BudgetTooSmall { .. })
    ));
    assert!(matches!(
        KvCache::new(
            KvConfig {
                block_size: 0,
                budget_bytes: 1 << 20,
                format: treegrpo::model::KvFormat::F32,
            },
            2,
            8
        ),
        Err(KvError::InvalidConfig(_))
    ));
}

/// A fork costs the same whatever the prefix length: after the first fork has frozen
/// the parent's full blocks into a shared segment, later forks touch no block's count
/// but the partly filled last one's, and add no segment. The frozen prefix is
/// immutable; truncating a fork into it rebuilds the fork's own part.
#[test]
fn forks_share_a_frozen_segment_without_touching_its_blocks() {
    let mut c = cache(4, 64);
    let parent = c.new_sequence();
    extend(&mut c, parent, &toks(0..30), 1); // 7 full blocks + 2 rows
    let first = c.fork(parent).unwrap();
    assert_eq!(
        c.segment_count(),
        1,
        "the first fork freezes the full blocks"
    );
    let table = c.table(parent).unwrap();
    let partial = table.blocks[7];
    let holders = c.pool().refcounts().to_vec();
    for _ in 0..3 {
        let f = c.fork(parent).unwrap();
        let changed: Vec<usize> = holders
            .iter()
            .zip(c.pool().refcounts())
            .enumerate()
            .filter(|(_, (a, b))| a != b)
            .map(|(i, _)| i)
            .collect();
        assert_eq!(changed, vec![partial.index()], "only the partial block");
        assert_eq!(c.segment_count(), 1);
        assert_eq!(c.references()[table.blocks[0].index()], 3);
        c.free(f).unwrap();
        assert_eq!(c.pool().refcounts(), &holders[..]);
        c.check_invariants().unwrap();
    }

    // The frozen positions cannot be rewritten, by the fork or by its parent.
    let k = vec![0.0; KV_DIM];
    for s in [first, parent] {
        assert!(matches!(
            c.write(s, 0, 3, &k, &k),
            Err(KvError::Frozen { position: 3, .. })
        ));
    }

    // Truncating the fork into its frozen prefix: same data, then its own continuation.
    c.truncate(first, 10).unwrap();
    c.check_invariants().unwrap();
    assert_eq!(c.tokens(first).unwrap(), toks(0..10));
    extend(&mut c, first, &[90, 91, 92], 2);
    c.check_invariants().unwrap();
    for p in 0..10 {
        assert_row(&c, first, p, 1, p as u32);
    }
    for (i, t) in [90, 91, 92].into_iter().enumerate() {
        assert_row(&c, first, 10 + i, 2, t);
    }
    for p in 0..30 {
        assert_row(&c, parent, p, 1, p as u32);
    }
    c.free(first).unwrap();
    c.free(parent).unwrap();
    c.check_invariants().unwrap();
    assert_eq!(c.segment_count(), 0);
    assert!(c.pool().refcounts().iter().all(|&r| r == 0));
}
