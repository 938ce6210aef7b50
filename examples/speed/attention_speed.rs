//! Micro-benchmark of the decode attention kernel on one thread, at the default
//! model's shape (9 query heads, 3 KV heads, head_dim 64), over a paged store whose
//! blocks are scattered through a large pool, as the engine's are after a rollout has
//! run a while: `cargo run --release --example attention_speed [-- CONTEXT BATCH]`.
//!
//! `CONTEXT BATCH SHARED`: the sequences share their first SHARED positions' blocks.
//! `BLOCK=N` sets the positions per block (the engine's default is 64); `SEQUENTIAL=1`
//! lays each sequence's blocks out in order instead of scattering them; `REPEATS=N`
//! times the attention N times (default 5) and keeps the best; `F16=1` keeps the
//! store's keys and values in f16, as the engine's pool does under `--precision fast`.
//!
//! Prints the machine's sequential read bandwidth first (one and two threads), then ns
//! per (query head, key position), the unit attention's cost scales with,
//! and the K/V bytes it read per second (each sequence's keys and values once per
//! layer: what the hardware must at least deliver).
use std::time::Instant;

use half::f16;
use treegrpo::model::attention::{AttentionPlan, AttentionShape, SeqSpan};
use treegrpo::model::{KvChunk, KvChunks, KvSlot, KvStore, ModelError};

const SHAPE: AttentionShape = AttentionShape {
    num_heads: 9,
    num_kv_heads: 3,
    head_dim: 64,
};

/// One layer of a paged store: `tables[slot]` lists the blocks of a sequence, which
/// are spread through a pool of `pool_blocks` (a fixed pseudo-random permutation).
struct ScatteredStore {
    keys: Vec<f32>,
    values: Vec<f32>,
    /// The same values in f16 when the store keeps that format (`F16=1`).
    halves: Option<(Vec<f16>, Vec<f16>)>,
    tables: Vec<Vec<usize>>,
    /// Positions per block.
    block: usize,
}

impl ScatteredStore {
    /// The first `shared` positions' blocks are the same for every sequence (a tree's
    /// common prefix); the rest are each sequence's own.
    fn new(seqs: usize, context: usize, shared: usize, pool_blocks: usize, block: usize) -> Self {
        let kv_dim = SHAPE.num_kv_heads * SHAPE.head_dim;
        let per_seq = context.div_ceil(block);
        assert!(seqs * per_seq <= pool_blocks);
        let mut order: Vec<usize> = (0..pool_blocks).collect();
        let mut state = 0x9E37_79B9_7F4A_7C15u64;
        let shuffle = std::env::var_os("SEQUENTIAL").is_none();
        for i in (1..order.len()).rev().filter(|_| shuffle) {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            order.swap(i, (state % (i as u64 + 1)) as usize);
        }
        let common = shared / block;
        let tables = (0..seqs)
            .map(|s| {
                let own = &order[s * per_seq..(s + 1) * per_seq];
                order[..common]
                    .iter()
                    .chain(&own[common..])
                    .copied()
                    .collect()
            })
            .collect();
        let floats = pool_blocks * block * kv_dim;
        let fill = |seed: usize| -> Vec<f32> {
            // Huge pages where the kernel gives them, as the engine's pool asks.
            let mut buf = vec![0f32; floats];
            treegrpo::model::huge_pages::advise(&buf);
            for (i, v) in buf.iter_mut().enumerate() {
                *v = (((i + seed) * 7919 % 2003) as f32) / 1001.0 - 1.0;
            }
            buf
        };
        let (keys, values) = (fill(1), fill(2));
        let halves = std::env::var_os("F16").map(|_| {
            let half = |v: &[f32]| v.iter().map(|&x| f16::from_f32(x)).collect::<Vec<_>>();
            (half(&keys), half(&values))
        });
        // Only the format attention reads stays in memory.
        let (keys, values) = if halves.is_some() {
            (Vec::new(), Vec::new())
        } else {
            (keys, values)
        };
        ScatteredStore {
            keys,
            values,
            halves,
            tables,
            block,
        }
    }
}

impl KvStore for ScatteredStore {
    fn store(
        &mut self,
        _: usize,
        _: KvSlot,
        _: usize,
        _: &[f32],
        _: &[f32],
    ) -> Result<(), ModelError> {
        Ok(())
    }

    fn chunks(&self, _layer: usize, slot: KvSlot, _len: usize) -> KvChunks<'_> {
        let width = self.block * SHAPE.num_kv_heads * SHAPE.head_dim;
        // As the engine's paged cache lays a block out: head after head.
        fn blocks<'a, T>(
            table: &[usize],
            keys: &'a [T],
            values: &'a [T],
            width: usize,
        ) -> Vec<KvChunk<'a, T>> {
            table
                .iter()
                .map(|&b| {
                    let range = b * width..(b + 1) * width;
                    KvChunk::head_major(&keys[range.clone()], &values[range], SHAPE.num_kv_heads)
                })
                .collect()
        }
        let table = &self.tables[slot.raw()];
        match &self.halves {
            Some((k, v)) => KvChunks::F16(blocks(table, k, v, width)),
            None => KvChunks::F32(blocks(table, &self.keys, &self.values, width)),
        }
    }
}

fn main() {
    let args: Vec<usize> = std::env::args()
        .skip(1)
        .filter_map(|a| a.parse().ok())
        .collect();
    let contexts = if args.is_empty() {
        vec![256, 1024, 2048]
    } else {
        vec![args[0]]
    };
    let batches = if args.len() < 2 {
        vec![1, 16]
    } else {
        vec![args[1]]
    };
    // A third argument: positions every sequence shares (default none).
    let shared = args.get(2).copied().unwrap_or(0);
    let block: usize = std::env::var("BLOCK")
        .ok()
        .and_then(|b| b.parse().ok())
        .filter(|&b: &usize| b.is_power_of_two())
        .unwrap_or(treegrpo::kv::DEFAULT_BLOCK_SIZE);
    // 2^20 positions, 1.5 GB of K and V: far past the last-level cache, as a rollout's pool is.
    let pool_blocks = (1 << 20) / block;
    // More repeats (the best is kept) give `perf record` enough samples of the kernel.
    let repeats: usize = std::env::var("REPEATS")
        .ok()
        .and_then(|r| r.parse().ok())
        .unwrap_or(5);
    println!("{block} positions per block");
    read_bandwidth();
    println!("| context | batch | ns / (head, key) | K/V GB/s |");
    println!("|---|---|---|---|");
    for &context in &contexts {
        for &batch in &batches {
            let store =
                ScatteredStore::new(batch, context, shared.min(context), pool_blocks, block);
            let spans: Vec<SeqSpan> = (0..batch)
                .map(|s| SeqSpan {
                    slot: KvSlot::new(s),
                    start: context - 1,
                    row: s,
                    len: 1,
                })
                .collect();
            let q_dim = SHAPE.num_heads * SHAPE.head_dim;
            let q: Vec<f32> = (0..batch * q_dim)
                .map(|i| ((i * 31 % 97) as f32) / 97.0 - 0.5)
                .collect();
            let mut best = f64::INFINITY;
            for _ in 0..repeats {
                let plan = AttentionPlan::new(&store, 0, &spans, SHAPE);
                let mut out = vec![0f32; batch * q_dim];
                let t = Instant::now();
                for item in 0..plan.items() {
                    plan.attend_item(&q, item, &mut out[plan.item_output(item)]);
                }
                best = best.min(t.elapsed().as_secs_f64());
                std::hint::black_box(&out);
            }
            let pairs = (batch * SHAPE.num_heads * context) as f64;
            let value_bytes = if store.halves.is_some() { 2 } else { 4 };
            let bytes =
                (batch * context * 2 * SHAPE.num_kv_heads * SHAPE.head_dim * value_bytes) as f64;
            println!(
                "| {context} | {batch} | {:.2} | {:.1} |",
                best * 1e9 / pairs,
                bytes / best / 1e9
            );
        }
    }
}

/// The machine's streaming read bandwidth, the bound attention's K/V reads (and a
/// dense batch-1 decode's weight reads) are measured against: a 1 GiB buffer summed
/// in order by one thread, then by two threads each summing half.
fn read_bandwidth() {
    let data: Vec<f32> = (0..(1usize << 28)).map(|i| (i % 7) as f32).collect();
    let sum = |part: &[f32]| -> f32 {
        let mut lanes = [0f32; 16];
        for c in part.chunks_exact(16) {
            for (l, v) in lanes.iter_mut().zip(c) {
                *l += v;
            }
        }
        lanes.iter().sum()
    };
    let bytes = (data.len() * 4) as f64;
    for threads in [1usize, 2] {
        let mut best = f64::INFINITY;
        for _ in 0..3 {
            let t = Instant::now();
            std::thread::scope(|s| {
                for part in data.chunks(data.len() / threads) {
                    s.spawn(move || std::hint::black_box(sum(part)));
                }
            });
            best = best.min(t.elapsed().as_secs_f64());
        }
        println!(
            "sequential read, {threads} thread(s): {:.1} GB/s",
            bytes / best / 1e9
        );
    }
}
