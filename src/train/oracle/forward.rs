//! The differentiable decoder: the same network as [`Model::forward`](crate::model::Model)
//! built only from candle ops that have a backward, plus our tree attention.
//!
//! candle's fused `rms_norm`, `softmax_last_dim` and `rope*` kernels and `QMatMul`
//! apply without a backward and would stop gradients silently, so each is composed
//! here: RMSNorm from `sqr`/`mean`/`sqrt`/`recip`, RoPE from `narrow`/`mul`/`cat`
//! with precomputed tables; attention ([`tree_attention`]) and the target's
//! log-probability and entropy ([`target_logprob_and_entropy`]) are ops with
//! backwards of their own that keep no `[rows, rows]` or `[rows, vocab]` intermediates. A test checks
//! that every weight gets a gradient.
//!
//! Input is a packed batch ([`PackedBatch`]): token rows in a [`TreeLayout`](super::super::layout::TreeLayout) (a row
//! attends to its ancestors and itself, its position is its depth) and the rows to
//! score — the hidden state of row `r` predicts the token `target` after it. Output
//! is the log-probability of each target under `logits / temperature` and, on
//! request, each scored row's entropy, both as graph tensors.

use candle_core::{DType, Device, Tensor, D};

use super::super::error::TrainError;
use super::super::pack::{check_batch, PackedBatch};
use super::super::params::Params;
use super::attention::tree_attention;
use super::scoring::target_logprob_and_entropy;
use crate::model::RopeStyle;

/// Graph tensors of a forward: `logp[m]` and, if asked, `entropy[m]`.
#[derive(Debug)]
pub struct Scored {
    /// `[m]`: the log-probability of each target under `logits / temperature`, in the
    /// order of `score_rows` (nats, ≤ 0).
    pub logp: Tensor,
    /// `[m]`: the entropy (nats) of each scored row's distribution under the same
    /// temperature; `None` unless the forward was asked for it.
    pub entropy: Option<Tensor>,
}

fn rms_norm(x: &Tensor, w: &Tensor, eps: f64) -> candle_core::Result<Tensor> {
    let inv = (x.sqr()?.mean_keepdim(D::Minus1)? + eps)?.sqrt()?.recip()?;
    x.broadcast_mul(&inv)?.broadcast_mul(w)
}

fn linear(x: &Tensor, w: &Tensor) -> candle_core::Result<Tensor> {
    x.matmul(&w.t()?)
}

/// RoPE tables for `positions`: `(cos, sin)`, each `[rows, head_dim / 2]`, computed in
/// f32 exactly as the engine's kernel computes its angles.
fn rope_tables(
    positions: &[u32],
    config: &crate::model::ModelConfig,
    dtype: DType,
) -> candle_core::Result<(Tensor, Tensor)> {
    let half = config.head_dim / 2;
    // The engine's own frequencies (theta and scaling), so the oracle rotates alike.
    let inv = crate::model::rope::inverse_frequencies(
        config.head_dim,
        config.rope_theta,
        &config.rope_scaling,
    );
    let mut cos = Vec::with_capacity(positions.len() * half);
    let mut sin = Vec::with_capacity(positions.len() * half);
    for &p in positions {
        for f in &inv {
            let (s, c) = (p as f32 * f).sin_cos();
            cos.push(c);
            sin.push(s);
        }
    }
    let shape = (positions.len(), half);
    Ok((
        Tensor::from_vec(cos, shape, &Device::Cpu)?.to_dtype(dtype)?,
        Tensor::from_vec(sin, shape, &Device::Cpu)?.to_dtype(dtype)?,
    ))
}

/// Rotates `x [rows, heads, head_dim]` by the tables (`[rows, head_dim/2]`).
fn rope(x: &Tensor, cos: &Tensor, sin: &Tensor, style: RopeStyle) -> candle_core::Result<Tensor> {
    let (rows, heads, d) = x.dims3()?;
    let half = d / 2;
    match style {
        RopeStyle::HalfSplit => {
            let (c, s) = (cos.unsqueeze(1)?, sin.unsqueeze(1)?);
            let a = x.narrow(2, 0, half)?;
            let b = x.narrow(2, half, half)?;
            let ra = (a.broadcast_mul(&c)? - b.broadcast_mul(&s)?)?;
            let rb = (a.broadcast_mul(&s)? + b.broadcast_mul(&c)?)?;
            Tensor::cat(&[ra, rb], 2)
        }
        RopeStyle::Interleaved => {
            let pairs = x.reshape((rows, heads, half, 2))?;
            let (c, s) = (
                cos.unsqueeze(1)?.unsqueeze(3)?,
                sin.unsqueeze(1)?.unsqueeze(3)?,
            );
            let a = pairs.narrow(3, 0, 1)?;
            let b = pairs.narrow(3, 1, 1)?;
            let ra = (a.broadcast_mul(&c)? - b.broadcast_mul(&s)?)?;
            let rb = (a.broadcast_mul(&s)? + b.broadcast_mul(&c)?)?;
            Tensor::cat(&[ra, rb], 3)?.reshape((rows, heads, d))
        }
    }
}

impl Params {
    /// The forward over `batch`: log-probabilities of its targets under
    /// `logits / temperature`, and each scored row's entropy if `want_entropy`.
    pub fn score(
        &self,
        batch: &PackedBatch,
        temperature: f64,
        want_entropy: bool,
    ) -> Result<Scored, TrainError> {
        let c = &self.config;
        check_batch(c, batch, temperature)?;
        let rows = batch.tokens.len();
        let dtype = self.dtype();
        let dev = Device::Cpu;
        let ids = Tensor::from_slice(&batch.tokens, rows, &dev)?;
        let (cos, sin) = rope_tables(batch.layout.positions(), c, dtype)?;
        let mut x = self.embedding.as_tensor().index_select(&ids, 0)?;
        for l in &self.layers {
            let h = rms_norm(&x, &l.attn_norm, c.rms_norm_eps)?;
            let mut q = linear(&h, &l.q)?;
            let mut k = linear(&h, &l.k)?;
            let mut v = linear(&h, &l.v)?;
            if let Some([bq, bk, bv]) = &l.qkv_bias {
                q = q.broadcast_add(bq)?;
                k = k.broadcast_add(bk)?;
                v = v.broadcast_add(bv)?;
            }
            let q = rope(
                &q.reshape((rows, c.num_heads, c.head_dim))?,
                &cos,
                &sin,
                c.rope_style,
            )?;
            let k = rope(
                &k.reshape((rows, c.num_kv_heads, c.head_dim))?,
                &cos,
                &sin,
                c.rope_style,
            )?;
            let v = v.reshape((rows, c.num_kv_heads, c.head_dim))?;
            let attn = tree_attention(&q, &k, &v, &batch.layout)?.reshape((rows, c.q_dim()))?;
            x = (x + linear(&attn, &l.o)?)?;
            let h = rms_norm(&x, &l.ffn_norm, c.rms_norm_eps)?;
            let g = linear(&h, &l.gate)?.silu()?;
            let u = linear(&h, &l.up)?;
            x = (x + linear(&(g * u)?, &l.down)?)?;
        }
        // Only the scored rows pay for the vocabulary projection.
        let at = Tensor::from_slice(&batch.score_rows, batch.score_rows.len(), &dev)?;
        let hs = rms_norm(&x.index_select(&at, 0)?, &self.final_norm, c.rms_norm_eps)?;
        let logits = linear(&hs, self.head())?;
        let scored = target_logprob_and_entropy(&logits, &batch.targets, temperature)?;
        let logp = scored.narrow(1, 0, 1)?.squeeze(1)?;
        let entropy = if want_entropy {
            Some(scored.narrow(1, 1, 1)?.squeeze(1)?)
        } else {
            None
        };
        Ok(Scored { logp, entropy })
    }
}
