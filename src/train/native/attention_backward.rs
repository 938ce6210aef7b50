//! Tree attention's backward as matrix products, tiled as flash attention's is.
//!
//! A tile is one KV head's query heads over a block of up to [`BLOCK_ROWS`]
//! consecutive rows of one trie edge (each the child of the one before), against the
//! `n` keys the block's last row attends to (row `t` of a block of `b` sees the first
//! `n − (b − 1 − t)` of them). With the tile's queries `Q`, output `O`, its gradient
//! `dO`, and its keys and values `K`, `V` gathered contiguous:
//!
//! `P = softmax(s·Q·Kᵀ)` (masked, recomputed), `dP = dO·Vᵀ`, `dS = s·P∘(dP − rowsum(dO∘O))`,
//! `dQ = dS·K`, `dK += dSᵀ·Q`, `dV += Pᵀ·dO` —
//!
//! five `gemm` products per tile instead of row-by-row dot products, each key read
//! once per tile for all of its rows and query heads. Tiles run in parallel, each
//! thread summing its keys' gradients into buffers of its own, added at the end.

use rayon::prelude::*;

use super::super::layout::TreeLayout;
use super::matmul::{product, Threads, View};

/// Rows of an edge one tile takes.
pub const BLOCK_ROWS: usize = 32;

/// Shapes: query heads, KV heads, head width.
#[derive(Debug, Clone, Copy)]
pub struct Heads {
    /// Query heads per row.
    pub heads: usize,
    /// Key/value heads per row; each serves `heads / kv_heads` query heads (GQA).
    pub kv_heads: usize,
    /// Width of one head (`d`), in f32 values.
    pub head_dim: usize,
}

/// `c = a · bᵀ` (`a [m, k]`, `b [n, k]`, `c [m, n]`), all row-major and contiguous.
fn mul_bt(a: &[f32], b: &[f32], m: usize, n: usize, k: usize, c: &mut [f32]) {
    product(
        View::rows(a, m, k),
        View::rows(b, n, k).t(),
        c,
        false,
        Threads::This,
    );
}

/// `c = a · b` (`a [m, k]`, `b [k, n]`).
fn mul(a: &[f32], b: &[f32], m: usize, n: usize, k: usize, c: &mut [f32]) {
    product(
        View::rows(a, m, k),
        View::rows(b, k, n),
        c,
        false,
        Threads::This,
    );
}

/// `c = aᵀ · b` (`a [k, m]`, `b [k, n]`).
fn mul_at(a: &[f32], b: &[f32], m: usize, n: usize, k: usize, c: &mut [f32]) {
    product(
        View::rows(a, k, m).t(),
        View::rows(b, k, n),
        c,
        false,
        Threads::This,
    );
}

/// One thread's sums and scratch.
#[derive(Default)]
struct Acc {
    dq: Vec<f32>,
    dk: Vec<f32>,
    dv: Vec<f32>,
    keys: Vec<usize>,
    kn: Vec<f32>,
    vn: Vec<f32>,
    qb: Vec<f32>,
    dob: Vec<f32>,
    big_d: Vec<f32>,
    p: Vec<f32>,
    ds: Vec<f32>,
    small: Vec<f32>,
    big: Vec<f32>,
}

/// What the forward computed and the gradient of its output: `q`, `out`, `dout`
/// `[rows, heads · d]`; `k`, `v` `[rows, kv_heads · d]`.
#[derive(Clone, Copy)]
pub struct Saved<'a> {
    /// Rotated queries, `[rows, heads · d]`.
    pub q: &'a [f32],
    /// Rotated keys, `[rows, kv_heads · d]`.
    pub k: &'a [f32],
    /// Values, `[rows, kv_heads · d]`.
    pub v: &'a [f32],
    /// The forward's attention output, `[rows, heads · d]` (before the output
    /// projection).
    pub out: &'a [f32],
    /// The loss's gradient with respect to `out`, same shape.
    pub dout: &'a [f32],
}

/// `(dq, dk, dv)` of tree attention, every row attending to its ancestors and itself.
pub fn tree_attention_backward(
    layout: &TreeLayout,
    shape: Heads,
    saved: Saved,
) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
    let rows = layout.len();
    let Heads {
        heads,
        kv_heads,
        head_dim: d,
    } = shape;
    let (q_dim, kv_dim) = (heads * d, kv_heads * d);
    // Tiles: (KV head, first row, rows).
    let mut tiles = Vec::new();
    let mut i = 0;
    while i < rows {
        let mut b = 1;
        while b < BLOCK_ROWS && i + b < rows && layout.parent(i + b) == Some(i + b - 1) {
            b += 1;
        }
        for g in 0..kv_heads {
            tiles.push((g, i, b));
        }
        i += b;
    }
    let threads = rayon::current_num_threads().max(1);
    let fresh = || Acc {
        dq: vec![0f32; rows * q_dim],
        dk: vec![0f32; rows * kv_dim],
        dv: vec![0f32; rows * kv_dim],
        ..Acc::default()
    };
    let acc = tiles
        .par_iter()
        .with_min_len(tiles.len().div_ceil(4 * threads).max(1))
        .fold(fresh, |mut acc, &(g, i, b)| {
            tile(layout, shape, saved, (g, i, b), &mut acc);
            acc
        })
        .reduce_with(|mut a, b| {
            for (x, y) in [(&mut a.dq, &b.dq), (&mut a.dk, &b.dk), (&mut a.dv, &b.dv)] {
                for (x, y) in x.iter_mut().zip(y) {
                    *x += y;
                }
            }
            a
        })
        .unwrap_or_else(fresh);
    (acc.dq, acc.dk, acc.dv)
}

/// Where a tile sits and its sizes, worked out once and read by each phase.
#[derive(Clone, Copy)]
struct TileDims {
    /// The KV head.
    g: usize,
    /// The first row.
    i: usize,
    /// Rows in the block.
    b: usize,
    /// Head width.
    d: usize,
    /// Query heads per KV head.
    group: usize,
    /// Width of a row of queries (`heads · d`).
    q_dim: usize,
    /// Width of a row of keys or values (`kv_heads · d`).
    kv_dim: usize,
    /// The score scale `1/sqrt(d)`.
    scale: f32,
    /// Keys the block's last row attends to.
    n: usize,
    /// Query rows of the tile (`group · b`), in (head, row) order.
    m: usize,
}

/// The tile of KV head `g` over rows `i..i + b`.
fn tile(
    layout: &TreeLayout,
    shape: Heads,
    saved: Saved,
    (g, i, b): (usize, usize, usize),
    acc: &mut Acc,
) {
    let Heads {
        heads,
        kv_heads,
        head_dim: d,
    } = shape;
    let group = heads / kv_heads;
    let last = i + b - 1;
    acc.keys.clear();
    acc.keys.extend(
        layout
            .runs(last)
            .iter()
            .flat_map(|r| r.start as usize..r.end as usize),
    );
    let dims = TileDims {
        g,
        i,
        b,
        d,
        group,
        q_dim: heads * d,
        kv_dim: kv_heads * d,
        scale: 1.0 / (d as f32).sqrt(),
        n: acc.keys.len(),
        m: group * b,
    };
    gather(&dims, saved, acc);
    probabilities(&dims, acc);
    score_grads(&dims, acc);
    add_query_grads(&dims, acc);
    add_key_value_grads(&dims, acc);
}

/// Gathers the tile's keys and values (`kn`, `vn`, `[n, d]`), its query rows
/// and their output gradients in (head, row) order (`qb`, `dob`, `[m, d]`),
/// and each such row's `D = rowsum(dO∘O)` (`big_d`).
fn gather(dims: &TileDims, saved: Saved, acc: &mut Acc) {
    let Saved { q, k, v, out, dout } = saved;
    let &TileDims {
        g,
        i,
        b,
        d,
        group,
        q_dim,
        kv_dim,
        ..
    } = dims;
    acc.kn.clear();
    acc.vn.clear();
    for &j in &acc.keys {
        acc.kn.extend_from_slice(&k[j * kv_dim + g * d..][..d]);
        acc.vn.extend_from_slice(&v[j * kv_dim + g * d..][..d]);
    }
    acc.qb.clear();
    acc.dob.clear();
    acc.big_d.clear();
    for h in g * group..(g + 1) * group {
        for t in 0..b {
            let at = (i + t) * q_dim + h * d;
            acc.qb.extend_from_slice(&q[at..][..d]);
            acc.dob.extend_from_slice(&dout[at..][..d]);
            let dot: f32 = dout[at..][..d]
                .iter()
                .zip(&out[at..][..d])
                .map(|(a, b)| a * b)
                .sum();
            acc.big_d.push(dot);
        }
    }
}

/// `P = softmax(s·Q·Kᵀ)` into `acc.p` (`[m, n]`), recomputed: row `r` (row
/// `r % b` of the block) sees the first `n − (b − 1 − r % b)` keys, the rest
/// are zero.
fn probabilities(dims: &TileDims, acc: &mut Acc) {
    let &TileDims {
        b, d, scale, n, m, ..
    } = dims;
    acc.p.resize(m * n, 0.0);
    mul_bt(&acc.qb, &acc.kn, m, n, d, &mut acc.p);
    for (r, row) in acc.p.chunks_exact_mut(n).enumerate() {
        let seen = n - (b - 1 - r % b);
        let (live, masked) = row.split_at_mut(seen);
        let max = live
            .iter()
            .fold(f32::NEG_INFINITY, |a, &x| a.max(x * scale));
        let mut sum = 0f32;
        for x in live.iter_mut() {
            *x = (*x * scale - max).exp();
            sum += *x;
        }
        let inv = 1.0 / sum;
        for x in live.iter_mut() {
            *x *= inv;
        }
        masked.fill(0.0);
    }
}

/// `dS = s·P∘(dO·Vᵀ − D)` into `acc.ds` (`[m, n]`).
fn score_grads(dims: &TileDims, acc: &mut Acc) {
    let &TileDims { d, scale, n, m, .. } = dims;
    acc.ds.resize(m * n, 0.0);
    mul_bt(&acc.dob, &acc.vn, m, n, d, &mut acc.ds);
    for ((ds, p), &dd) in acc
        .ds
        .chunks_exact_mut(n)
        .zip(acc.p.chunks_exact(n))
        .zip(&acc.big_d)
    {
        for (ds, &p) in ds.iter_mut().zip(p) {
            *ds = scale * p * (*ds - dd);
        }
    }
}

/// `dQ = dS·K`, added into the rows' query heads of `acc.dq`.
fn add_query_grads(dims: &TileDims, acc: &mut Acc) {
    let &TileDims {
        g,
        i,
        b,
        d,
        group,
        q_dim,
        n,
        m,
        ..
    } = dims;
    acc.small.resize(m * d, 0.0);
    mul(&acc.ds, &acc.kn, m, d, n, &mut acc.small);
    for (hh, h) in (g * group..(g + 1) * group).enumerate() {
        for t in 0..b {
            let at = (i + t) * q_dim + h * d;
            let src = &acc.small[(hh * b + t) * d..][..d];
            for (x, y) in acc.dq[at..at + d].iter_mut().zip(src) {
                *x += y;
            }
        }
    }
}

/// `dK += dSᵀ·Q` and `dV += Pᵀ·dO`, scattered to the keys' rows of `acc.dk`
/// and `acc.dv`.
fn add_key_value_grads(dims: &TileDims, acc: &mut Acc) {
    let &TileDims {
        g, d, kv_dim, n, m, ..
    } = dims;
    acc.big.resize(n * d, 0.0);
    for (lhs, rhs, sums) in [
        (&acc.ds, &acc.qb, &mut acc.dk),
        (&acc.p, &acc.dob, &mut acc.dv),
    ] {
        mul_at(lhs, rhs, n, d, m, &mut acc.big);
        for (a, &j) in acc.keys.iter().enumerate() {
            let dst = &mut sums[j * kv_dim + g * d..][..d];
            for (x, y) in dst.iter_mut().zip(&acc.big[a * d..][..d]) {
                *x += y;
            }
        }
    }
}
