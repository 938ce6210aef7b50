//! One transformer block's backward, from what a recording forward of the block kept
//! ([`LayerBuffers`], [`LayerRecord`]): the gradient of the block's output in, the
//! gradient of its input out (in place), every weight's gradient added to its buffer.
//!
//! With `x_mid = x + attn(h1)·W_oᵀ`, `h1 = rms(x)`, `out = x_mid + act·W_downᵀ`,
//! `act = silu(g) ∘ u`, `g, u = h2·W_gateᵀ, h2·W_upᵀ`, `h2 = rms(x_mid)`, walked from the
//! top: each linear layer gives `dX = dY·W` and `dW += dYᵀ·X` (`matmul.rs`), RMSNorm,
//! SwiGLU and RoPE (a rotation by the opposite angle) are row-wise, and attention's
//! backward is tiled into matrix products (`attention_backward.rs`).

use rayon::prelude::*;

use super::super::error::TrainError;
use super::super::layout::TreeLayout;
use super::super::params::LayerParams;
use super::attention_backward::{tree_attention_backward, Heads, Saved};
use super::grads::{with_f32, Grads, LayerSlots};
use super::matmul::{input_grad, weight_grad};
use crate::model::layer_forward::{LayerBuffers, LayerRecord};
use crate::model::ops::Rope;
use crate::model::ModelConfig;

/// What the backward of one block reads besides its weights.
pub struct BlockInputs<'a> {
    /// The decoder's sizes and RMSNorm epsilon.
    pub config: &'a ModelConfig,
    /// Which rows attend to which (the packed batch's forest).
    pub layout: &'a TreeLayout,
    /// The model's RoPE, to rotate the query and key gradients back.
    pub rope: &'a Rope,
    /// Per row, the `(sin, cos)` of each RoPE frequency at its position
    /// ([`Rope::angles`]), as the forward used them.
    pub angles: &'a [Vec<(f32, f32)>],
    /// The block's input (the residual stream before it).
    pub x_in: &'a [f32],
    /// The block's activations the recording forward left in its buffers (queries,
    /// keys, values, attention output, MLP input and projections).
    pub bufs: &'a LayerBuffers,
    /// The activations the recording forward kept only for the backward (first norm's
    /// output, mid-block residual, SwiGLU output).
    pub record: &'a LayerRecord,
    /// The block's attention RMSNorm gain, `[hidden]`.
    pub attn_norm: &'a [f32],
    /// The block's MLP RMSNorm gain, `[hidden]`.
    pub ffn_norm: &'a [f32],
}

/// Scratch reused block after block.
#[derive(Debug, Default)]
pub struct BlockScratch {
    d_ff_a: Vec<f32>,
    d_ff_b: Vec<f32>,
    d_hidden: Vec<f32>,
    d_attn: Vec<f32>,
}

/// `dx` (`[rows, hidden]`): the gradient of the block's output in, of its input out.
pub fn block_backward(
    inp: &BlockInputs,
    weights: &LayerParams,
    slots: &LayerSlots,
    dx: &mut [f32],
    grads: &mut Grads,
    scratch: &mut BlockScratch,
) -> Result<(), TrainError> {
    let c = inp.config;
    let (hidden, q_dim, ff) = (c.hidden_size, c.q_dim(), c.intermediate_size);
    let rows = inp.x_in.len() / hidden;
    scratch.d_ff_a.resize(rows * ff, 0.0);
    scratch.d_ff_b.resize(rows * ff, 0.0);
    scratch.d_hidden.resize(rows * hidden, 0.0);
    scratch.d_attn.resize(rows * q_dim, 0.0);
    mlp_backward(inp, weights, slots, dx, grads, scratch)?;
    attention_sublayer_backward(inp, weights, slots, dx, grads, scratch)
}

/// The MLP half, `out = x_mid + act·W_downᵀ` with `act = silu(g)·u`: `dx`
/// holds `d out` on entry and `d x_mid` on return; adds the down, gate, up
/// and MLP-norm gradients. `scratch` is sized by [`block_backward`].
fn mlp_backward(
    inp: &BlockInputs,
    weights: &LayerParams,
    slots: &LayerSlots,
    dx: &mut [f32],
    grads: &mut Grads,
    scratch: &mut BlockScratch,
) -> Result<(), TrainError> {
    let c = inp.config;
    let (hidden, ff) = (c.hidden_size, c.intermediate_size);
    let rows = inp.x_in.len() / hidden;
    let (b, rec) = (inp.bufs, inp.record);
    let BlockScratch {
        d_ff_a: d_act,
        d_ff_b: d_up,
        d_hidden: dh,
        ..
    } = scratch;

    with_f32(&weights.down, |w| {
        input_grad(dx, w, rows, hidden, ff, d_act, false)
    })?;
    weight_grad(dx, &rec.act, rows, hidden, ff, &mut grads.bufs[slots.down]);
    // act = silu(g)·u: d_act becomes dg, d_up du.
    swiglu_backward(&b.g, &b.u, d_act, d_up);
    with_f32(&weights.gate, |w| {
        input_grad(d_act, w, rows, ff, hidden, dh, false)
    })?;
    with_f32(&weights.up, |w| {
        input_grad(d_up, w, rows, ff, hidden, dh, true)
    })?;
    weight_grad(d_act, &b.h, rows, ff, hidden, &mut grads.bufs[slots.gate]);
    weight_grad(d_up, &b.h, rows, ff, hidden, &mut grads.bufs[slots.up]);
    rms_norm_backward(
        &rec.x_mid,
        inp.ffn_norm,
        c.rms_norm_eps,
        dh,
        dx,
        &mut grads.bufs[slots.ffn_norm],
    );
    Ok(())
}

/// The attention half, `x_mid = x + attn(h1)·W_oᵀ` with `h1 = rms(x)`: `dx`
/// holds `d x_mid` on entry and `d x` on return; adds the o, q, k, v (and
/// bias) and attention-norm gradients. `scratch` is sized by [`block_backward`].
fn attention_sublayer_backward(
    inp: &BlockInputs,
    weights: &LayerParams,
    slots: &LayerSlots,
    dx: &mut [f32],
    grads: &mut Grads,
    scratch: &mut BlockScratch,
) -> Result<(), TrainError> {
    let c = inp.config;
    let (hidden, q_dim, kv_dim) = (c.hidden_size, c.q_dim(), c.kv_dim());
    let rows = inp.x_in.len() / hidden;
    let (b, rec) = (inp.bufs, inp.record);
    let BlockScratch {
        d_hidden: dh,
        d_attn,
        ..
    } = scratch;

    with_f32(&weights.o, |w| {
        input_grad(dx, w, rows, hidden, q_dim, d_attn, false)
    })?;
    weight_grad(dx, &b.attn, rows, hidden, q_dim, &mut grads.bufs[slots.o]);
    let heads = Heads {
        heads: c.num_heads,
        kv_heads: c.num_kv_heads,
        head_dim: c.head_dim,
    };
    let (mut dq, mut dk, dv) = tree_attention_backward(
        inp.layout,
        heads,
        Saved {
            q: &b.q,
            k: &b.k,
            v: &b.v,
            out: &b.attn,
            dout: d_attn,
        },
    );
    for r in 0..rows {
        inp.rope
            .rotate_back(&mut dq[r * q_dim..(r + 1) * q_dim], &inp.angles[r]);
        inp.rope
            .rotate_back(&mut dk[r * kv_dim..(r + 1) * kv_dim], &inp.angles[r]);
    }
    if let Some([bq, bk, bv]) = slots.bias {
        for (slot, d, width) in [(bq, &dq, q_dim), (bk, &dk, kv_dim), (bv, &dv, kv_dim)] {
            add_row_sums(&mut grads.bufs[slot], d, width);
        }
    }
    with_f32(&weights.q, |w| {
        input_grad(&dq, w, rows, q_dim, hidden, dh, false)
    })?;
    with_f32(&weights.k, |w| {
        input_grad(&dk, w, rows, kv_dim, hidden, dh, true)
    })?;
    with_f32(&weights.v, |w| {
        input_grad(&dv, w, rows, kv_dim, hidden, dh, true)
    })?;
    weight_grad(&dq, &rec.h1, rows, q_dim, hidden, &mut grads.bufs[slots.q]);
    weight_grad(&dk, &rec.h1, rows, kv_dim, hidden, &mut grads.bufs[slots.k]);
    weight_grad(&dv, &rec.h1, rows, kv_dim, hidden, &mut grads.bufs[slots.v]);
    rms_norm_backward(
        inp.x_in,
        inp.attn_norm,
        c.rms_norm_eps,
        dh,
        dx,
        &mut grads.bufs[slots.attn_norm],
    );
    Ok(())
}

/// A bias's gradient: adds each `width`-wide row of `d` to `g`, first row
/// first.
fn add_row_sums(g: &mut [f32], d: &[f32], width: usize) {
    for row in d.chunks_exact(width) {
        for (g, &v) in g.iter_mut().zip(row) {
            *g += v;
        }
    }
}

/// SwiGLU's backward: `act = silu(g)·u` with `silu(g) = g·σ(g)`; `d_act` is replaced by
/// `dg = d_act·u·σ(g)(1 + g(1 − σ(g)))` and `du` written as `d_act·silu(g)`.
pub fn swiglu_backward(g: &[f32], u: &[f32], d_act: &mut [f32], du: &mut [f32]) {
    // Elementwise, in parallel chunks (an `exp` each: 3M per layer at 2,000 rows).
    const CHUNK: usize = 1 << 14;
    d_act
        .par_chunks_mut(CHUNK)
        .zip(du.par_chunks_mut(CHUNK))
        .zip(g.par_chunks(CHUNK).zip(u.par_chunks(CHUNK)))
        .for_each(|((d_act, du), (g, u))| {
            for (((&g, &u), d), du) in g.iter().zip(u).zip(d_act.iter_mut()).zip(du.iter_mut()) {
                let s = 1.0 / (1.0 + (-g).exp());
                *du = *d * g * s;
                *d = *d * u * s * (1.0 + g * (1.0 - s));
            }
        });
}

/// RMSNorm's backward, row by row: `y = x·s·w` with `s = 1/sqrt(mean(x²) + eps)`.
/// `dx += s·(w∘dy) − x·s³·Σ(w∘dy∘x)/n`; `dw += Σ_rows dy∘x·s`.
pub fn rms_norm_backward(
    x: &[f32],
    w: &[f32],
    eps: f64,
    dy: &[f32],
    dx: &mut [f32],
    dw: &mut [f32],
) {
    let n = w.len();
    for ((x, dy), dx) in x
        .chunks_exact(n)
        .zip(dy.chunks_exact(n))
        .zip(dx.chunks_exact_mut(n))
    {
        let sum_sq: f64 = x.iter().map(|&v| (v as f64) * (v as f64)).sum();
        let s = 1.0 / (sum_sq / n as f64 + eps).sqrt();
        let dot: f64 = x
            .iter()
            .zip(dy)
            .zip(w)
            .map(|((&x, &dy), &w)| (x as f64) * (dy as f64) * (w as f64))
            .sum();
        let k = dot * s * s * s / n as f64;
        for (i, ((&x, &dy), dx)) in x.iter().zip(dy).zip(dx.iter_mut()).enumerate() {
            *dx += (s * (w[i] as f64) * (dy as f64) - (x as f64) * k) as f32;
            dw[i] += (dy as f64 * x as f64 * s) as f32;
        }
    }
}
