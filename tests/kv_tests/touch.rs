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

/// A pool of 48 blocks of 4 MiB, nothing touched yet.
fn pool_of_48_blocks() -> KvCache {
    let bytes = 2 * DEPTH * ROWS * WIDTH * 4;
    KvCache::new(
        KvConfig {
            block_size: ROWS,
            budget_bytes: 48 * bytes,
            format: treegrpo::model::KvFormat::F32,
        },
        DEPTH,
        WIDTH,
    )
    .unwrap()
}

#[test]
fn touching_ahead_keeps_the_frontier_ahead_and_changes_no_value() {
    let mut c = pool_of_48_blocks();
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
        let chunks = c.chunks(layer, s.slot(), 40 * ROWS).into_f32().unwrap();
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

/// Whether the page holding `p` is present and this process's own, from
/// `/proc/self/pagemap` (bit 63: present; bit 56: exclusively mapped, which the shared
/// zero page that a read fault maps is not).
#[cfg(all(target_os = "linux", target_arch = "x86_64"))]
fn page_written(p: *const f32) -> bool {
    use std::io::{Read, Seek, SeekFrom};
    const PAGE: u64 = 4096;
    let mut f = std::fs::File::open("/proc/self/pagemap").unwrap();
    f.seek(SeekFrom::Start(p as u64 / PAGE * 8)).unwrap();
    let mut entry = [0u8; 8];
    f.read_exact(&mut entry).unwrap();
    let e = u64::from_le_bytes(entry);
    (e >> 63) & 1 == 1 && (e >> 56) & 1 == 1
}

/// The first and last page of block `b`'s keys and values in `layer`.
#[cfg(all(target_os = "linux", target_arch = "x86_64"))]
fn block_pages(c: &KvCache, layer: usize, b: usize) -> [[*const f32; 2]; 2] {
    let id = BlockId::new(b as u32);
    let (k, v) = (c.storage().keys(layer, id), c.storage().values(layer, id));
    [k, v].map(|s| [&s[0] as *const f32, &s[s.len() - 1] as *const f32])
}

#[cfg(all(target_os = "linux", target_arch = "x86_64"))]
fn written(c: &KvCache, layer: usize, b: usize) -> bool {
    block_pages(c, layer, b)
        .iter()
        .flatten()
        .all(|&p| page_written(p))
}

/// The touch really writes the pages (an optimiser once turned it into nothing): after
/// the first block is handed out, the pages of the blocks ahead of it are present
/// and private in every layer's keys and values, and the pages past the frontier
/// are not.
#[cfg(all(target_os = "linux", target_arch = "x86_64"))]
#[test]
fn touching_ahead_faults_the_pages_in_as_written() {
    let mut c = pool_of_48_blocks();
    assert!(
        !written(&c, 0, 5),
        "a page is written before any block is used"
    );
    let s = c.new_sequence();
    c.reserve(s, ROWS).unwrap();
    let touched = c.storage().touched_blocks();
    assert!(touched > 8, "{touched}");
    for layer in 0..DEPTH {
        // The frontier block's last page may hold the next block's first floats too
        // (the buffers need not start on a page): that one is the next touch's.
        for b in 1..touched - 1 {
            assert!(
                written(&c, layer, b),
                "layer {layer} block {b} not written ahead"
            );
        }
        let beyond = block_pages(&c, layer, 40);
        assert!(
            beyond.iter().flatten().all(|&p| !page_written(p)),
            "layer {layer}: a page past the frontier is written"
        );
    }
    c.free(s).unwrap();
}
