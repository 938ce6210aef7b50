//! Tree attention with a backward of its own: a candle [`CustomOp3`] over
//! `q [rows, heads, head_dim]`, `k` and `v [rows, kv_heads, head_dim]` in which each row
//! attends to its ancestors and itself ([`TreeLayout`]), grouped-query heads included.
//!
//! Why an op of our own: candle's fused softmax has no backward, and composing the
//! attention from candle ops keeps several `[heads, rows, rows]` intermediates per
//! layer alive until the backward (gigabytes at a few thousand packed rows), plus a
//! dense mask. This kernel keeps nothing but its output: the backward recomputes each
//! row's probabilities from q and k (as flash attention does), so memory is linear in
//! the rows, and a row only ever visits the keys it attends to.
//!
//! Forward, per row `i` and head `h` (scale `s = 1/sqrt(head_dim)`):
//! `p_ij = softmax_j(s q_i·k_j)` over the allowed `j`, `o_i = Σ_j p_ij v_j`.
//! Backward, with `D_i = dO_i·o_i`: `dS_ij = p_ij (dO_i·v_j − D_i)`,
//! `dq_i = s Σ_j dS_ij k_j`, `dk_j += s dS_ij q_i`, `dv_j += p_ij dO_i`.
//! The backward takes up to eight consecutive rows of one trie edge at a time (they
//! attend to the same keys but for the last few), so each key is read once per block.
//! Each row's arithmetic is a fixed sequential loop, so results do not depend on the
//! thread count. f32 and f64 (the finite-difference tests) are supported.

use std::sync::Arc;

use candle_core::backend::BackendStorage;
use candle_core::{CpuStorage, CustomOp3, DType, Layout, Shape, Tensor, WithDType};
use num_traits::Float;
use rayon::prelude::*;

use super::super::layout::TreeLayout;

/// Query rows the backward handles together (see [`TreeAttention::backward_block`]).
const QUERY_BLOCK: usize = 8;

/// Scratch of one query block, reused block after block: the keys it attends to,
/// each row's probabilities and `dO·O`.
#[derive(Debug)]
struct QueryBlock<T> {
    keys: Vec<usize>,
    p: Vec<Vec<T>>,
    big_d: Vec<T>,
}

impl<T> Default for QueryBlock<T> {
    fn default() -> Self {
        QueryBlock {
            keys: Vec::new(),
            p: Vec::new(),
            big_d: Vec::new(),
        }
    }
}

/// The op; holds the layout so the backward sees the same mask.
#[derive(Debug, Clone)]
pub struct TreeAttention {
    layout: Arc<TreeLayout>,
    heads: usize,
    kv_heads: usize,
    head_dim: usize,
}

/// `softmax(q kᵀ / sqrt(d)) v` over each row's ancestors: `q [rows, heads, d]`,
/// `k, v [rows, kv_heads, d]` (contiguous), result `[rows, heads, d]`.
pub fn tree_attention(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    layout: &Arc<TreeLayout>,
) -> candle_core::Result<Tensor> {
    let (rows, heads, head_dim) = q.dims3()?;
    let (krows, kv_heads, kd) = k.dims3()?;
    if krows != rows || kd != head_dim || v.dims3()? != (rows, kv_heads, head_dim) {
        candle_core::bail!(
            "tree attention: q {:?}, k {:?}, v {:?} do not match",
            q.dims(),
            k.dims(),
            v.dims()
        );
    }
    if rows != layout.len() || kv_heads == 0 || heads % kv_heads != 0 {
        candle_core::bail!(
            "tree attention: {rows} rows for a layout of {}, {heads} heads over {kv_heads} KV heads",
            layout.len()
        );
    }
    let op = TreeAttention {
        layout: layout.clone(),
        heads,
        kv_heads,
        head_dim,
    };
    q.contiguous()?
        .apply_op3(&k.contiguous()?, &v.contiguous()?, op)
}

/// `a · b` with eight independent accumulators, so the compiler vectorises it (a
/// single running sum is a dependency chain it must keep in order). Fixed order: the
/// result depends on nothing but the inputs.
#[inline]
fn dot<T: Float>(a: &[T], b: &[T]) -> T {
    let mut acc = [T::zero(); 8];
    let (ca, cb) = (a.chunks_exact(8), b.chunks_exact(8));
    let tail: T = ca
        .remainder()
        .iter()
        .zip(cb.remainder())
        .fold(T::zero(), |s, (&x, &y)| x.mul_add(y, s));
    for (x, y) in ca.zip(cb) {
        for k in 0..8 {
            acc[k] = x[k].mul_add(y[k], acc[k]);
        }
    }
    ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7])) + tail
}

/// Scores to probabilities, in place (shifted by the max, in order).
fn softmax_in_place<T: Float>(p: &mut [T]) {
    let max = p.iter().fold(T::neg_infinity(), |m, &x| m.max(x));
    let mut sum = T::zero();
    for x in p.iter_mut() {
        *x = (*x - max).exp();
        sum = sum + *x;
    }
    let inv = T::one() / sum;
    for x in p.iter_mut() {
        *x = *x * inv;
    }
}

/// `y += a · x`.
#[inline]
fn axpy<T: Float>(y: &mut [T], a: T, x: &[T]) {
    for (y, &x) in y.iter_mut().zip(x) {
        *y = a.mul_add(x, *y);
    }
}

fn contiguous<'a, T: WithDType>(s: &'a CpuStorage, l: &Layout) -> candle_core::Result<&'a [T]> {
    match l.contiguous_offsets() {
        Some((a, b)) => Ok(&s.as_slice::<T>()?[a..b]),
        None => candle_core::bail!("tree attention needs contiguous inputs"),
    }
}

impl TreeAttention {
    fn group(&self) -> usize {
        self.heads / self.kv_heads
    }

    /// Row `i`, head `h`: the scores over its allowed keys (scaled), softmaxed in place.
    fn probabilities<T: Float>(&self, q: &[T], k: &[T], i: usize, h: usize, p: &mut Vec<T>) {
        let d = self.head_dim;
        let scale = T::from(1.0 / (d as f64).sqrt()).expect("a float");
        let g = h / self.group();
        let q_i = &q[(i * self.heads + h) * d..][..d];
        p.clear();
        for r in self.layout.runs(i) {
            for j in r.start as usize..r.end as usize {
                p.push(dot(q_i, &k[(j * self.kv_heads + g) * d..][..d]) * scale);
            }
        }
        softmax_in_place(p);
    }

    fn forward<T: Float + Send + Sync>(&self, q: &[T], k: &[T], v: &[T]) -> Vec<T> {
        let d = self.head_dim;
        let mut out = vec![T::zero(); q.len()];
        out.par_chunks_mut(d)
            .enumerate()
            .for_each_init(Vec::new, |p, (idx, o)| {
                let (i, h) = (idx / self.heads, idx % self.heads);
                let g = h / self.group();
                self.probabilities(q, k, i, h, p);
                let mut at = 0;
                for r in self.layout.runs(i) {
                    for j in r.start as usize..r.end as usize {
                        axpy(o, p[at], &v[(j * self.kv_heads + g) * d..][..d]);
                        at += 1;
                    }
                }
            });
        out
    }

    /// `(dq, dk, dv)` for upstream gradient `dout` and the forward's result `out`.
    fn backward<T: Float + Send + Sync>(
        &self,
        q: &[T],
        k: &[T],
        v: &[T],
        out: &[T],
        dout: &[T],
    ) -> (Vec<T>, Vec<T>, Vec<T>) {
        let (d, rows) = (self.head_dim, self.layout.len());
        // One query head per task: its dq rows, and its share of its KV head's dk, dv
        // (summed over the group below, in head order).
        let per_head: Vec<(Vec<T>, Vec<T>, Vec<T>)> = (0..self.heads)
            .into_par_iter()
            .map(|h| {
                let mut dq = vec![T::zero(); rows * d];
                let mut dk = vec![T::zero(); rows * d];
                let mut dv = vec![T::zero(); rows * d];
                let mut block = QueryBlock::default();
                let mut i = 0;
                while i < rows {
                    // A block of consecutive rows, each the child of the one before:
                    // they attend to the same keys, except that row `i + t` stops
                    // `b − 1 − t` keys short of the last row's. Each key is then loaded
                    // once for the block instead of once per row.
                    let mut b = 1;
                    while b < QUERY_BLOCK
                        && i + b < rows
                        && self.layout.parent(i + b) == Some(i + b - 1)
                    {
                        b += 1;
                    }
                    self.backward_block(
                        q, k, v, out, dout, h, i, b, &mut block, &mut dq, &mut dk, &mut dv,
                    );
                    i += b;
                }
                (dq, dk, dv)
            })
            .collect();
        let mut dq = vec![T::zero(); q.len()];
        let mut dk = vec![T::zero(); k.len()];
        let mut dv = vec![T::zero(); v.len()];
        for (h, (hq, hk, hv)) in per_head.iter().enumerate() {
            let g = h / self.group();
            for i in 0..rows {
                dq[(i * self.heads + h) * d..][..d].copy_from_slice(&hq[i * d..][..d]);
                let at = (i * self.kv_heads + g) * d;
                for c in 0..d {
                    dk[at + c] = dk[at + c] + hk[i * d + c];
                    dv[at + c] = dv[at + c] + hv[i * d + c];
                }
            }
        }
        (dq, dk, dv)
    }

    /// The backward of query rows `i..i + b` of head `h` (a block as built in
    /// [`Self::backward`]): their dq rows, and their contributions to dk and dv.
    #[allow(clippy::too_many_arguments)]
    fn backward_block<T: Float>(
        &self,
        q: &[T],
        k: &[T],
        v: &[T],
        out: &[T],
        dout: &[T],
        h: usize,
        i: usize,
        b: usize,
        block: &mut QueryBlock<T>,
        dq: &mut [T],
        dk: &mut [T],
        dv: &mut [T],
    ) {
        let d = self.head_dim;
        let g = h / self.group();
        let scale = T::from(1.0 / (d as f64).sqrt()).expect("a float");
        let last = i + b - 1;
        block.keys.clear();
        block.keys.extend(
            self.layout
                .runs(last)
                .iter()
                .flat_map(|r| r.start as usize..r.end as usize),
        );
        let keys = std::mem::take(&mut block.keys);
        // Row i + t sees keys[..n - (b - 1 - t)].
        let n = keys.len();
        let seen = |t: usize| n - (b - 1 - t);
        let at = |t: usize| ((i + t) * self.heads + h) * d;
        block.p.resize_with(b, Vec::new);
        block.big_d.clear();
        // Scores, one key at a time for the whole block, then each row's softmax.
        for t in 0..b {
            block.p[t].clear();
        }
        for (a, &j) in keys.iter().enumerate() {
            let k_j = &k[(j * self.kv_heads + g) * d..][..d];
            for t in 0..b {
                if a < seen(t) {
                    block.p[t].push(dot(&q[at(t)..][..d], k_j) * scale);
                }
            }
        }
        for t in 0..b {
            softmax_in_place(&mut block.p[t]);
            block
                .big_d
                .push(dot(&dout[at(t)..][..d], &out[at(t)..][..d]));
        }
        for (a, &j) in keys.iter().enumerate() {
            let at_kv = (j * self.kv_heads + g) * d;
            let (k_j, v_j) = (&k[at_kv..][..d], &v[at_kv..][..d]);
            for t in 0..b {
                if a >= seen(t) {
                    continue;
                }
                let p = block.p[t][a];
                let do_t = &dout[at(t)..][..d];
                let ds = p * (dot(do_t, v_j) - block.big_d[t]) * scale;
                axpy(&mut dq[(i + t) * d..][..d], ds, k_j);
                axpy(&mut dk[j * d..][..d], ds, &q[at(t)..][..d]);
                axpy(&mut dv[j * d..][..d], p, do_t);
            }
        }
        block.keys = keys;
    }

    fn grads<T: Float + WithDType + Send + Sync>(
        &self,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        res: &Tensor,
        grad: &Tensor,
    ) -> candle_core::Result<(Tensor, Tensor, Tensor)> {
        let flat = |t: &Tensor| t.contiguous()?.flatten_all()?.to_vec1::<T>();
        let (dq, dk, dv) =
            self.backward(&flat(q)?, &flat(k)?, &flat(v)?, &flat(res)?, &flat(grad)?);
        Ok((
            Tensor::from_vec(dq, q.shape(), q.device())?,
            Tensor::from_vec(dk, k.shape(), k.device())?,
            Tensor::from_vec(dv, v.shape(), v.device())?,
        ))
    }
}

impl CustomOp3 for TreeAttention {
    fn name(&self) -> &'static str {
        "tree-attention"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
        s3: &CpuStorage,
        l3: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        let shape = l1.shape().clone();
        let out = match s1.dtype() {
            DType::F32 => f32::to_cpu_storage_owned(self.forward(
                contiguous::<f32>(s1, l1)?,
                contiguous::<f32>(s2, l2)?,
                contiguous::<f32>(s3, l3)?,
            )),
            DType::F64 => f64::to_cpu_storage_owned(self.forward(
                contiguous::<f64>(s1, l1)?,
                contiguous::<f64>(s2, l2)?,
                contiguous::<f64>(s3, l3)?,
            )),
            other => candle_core::bail!("tree attention runs in f32 or f64, not {other:?}"),
        };
        Ok((out, shape))
    }

    fn bwd(
        &self,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        res: &Tensor,
        grad: &Tensor,
    ) -> candle_core::Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
        let (dq, dk, dv) = match q.dtype() {
            DType::F32 => self.grads::<f32>(q, k, v, res, grad)?,
            DType::F64 => self.grads::<f64>(q, k, v, res, grad)?,
            other => candle_core::bail!("tree attention runs in f32 or f64, not {other:?}"),
        };
        Ok((Some(dq), Some(dk), Some(dv)))
    }
}
