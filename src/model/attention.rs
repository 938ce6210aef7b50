//! Causal grouped-query attention that reads K/V from storage the engine owns.
//!
//! The model never holds per-sequence state: each forward hands it a [`KvStore`]
//! (`kv_store.rs`), into which the new tokens' keys and values are written and from
//! which attention reads them back as a list of contiguous runs ([`KvChunk`]). A paged
//! store returns one run per block, a dense one a single run, and the kernel never
//! concatenates a cache.

use half::f16;

use super::kernels::{
    dot_rows_heads, exp_in_place, max_of, weighted_sum_heads, KvElem, RowRuns, Rows,
};
use super::kv_store::{KvChunk, KvChunks, KvSlot, KvStore};

/// Where one sequence's new tokens sit in a flattened batch.
#[derive(Debug, Clone, Copy)]
pub struct SeqSpan {
    /// The sequence's slot in the [`KvStore`] its keys and values are kept in.
    pub slot: KvSlot,
    /// Position of the first new token.
    pub start: usize,
    /// Index of the first new token's row in the flattened batch.
    pub row: usize,
    /// Number of new tokens (rows) of the sequence in this batch.
    pub len: usize,
}

/// Shapes the kernel needs.
#[derive(Debug, Clone, Copy)]
pub struct AttentionShape {
    /// Query heads.
    pub num_heads: usize,
    /// Key/value heads; divides `num_heads` (each serves `num_heads / num_kv_heads`
    /// query heads).
    pub num_kv_heads: usize,
    /// Values per head (of a query, key or value).
    pub head_dim: usize,
}

/// One sequence's cached key rows and value rows of one KV head (`head_dim` each), in
/// position order.
type HeadRows<'a, T> = (RowRuns<'a, T>, RowRuns<'a, T>);

/// One sequence's [`HeadRows`] per KV head, in its store's number format.
enum SeqRows<'a> {
    F32(Vec<HeadRows<'a, f32>>),
    F16(Vec<HeadRows<'a, f16>>),
}

/// Below this many (token, KV head) items, a plan makes one item per query head (see
/// [`AttentionPlan`]): a single token's 3 KV heads split 2 / 1 over two threads.
const MIN_GROUPED_ITEMS: usize = 6;

/// What an item costs beyond its keys, in keys: the query's load, the softmax's
/// passes and the output's store (it only weighs the split, results never see it).
const ITEM_OVERHEAD_KEYS: u64 = 16;

/// One layer's attention for a whole batch, planned once: each new token's sequence
/// and position, and each sequence's key and value rows, flattened from the store's
/// runs before the work is split (not once per item).
///
/// The work is one item per (token, KV head): the query heads that share a KV head
/// (grouped-query attention) in one pass over their KV head's rows, so each row is
/// read once for all of them. With a single token that gives too few items to split
/// evenly over the threads (3 KV heads on 2 threads: one does twice the other's
/// work), so each query head is an item of its own there. Each (token, head) output
/// is still its own fixed sequential loop over positions, the same whichever item,
/// batch or thread computes it.
///
/// Members take contiguous ranges of items of about equal cost ([`Self::share`]: the
/// keys they read), not equal counts: a batch's sequences differ in context length
/// several-fold, and the members meet at a barrier after attention.
///
/// Items run KV head by KV head, and within one KV head, sequences that share cached
/// blocks (a tree's branches, a prompt's trees, a common system prompt) run next to
/// each other, with a prefill chunk's tokens together: the team splits the items
/// into contiguous ranges, so one thread reads a shared prefix's rows of that KV head
/// from memory once and from its cache for the next token (attention at rollout
/// contexts is bound by reading K and V). Only the order changes: every item computes
/// exactly what it did alone, so the results are bit-identical.
pub struct AttentionPlan<'a> {
    shape: AttentionShape,
    /// Query heads one item computes: the KV group's, or 1 for small batches.
    heads_per_item: usize,
    /// Per new token: its sequence (index into `seq_rows`) and position.
    row_info: Vec<(usize, usize)>,
    /// Per sequence, per KV head: its cached positions' key rows and value rows
    /// (`head_dim` wide), in order, flattened from the store's runs once per layer
    /// rather than per item.
    seq_rows: Vec<SeqRows<'a>>,
    /// The items in the order they run: (token row, first query head).
    items: Vec<(u32, u32)>,
    /// `cost_before[k]`: the cost of items `0..k` (keys read, plus an overhead each).
    cost_before: Vec<u64>,
}

impl<'a> AttentionPlan<'a> {
    /// Plans one layer's attention for the sequences of `spans`, reading each one's
    /// cached keys and values of `layer` from `store` (the new tokens' rows written
    /// already).
    pub fn new(
        store: &'a dyn KvStore,
        layer: usize,
        spans: &[SeqSpan],
        shape: AttentionShape,
    ) -> Self {
        let mut row_info = Vec::new();
        let kv_dim = shape.num_kv_heads * shape.head_dim;
        let mut seq_rows = Vec::with_capacity(spans.len());
        // Per sequence, where each of its runs starts: equal prefixes of this list
        // are shared cached blocks.
        let mut run_starts: Vec<Vec<usize>> = Vec::with_capacity(spans.len());
        for (s, span) in spans.iter().enumerate() {
            let len = span.start + span.len;
            let (starts, rows) = match store.chunks(layer, span.slot, len) {
                KvChunks::F32(chunks) => (
                    run_addresses(&chunks, shape),
                    SeqRows::F32(head_rows(&chunks, len, kv_dim, shape)),
                ),
                KvChunks::F16(chunks) => (
                    run_addresses(&chunks, shape),
                    SeqRows::F16(head_rows(&chunks, len, kv_dim, shape)),
                ),
            };
            run_starts.push(starts);
            seq_rows.push(rows);
            for i in 0..span.len {
                row_info.push((s, span.start + i));
            }
        }
        let group = shape.num_heads / shape.num_kv_heads;
        let heads_per_item = if row_info.len() * shape.num_kv_heads < MIN_GROUPED_ITEMS {
            1
        } else {
            group
        };
        // Sequences sorted by their runs: those sharing blocks become neighbours.
        let mut by_prefix: Vec<usize> = (0..spans.len()).collect();
        by_prefix.sort_by(|&a, &b| run_starts[a].cmp(&run_starts[b]).then(a.cmp(&b)));
        let mut items = Vec::with_capacity(row_info.len() * shape.num_heads / heads_per_item);
        for kv_head in 0..shape.num_kv_heads {
            for &s in &by_prefix {
                for row in spans[s].row..spans[s].row + spans[s].len {
                    for head in (kv_head * group..(kv_head + 1) * group).step_by(heads_per_item) {
                        items.push((row as u32, head as u32));
                    }
                }
            }
        }
        let mut cost_before = Vec::with_capacity(items.len() + 1);
        let mut total = 0u64;
        cost_before.push(0);
        for &(row, _) in &items {
            let keys = row_info[row as usize].1 as u64 + 1;
            total += keys * heads_per_item as u64 + ITEM_OVERHEAD_KEYS;
            cost_before.push(total);
        }
        AttentionPlan {
            shape,
            heads_per_item,
            row_info,
            seq_rows,
            items,
            cost_before,
        }
    }

    /// What item `idx` weighs in [`Self::share`]: the keys it reads (once per query
    /// head it computes) plus a fixed overhead.
    pub fn item_cost(&self, idx: usize) -> u64 {
        self.cost_before[idx + 1] - self.cost_before[idx]
    }

    /// Member `index` of `size`'s items: contiguous ranges in run order, together
    /// every item once, each about `1 / size` of the plan's cost (its boundaries are
    /// the item edges nearest to equal shares).
    pub fn share(&self, index: usize, size: usize) -> std::ops::Range<usize> {
        let edge = |i: usize| {
            if i == 0 {
                return 0;
            }
            if i >= size {
                return self.items.len();
            }
            let total = *self.cost_before.last().unwrap_or(&0);
            let target = (total as u128 * i as u128 / size as u128) as u64;
            // The first edge at or past the target, or the one before it if nearer.
            let k = self.cost_before.partition_point(|&c| c < target);
            let k = if k > 0 && target - self.cost_before[k - 1] < self.cost_before[k] - target {
                k - 1
            } else {
                k
            };
            k.min(self.items.len())
        };
        edge(index)..edge(index + 1).max(edge(index))
    }

    /// How many items the plan has: (token, KV head) pairs, or (token, query head)
    /// pairs for small batches.
    pub fn items(&self) -> usize {
        self.items.len()
    }

    /// Where item `idx`'s output lies in the `[rows, num_heads * head_dim]` attention
    /// output: its query heads' `head_dim` values each, side by side.
    pub fn item_output(&self, idx: usize) -> std::ops::Range<usize> {
        let (row, head) = self.items[idx];
        let head_dim = self.shape.head_dim;
        let start = row as usize * self.shape.num_heads * head_dim + head as usize * head_dim;
        start..start + self.heads_per_item * head_dim
    }

    /// Computes item `idx` from `q` (`[rows, num_heads * head_dim]`) into `out` (its
    /// [`Self::item_output`] range of the output, which must be zero on entry).
    pub fn attend_item(&self, q: &[f32], idx: usize, out: &mut [f32]) {
        let AttentionShape {
            num_heads,
            num_kv_heads,
            head_dim,
        } = self.shape;
        let q_dim = num_heads * head_dim;
        let group = num_heads / num_kv_heads;
        let scale = 1.0 / (head_dim as f32).sqrt();
        let heads = self.heads_per_item;
        let (row, first_head) = (self.items[idx].0 as usize, self.items[idx].1 as usize);
        // An item's heads lie in one KV group (`heads` is the group or 1).
        let kv_head = first_head / group;
        let (s, position) = self.row_info[row];
        let qs = &q[row * q_dim + first_head * head_dim..][..heads * head_dim];
        let n = position + 1;
        match &self.seq_rows[s] {
            SeqRows::F32(rows) => {
                let (k_rows, v_rows) = &rows[kv_head];
                attend_rows(qs, heads, k_rows.view(n), v_rows.view(n), scale, out);
            }
            SeqRows::F16(rows) => {
                let (k_rows, v_rows) = &rows[kv_head];
                attend_rows(qs, heads, k_rows.view(n), v_rows.view(n), scale, out);
            }
        }
    }
}

/// The run starts of `chunks` (equal prefixes of two sequences' lists are shared
/// cached blocks), checking that head-major runs hold exactly the model's KV heads.
fn run_addresses<T>(chunks: &[KvChunk<'_, T>], shape: AttentionShape) -> Vec<usize> {
    chunks
        .iter()
        .map(|chunk| {
            // A head-major run must hold exactly the model's KV heads, or rows would
            // be read from the wrong place.
            assert!(
                chunk.heads == 1 || chunk.heads == shape.num_kv_heads,
                "a KV run of {} heads for a model of {}",
                chunk.heads,
                shape.num_kv_heads
            );
            chunk.keys.as_ptr() as usize
        })
        .collect()
}

/// One item's attention: `heads` queries (`qs`, one KV group's, side by side) against
/// `n` key rows and value rows (f32, or f16 widened as the loops load them: the same
/// values give the same results), into `out` (zero on entry).
fn attend_rows<T: KvElem>(
    qs: &[f32],
    heads: usize,
    k_rows: Rows<T>,
    v_rows: Rows<T>,
    scale: f32,
    out: &mut [f32],
) {
    let n = k_rows.len();
    // scores[h * n + j]: the item's head h against position j. The item's heads
    // share their KV head, so each key and value row is read once for all of them.
    let mut scores = vec![0f32; heads * n];
    dot_rows_heads(qs, heads, k_rows, &mut scores);
    for v in scores.iter_mut() {
        *v *= scale;
    }
    for sc in scores.chunks_exact_mut(n) {
        let max = max_of(sc);
        for v in sc.iter_mut() {
            *v -= max;
        }
        exp_in_place(sc);
    }
    let mut sums = [0f32; MAX_SUM_CHAINS];
    for (h0, sc) in (0..heads)
        .step_by(MAX_SUM_CHAINS)
        .zip(scores.chunks_mut(MAX_SUM_CHAINS * n))
    {
        let k = (heads - h0).min(MAX_SUM_CHAINS);
        sequential_sums(sc, n, &mut sums[..k]);
        for (sc, &sum) in sc.chunks_exact_mut(n).zip(&sums[..k]) {
            let inv = 1.0 / sum;
            // Each probability times the normaliser once here, the product the
            // value sum would otherwise form for every 32 lanes of the head.
            for v in sc.iter_mut() {
                *v *= inv;
            }
        }
    }
    weighted_sum_heads(v_rows, heads, &scores, out);
}

/// Most heads whose softmax sums [`sequential_sums`] runs side by side.
const MAX_SUM_CHAINS: usize = 4;

/// `sums[i]`: row `i` of `rows` (`sums.len()` rows of `n`) summed in order from zero,
/// the sequential fold every variant reproduces. A sum is a chain of dependent adds
/// (one every few cycles); the rows' chains go side by side here, so a KV group's
/// heads take the time of one (the fold was most of `attend_item`'s own time).
fn sequential_sums(rows: &[f32], n: usize, sums: &mut [f32]) {
    fn side_by_side<const K: usize>(rows: &[f32], n: usize, sums: &mut [f32]) {
        let mut acc = [0f32; K];
        for j in 0..n {
            for (i, a) in acc.iter_mut().enumerate() {
                *a += rows[i * n + j];
            }
        }
        sums.copy_from_slice(&acc);
    }
    match sums.len() {
        1 => side_by_side::<1>(rows, n, sums),
        2 => side_by_side::<2>(rows, n, sums),
        3 => side_by_side::<3>(rows, n, sums),
        4 => side_by_side::<4>(rows, n, sums),
        k => unreachable!("{k} sums at once"),
    }
}

/// Each KV head's key and value rows of positions `0..len` in `chunks`, as runs: one
/// per chunk when the chunks are evenly sized (a power of two of positions each but
/// the last, as the paged cache's blocks and a dense store's single buffer are), else
/// (a store with ragged runs) one per row.
fn head_rows<'a, T>(
    chunks: &[KvChunk<'a, T>],
    len: usize,
    kv_dim: usize,
    shape: AttentionShape,
) -> Vec<HeadRows<'a, T>> {
    let head_dim = shape.head_dim;
    let per_run = even_runs(chunks, len, kv_dim);
    (0..shape.num_kv_heads)
        .map(|h| match per_run {
            Some(per_run) => {
                let runs = |values: bool| {
                    let mut stride = head_dim;
                    let mut runs = Vec::with_capacity(len.div_ceil(per_run));
                    for c in chunks.iter().take(len.div_ceil(per_run)) {
                        let data = if values { c.values } else { c.keys };
                        let (start, s) = c.head_start(data, h, kv_dim, head_dim);
                        runs.push(start);
                        // The same for every run: they lay out heads alike.
                        stride = s;
                    }
                    RowRuns::new(runs, per_run, stride, len)
                };
                (runs(false), runs(true))
            }
            None => {
                let rows = |values: bool| {
                    let mut out = Vec::with_capacity(len);
                    let mut filled = 0;
                    for c in chunks {
                        if filled >= len {
                            break;
                        }
                        let data = if values { c.values } else { c.keys };
                        let n = c.positions(kv_dim).min(len - filled);
                        out.extend(c.head_rows(data, h, n, kv_dim, head_dim));
                        filled += n;
                    }
                    RowRuns::from_rows(out)
                };
                (rows(false), rows(true))
            }
        })
        .collect()
}

/// Positions per run when `chunks` are even enough to name positions `0..len` by run
/// and offset: the runs they need all lay out heads alike, and all but the last hold
/// the same number of positions, a power of two (any number for a single run).
fn even_runs<T>(chunks: &[KvChunk<'_, T>], len: usize, kv_dim: usize) -> Option<usize> {
    let first = chunks.first()?;
    let size = first.positions(kv_dim).max(1);
    let needed = len.div_ceil(size).max(1);
    let used = chunks.get(..needed)?;
    // The last run must hold the rest: ragged runs ([8, 1, 5] rows for 14) hold
    // the positions, but not where even runs would put them.
    let even = used.iter().all(|c| c.heads == first.heads)
        && used[..needed - 1]
            .iter()
            .all(|c| c.positions(kv_dim) == size)
        && used[needed - 1].positions(kv_dim) >= len - (needed - 1) * size
        && (needed == 1 || size.is_power_of_two());
    even.then(|| size.next_power_of_two())
}
