//! Forks share blocks without copying; the partly filled last block is copied on
//! first write or ahead of it by a reservation; writes past a reservation are errors.

use super::*;

#[test]
fn fork_shares_blocks_and_copies_the_partial_block_on_first_write() {
    let mut c = cache(4, 16);
    let parent = c.new_sequence();
    extend(&mut c, parent, &toks(0..6), 1);
    let pt = c.table(parent).unwrap().clone();
    assert_eq!(pt.blocks.len(), 2);

    let child = c.fork(parent).unwrap();
    let ct = c.table(child).unwrap().clone();
    assert_eq!(ct, pt, "the child's table is the parent's");
    assert!(pt.blocks.iter().all(|&b| rc(&c, b) == 2));
    assert_eq!(c.blocks_in_use(), 2, "fork allocates nothing");
    assert_eq!(c.stats().cow_copies, 0, "fork copies nothing");

    // The child writes position 6 (inside its partly filled last block, within the
    // capacity it shares, so no reserve): the block is copied first.
    write(&mut c, child, &[50], 2).unwrap();
    c.commit(child, &[50]).unwrap();
    c.check_invariants().unwrap();
    let ct = c.table(child).unwrap().clone();
    assert_eq!(ct.blocks[0], pt.blocks[0], "full block still shared");
    assert_ne!(ct.blocks[1], pt.blocks[1], "partial block copied");
    assert_eq!(rc(&c, pt.blocks[0]), 2);
    assert_eq!(rc(&c, pt.blocks[1]), 1);
    assert_eq!(rc(&c, ct.blocks[1]), 1);
    assert_eq!(c.stats().cow_copies, 1);
    assert_eq!(c.blocks_in_use(), 3);
    for p in 0..6 {
        assert_row(&c, parent, p, 1, p as u32);
        assert_row(&c, child, p, 1, p as u32);
    }
    assert_row(&c, child, 6, 2, 50);
    // The parent's block is untouched at row 6 (never written: still zero).
    for layer in 0..LAYERS {
        let (k, v) = read(&c, parent, layer, 6);
        assert!(k.iter().chain(&v).all(|&x| x == 0.0));
    }

    // The parent now holds its partial block alone: it writes in place, no copy.
    extend(&mut c, parent, &[60], 3);
    assert_eq!(c.table(parent).unwrap().blocks, pt.blocks);
    assert_eq!(c.stats().cow_copies, 1);
    assert_row(&c, parent, 6, 3, 60);
    assert_row(&c, child, 6, 2, 50);
}

#[test]
fn reserve_copies_the_shared_partial_block_ahead_of_the_writes() {
    let mut c = cache(4, 16);
    let parent = c.new_sequence();
    extend(&mut c, parent, &toks(0..5), 1);
    let child = c.fork(parent).unwrap();
    c.reserve(child, 3).unwrap();
    assert_eq!(c.stats().cow_copies, 1, "the copy happens in reserve");
    let counts = |c: &KvCache| {
        let s = c.stats();
        (s.in_use, s.free, s.cow_copies, s.evictions)
    };
    let before = counts(&c);
    write(&mut c, child, &[7, 8, 9], 2).unwrap();
    c.commit(child, &[7, 8, 9]).unwrap();
    assert_eq!(
        counts(&c),
        before,
        "the writes themselves allocate and copy nothing"
    );
    for p in 0..5 {
        assert_row(&c, child, p, 1, p as u32);
    }
    for (i, t) in [7, 8, 9].into_iter().enumerate() {
        assert_row(&c, child, 5 + i, 2, t);
    }
    c.check_invariants().unwrap();
}

#[test]
fn writing_on_a_block_boundary_allocates_without_copying() {
    let mut c = cache(4, 16);
    let parent = c.new_sequence();
    extend(&mut c, parent, &toks(0..8), 1);
    let child = c.fork(parent).unwrap();
    let shared = c.table(parent).unwrap().blocks.clone();
    assert!(shared.iter().all(|&b| rc(&c, b) == 2));

    extend(&mut c, child, &[40], 2);
    extend(&mut c, parent, &[41], 3);
    let (ct, pt) = (c.table(child).unwrap(), c.table(parent).unwrap());
    assert_eq!(ct.blocks[..2], shared[..]);
    assert_eq!(pt.blocks[..2], shared[..]);
    assert_ne!(ct.blocks[2], pt.blocks[2]);
    assert_eq!(c.stats().cow_copies, 0);
    assert_eq!(c.blocks_in_use(), 4);
    assert_row(&c, child, 8, 2, 40);
    assert_row(&c, parent, 8, 3, 41);
    assert_row(&c, child, 7, 1, 7);
}

#[test]
fn store_past_the_reservation_is_an_error() {
    let mut c = cache(4, 4);
    let s = c.new_sequence();
    let err = write(&mut c, s, &[1], 1).unwrap_err();
    // The cache's own error travels as the source, typed.
    let ModelError::KvStore(source) = &err else {
        panic!("{err}")
    };
    assert!(
        matches!(
            source.downcast_ref::<treegrpo::kv::KvError>(),
            Some(treegrpo::kv::KvError::BeyondCapacity { .. })
        ),
        "{err}"
    );
    c.reserve(s, 3).unwrap();
    write(&mut c, s, &[1, 2, 3, 4], 1).expect("the block holds 4 rows");
    assert!(c
        .store(0, s.slot(), 4, &[0.0; KV_DIM], &[0.0; KV_DIM])
        .is_err());
    assert!(c.store(0, s.slot(), 0, &[0.0; 3], &[0.0; 3]).is_err());
    assert!(c
        .store(LAYERS, s.slot(), 0, &[0.0; KV_DIM], &[0.0; KV_DIM])
        .is_err());
    let unknown = KvSlot::new(999);
    assert!(c
        .store(0, unknown, 0, &[0.0; KV_DIM], &[0.0; KV_DIM])
        .is_err());
    assert!(c.chunks(0, unknown, 4).is_empty());
    assert!(matches!(
        c.commit(s, &[1, 2, 3, 4, 5]),
        Err(KvError::BeyondCapacity { .. })
    ));
    assert!(matches!(
        c.truncate(s, 1),
        Err(KvError::BeyondLength { .. })
    ));
    c.check_invariants().unwrap();
}

/// A block holds each KV head's rows contiguously (`[kv_heads, block_size, head_dim]`)
/// when the storage has several heads: a row write scatters its heads there, and a
/// copy-on-write copies each head's first rows and nothing past them.
#[test]
fn head_major_blocks_hold_each_heads_rows_together_and_copy_per_head() {
    use treegrpo::kv::KvStorage;
    let (block_size, heads, head_dim) = (4, 2, 4);
    let kv_dim = heads * head_dim;
    let config = KvConfig {
        block_size,
        budget_bytes: 3 * 2 * LAYERS * block_size * kv_dim * 4,
        format: treegrpo::model::KvFormat::F32,
    };
    let mut st = KvStorage::with_heads(config, LAYERS, kv_dim, heads).unwrap();
    assert_eq!(st.kv_heads(), heads);
    let key = |r: usize| -> Vec<f32> { (0..kv_dim).map(|j| (r * 100 + j) as f32).collect() };
    let value = |r: usize| -> Vec<f32> { key(r).iter().map(|k| -k).collect() };
    let (src, dst) = (BlockId::new(0), BlockId::new(2));
    for r in 0..block_size {
        st.write_row(1, src, r, &key(r), &value(r));
    }
    let keys = st.keys(1, src);
    for r in 0..block_size {
        for h in 0..heads {
            let at = (h * block_size + r) * head_dim;
            assert_eq!(
                &keys[at..at + head_dim],
                &key(r)[h * head_dim..(h + 1) * head_dim]
            );
        }
    }
    st.copy_block(src, dst, 3);
    let (copied, copied_values) = (st.keys(1, dst), st.values(1, dst));
    for h in 0..heads {
        for r in 0..block_size {
            let at = (h * block_size + r) * head_dim;
            let want: Vec<f32> = if r < 3 {
                key(r)[h * head_dim..(h + 1) * head_dim].to_vec()
            } else {
                vec![0.0; head_dim]
            };
            assert_eq!(&copied[at..at + head_dim], &want[..], "head {h} row {r}");
            let want_v: Vec<f32> = want.iter().map(|k| -k).collect();
            assert_eq!(&copied_values[at..at + head_dim], &want_v[..]);
        }
    }
    // A head count that does not divide the row is refused, not mis-laid.
    assert!(matches!(
        KvStorage::with_heads(config, LAYERS, kv_dim, 3),
        Err(KvError::InvalidConfig(_))
    ));
}
