//! Log-probability of the target token and entropy of each row of logits, fused into
//! one candle op with its own backward: `logits [m, vocab]` → `[m, 2]` holding
//! `(log p_t, H)` of `p = softmax(logits / T)`.
//!
//! Composed from candle ops this needs about ten `[m, vocab]` intermediates kept for
//! the backward (the shift, `exp`, the log-softmax, `p`, `p·log p`, and their
//! gradients) — 1.4 GB each for 7,000 scored rows of a 49k vocabulary, the largest
//! part of an update's memory and a fifth of its time. Here nothing is kept: the
//! backward recomputes each row's log-sum-exp from the logits. With `z = logits / T`,
//! `log p_k = z_k − lse`, `H = −Σ p log p`:
//!
//! `∂ log p_t / ∂z_k = δ_kt − p_k`, `∂H / ∂z_k = −p_k (log p_k + H)`, and `∂z/∂logits = 1/T`.
//!
//! Rows are independent (parallel over rows); each row's arithmetic has a fixed order.

use std::sync::Arc;

use candle_core::backend::BackendStorage;
use candle_core::{CpuStorage, CustomOp1, DType, Layout, Shape, Tensor, WithDType};
use num_traits::Float;
use rayon::prelude::*;

use crate::model::TokenId;

/// The op: targets and `1/T`.
#[derive(Debug, Clone)]
struct TargetScore {
    targets: Arc<Vec<TokenId>>,
    inv_t: f64,
}

/// `(log p_target, entropy)` of each row of `logits / temperature`, as `[m, 2]`.
pub fn target_logprob_and_entropy(
    logits: &Tensor,
    targets: &[TokenId],
    temperature: f64,
) -> candle_core::Result<Tensor> {
    let (m, vocab) = logits.dims2()?;
    if targets.len() != m {
        candle_core::bail!("{} targets for {m} rows of logits", targets.len());
    }
    if let Some(&t) = targets.iter().find(|&&t| t as usize >= vocab) {
        candle_core::bail!("target {t} outside a vocabulary of {vocab}");
    }
    logits.contiguous()?.apply_op1(TargetScore {
        targets: Arc::new(targets.to_vec()),
        inv_t: 1.0 / temperature,
    })
}

/// A row's log-sum-exp of `z = x · inv_t`, summed in f64 (49k terms in f32 would
/// lose about five digits), and its entropy `−Σ p log p`, also summed in f64.
fn lse_and_entropy<T: Float>(row: &[T], inv_t: T) -> (T, T) {
    let max = row.iter().fold(T::neg_infinity(), |m, &x| m.max(x * inv_t));
    let sum: f64 = row
        .iter()
        .map(|&x| (x * inv_t - max).exp().to_f64().unwrap_or(0.0))
        .sum();
    let lse = max + T::from(sum.ln()).expect("a float");
    let h: f64 = row
        .iter()
        .map(|&x| {
            let lp = x * inv_t - lse;
            -(lp.exp() * lp).to_f64().unwrap_or(0.0)
        })
        .sum();
    (lse, T::from(h).expect("a float"))
}

impl TargetScore {
    fn forward<T: Float + Send + Sync>(&self, logits: &[T], vocab: usize) -> Vec<T> {
        let inv_t = T::from(self.inv_t).expect("a float");
        let mut out = vec![T::zero(); self.targets.len() * 2];
        out.par_chunks_mut(2)
            .zip(logits.par_chunks(vocab))
            .zip(self.targets.par_iter())
            .for_each(|((o, row), &t)| {
                let (lse, h) = lse_and_entropy(row, inv_t);
                o[0] = row[t as usize] * inv_t - lse;
                o[1] = h;
            });
        out
    }

    fn backward<T: Float + Send + Sync>(&self, logits: &[T], grad: &[T], vocab: usize) -> Vec<T> {
        let inv_t = T::from(self.inv_t).expect("a float");
        let mut out = vec![T::zero(); logits.len()];
        out.par_chunks_mut(vocab)
            .zip(logits.par_chunks(vocab))
            .zip(grad.par_chunks(2))
            .zip(self.targets.par_iter())
            .for_each(|(((d, row), g), &t)| {
                let (gl, gh) = (g[0], g[1]);
                let (lse, h) = lse_and_entropy(row, inv_t);
                for (d, &x) in d.iter_mut().zip(row) {
                    let lp = x * inv_t - lse;
                    let p = lp.exp();
                    *d = (-gl * p - gh * p * (lp + h)) * inv_t;
                }
                d[t as usize] = d[t as usize] + gl * inv_t;
            });
        out
    }
}

fn slice<'a, T: WithDType>(s: &'a CpuStorage, l: &Layout) -> candle_core::Result<&'a [T]> {
    match l.contiguous_offsets() {
        Some((a, b)) => Ok(&s.as_slice::<T>()?[a..b]),
        None => candle_core::bail!("target scoring needs contiguous logits"),
    }
}

impl CustomOp1 for TargetScore {
    fn name(&self) -> &'static str {
        "target-logprob-entropy"
    }

    fn cpu_fwd(&self, s: &CpuStorage, l: &Layout) -> candle_core::Result<(CpuStorage, Shape)> {
        let (m, vocab) = l.shape().dims2()?;
        let out = match s.dtype() {
            DType::F32 => f32::to_cpu_storage_owned(self.forward(slice::<f32>(s, l)?, vocab)),
            DType::F64 => f64::to_cpu_storage_owned(self.forward(slice::<f64>(s, l)?, vocab)),
            other => candle_core::bail!("target scoring runs in f32 or f64, not {other:?}"),
        };
        Ok((out, Shape::from((m, 2))))
    }

    fn bwd(
        &self,
        arg: &Tensor,
        _res: &Tensor,
        grad: &Tensor,
    ) -> candle_core::Result<Option<Tensor>> {
        let vocab = arg.dim(1)?;
        let flat = |t: &Tensor| t.contiguous()?.flatten_all();
        let d = match arg.dtype() {
            DType::F32 => Tensor::from_vec(
                self.backward(
                    &flat(arg)?.to_vec1::<f32>()?,
                    &flat(grad)?.to_vec1::<f32>()?,
                    vocab,
                ),
                arg.shape(),
                arg.device(),
            )?,
            DType::F64 => Tensor::from_vec(
                self.backward(
                    &flat(arg)?.to_vec1::<f64>()?,
                    &flat(grad)?.to_vec1::<f64>()?,
                    vocab,
                ),
                arg.shape(),
                arg.device(),
            )?,
            other => candle_core::bail!("target scoring runs in f32 or f64, not {other:?}"),
        };
        Ok(Some(d))
    }
}
