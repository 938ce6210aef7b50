//! The pool's pages written ahead of use (`KvStorage::touch_ahead`): the frontier
//! stays ahead of every block handed out, and writing it changes no row a sequence
//! stored and no block nobody used.

use treegrpo::kv::{BlockId, KvCache, KvConfig};
use treegrpo::model::KvStore;

/// Blocks of 4 MiB (1,024 rows × 256 floats × 2 layers × K and V), so the 64 MiB
/// touched ahead is 16 blocks and a 48-block pool crosses the frontier twice.
const ROWS: usize = 1024;
const WIDTH: usize = 256;
const DEPTH: usize = 2;

fn value(block: usize, layer: usize, which: usize) -> Vec<f32> {
    (0..WIDTH)
        .map(|j| (block * 1000 + layer * 10 + which) as f32 + j as f32 / 1000.0)
        .collect()
}

#[test]
fn touching_ahead_keeps_the_frontier_ahead_and_changes_no_value() {
    let bytes = 2 * DEPTH * ROWS * WIDTH * 4;
    let mut c = KvCache::new(
        KvConfig {
            block_size: ROWS,
            budget_bytes: 48 * bytes,
        },
        DEPTH,
        WIDTH,
    )
    .unwrap();
    let (n, ahead) = (c.num_blocks(), c.storage().touch_ahead_blocks());
    assert_eq!((n, ahead), (48, 16));
    assert_eq!(
        c.storage().touched_blocks(),
        0,
        "nothing is touched before use"
    );
    let s = c.new_sequence();
    // One block more per step, each block's last row written as it arrives, so
    // later touches run over pools that hold data below the frontier.
    for used in 1..=40 {
        c.reserve(s, used * ROWS).unwrap();
        let touched = c.storage().touched_blocks();
        assert!(
            touched >= used + ahead / 2 || touched == n,
            "{touched} at {used}"
        );
        assert!(touched <= n);
        let p = used * ROWS - 1;
        for layer in 0..DEPTH {
            let (k, v) = (value(used - 1, layer, 0), value(used - 1, layer, 1));
            c.store(layer, s.slot(), p, &k, &v).unwrap();
        }
    }
    assert_eq!(
        c.storage().touched_blocks(),
        n,
        "the last frontier is the pool's end"
    );
    for layer in 0..DEPTH {
        let chunks = c.chunks(layer, s.slot(), 40 * ROWS);
        assert_eq!(chunks.len(), 40);
        for (b, ch) in chunks.iter().enumerate() {
            let last = (ROWS - 1) * WIDTH;
            assert_eq!(ch.keys[last..], value(b, layer, 0)[..], "block {b}");
            assert_eq!(ch.values[last..], value(b, layer, 1)[..], "block {b}");
            assert!(ch.keys[..last].iter().all(|&x| x == 0.0));
        }
        for b in 40..n {
            let id = BlockId::new(b as u32);
            assert!(c.storage().keys(layer, id).iter().all(|&x| x == 0.0));
            assert!(c.storage().values(layer, id).iter().all(|&x| x == 0.0));
        }
    }
    c.free(s).unwrap();
    c.check_invariants().unwrap();
}
