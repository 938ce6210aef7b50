//! Optimisers over [`Params`]: plain SGD (the oracle: each weight moves by exactly
//! `−lr × gradient`) and AdamW as PyTorch computes it, with global grad-norm clipping
//! and a constant or linear warm-up learning rate. The state (step, moments) is saved
//! and restored with a checkpoint.
//!
//! AdamW, per weight: `w ← w − lr·λ·w`; `m ← β1 m + (1−β1) g`; `v ← β2 v + (1−β2) g²`;
//! `w ← w − lr · (m / (1−β1^t)) / (sqrt(v / (1−β2^t)) + ε)` (torch.optim.AdamW).
//! Clipping as `torch.nn.utils.clip_grad_norm_`: gradients scale by
//! `min(1, max_norm / (‖g‖ + 1e-6))`.

use candle_core::{CpuStorage, Device, Storage, Tensor, Var};
use serde::{Deserialize, Serialize};

use super::error::TrainError;
use super::params::Params;

/// Which update rule.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OptimizerKind {
    /// Plain gradient descent, `w ← w − lr·g`; no state, no weight decay (the
    /// oracle the tests compare gradients with).
    Sgd,
    /// AdamW with decoupled weight decay, as `torch.optim.AdamW` computes it.
    AdamW,
}

impl std::str::FromStr for OptimizerKind {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "sgd" => Ok(OptimizerKind::Sgd),
            "adamw" => Ok(OptimizerKind::AdamW),
            other => Err(format!("unknown optimizer {other:?} (adamw, sgd)")),
        }
    }
}

/// Optimiser settings; the defaults are the Tree-GRPO reference's (verl's actor).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct OptimizerConfig {
    /// The update rule (`sgd` or `adamw` in JSON and on the command line).
    pub kind: OptimizerKind,
    /// Peak learning rate (reached after `warmup_steps`).
    pub lr: f64,
    /// AdamW's decay of the first moment (mean of gradients); unused by SGD.
    pub beta1: f64,
    /// AdamW's decay of the second moment (mean of squared gradients); unused by SGD.
    pub beta2: f64,
    /// AdamW's term added to the denominator's square root, so a weight whose
    /// gradients are all zero does not divide by zero; unused by SGD.
    pub eps: f64,
    /// AdamW's decoupled weight decay `λ`: each step first shrinks every weight by
    /// `lr·λ·w`; unused by SGD.
    pub weight_decay: f64,
    /// Steps over which the learning rate rises linearly to `lr` (0: constant).
    pub warmup_steps: u64,
}

impl Default for OptimizerConfig {
    fn default() -> Self {
        OptimizerConfig {
            kind: OptimizerKind::AdamW,
            lr: 1e-6,
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
            weight_decay: 0.01,
            warmup_steps: 0,
        }
    }
}

/// An optimiser's state: its step count and, for AdamW, both moments per weight.
#[derive(Debug)]
pub struct Optimizer {
    /// The settings this state was created with (saved in `trainer_state.json`).
    pub config: OptimizerConfig,
    /// Steps taken so far.
    pub step: u64,
    /// First and second moments, in [`Params::named`] order (AdamW only).
    pub moments: Vec<(Tensor, Tensor)>,
}

/// Each gradient's squared L2 norm (summed in f64; an f32 gradient is read where it
/// lies, with no f64 copy: at 0.5B parameters the embedding's would be 1 GB).
pub fn squared_norms(grads: &[Tensor]) -> Result<Vec<f64>, TrainError> {
    grads
        .iter()
        .map(|g| {
            let sum = with_f32_slice(g, |x| x.iter().map(|&v| (v as f64) * (v as f64)).sum());
            if let Some(sum) = sum {
                return Ok(sum);
            }
            Ok(g.to_dtype(candle_core::DType::F64)?
                .sqr()?
                .sum_all()?
                .to_scalar::<f64>()?)
        })
        .collect()
}

/// The factor clipping scales gradients of global norm `norm` by, as PyTorch does;
/// `None` when they stay as they are (`max_norm <= 0`, or already within it).
pub fn clip_scale(norm: f64, max_norm: f64) -> Option<f64> {
    if max_norm <= 0.0 {
        return None;
    }
    let coef = max_norm / (norm + 1e-6);
    (coef < 1.0).then_some(coef)
}

/// Scales `grads` whose global norm is `norm` so it is at most `max_norm`, as PyTorch
/// does (`max_norm <= 0` leaves them unchanged).
pub fn clip_to(grads: &mut [Tensor], norm: f64, max_norm: f64) -> Result<(), TrainError> {
    if let Some(coef) = clip_scale(norm, max_norm) {
        for g in grads.iter_mut() {
            *g = (&*g * coef)?;
        }
    }
    Ok(())
}

/// Runs `f` on `t`'s values when `t` is a contiguous f32 CPU tensor.
fn with_f32_slice<R>(t: &Tensor, f: impl FnOnce(&[f32]) -> R) -> Option<R> {
    let (storage, layout) = t.storage_and_layout();
    match (&*storage, layout.contiguous_offsets()) {
        (Storage::Cpu(CpuStorage::F32(v)), Some((a, b))) => Some(f(&v[a..b])),
        _ => None,
    }
}

/// Clips `grads` to a global norm of at most `max_norm`; returns the norm before.
pub fn clip_grad_norm(grads: &mut [Tensor], max_norm: f64) -> Result<f64, TrainError> {
    let norm = squared_norms(grads)?.iter().sum::<f64>().sqrt();
    clip_to(grads, norm, max_norm)?;
    Ok(norm)
}

impl Optimizer {
    /// A fresh optimiser at step 0; AdamW's moments are created, as zeros, by the
    /// first step.
    pub fn new(config: OptimizerConfig) -> Self {
        Optimizer {
            config,
            step: 0,
            moments: Vec::new(),
        }
    }

    /// The learning rate of the next step.
    pub fn current_lr(&self) -> f64 {
        let w = self.config.warmup_steps;
        if w == 0 {
            self.config.lr
        } else {
            self.config.lr * ((self.step + 1).min(w) as f64 / w as f64)
        }
    }

    /// One step: `grads` in [`Params::named`] order.
    pub fn step(&mut self, params: &Params, grads: &[Tensor]) -> Result<(), TrainError> {
        self.step_scaled(params, grads, None)
    }

    /// One step on `grads` times `scale` (clipping's factor, [`clip_scale`]), the
    /// scaling folded into the step instead of a scaled copy of every gradient.
    pub fn step_scaled(
        &mut self,
        params: &Params,
        grads: &[Tensor],
        scale: Option<f64>,
    ) -> Result<(), TrainError> {
        let named = params.named();
        if grads.len() != named.len() {
            return Err(TrainError::BadBatch(format!(
                "{} gradients for {} weights",
                grads.len(),
                named.len()
            )));
        }
        let lr = self.current_lr();
        let c = self.config;
        match c.kind {
            OptimizerKind::Sgd => {
                for ((_, var), g) in named.iter().zip(grads) {
                    let g = scaled(g, scale)?;
                    var.set(&(var.as_tensor() - (g * lr)?)?)?;
                }
            }
            OptimizerKind::AdamW => {
                if self.moments.is_empty() {
                    for (_, var) in &named {
                        self.moments
                            .push((var.as_tensor().zeros_like()?, var.as_tensor().zeros_like()?));
                    }
                }
                let t = (self.step + 1) as i32;
                let (bc1, bc2) = (1.0 - c.beta1.powi(t), 1.0 - c.beta2.powi(t));
                for (((_, var), g), (m, v)) in named.iter().zip(grads).zip(&mut self.moments) {
                    if adamw_f32(var, g, m, v, scale, (lr, bc1, bc2), &c)? {
                        continue;
                    }
                    let g = &scaled(g, scale)?;
                    let w = var.as_tensor();
                    let w = (w - (w * (lr * c.weight_decay))?)?;
                    *m = ((&*m * c.beta1)? + (g * (1.0 - c.beta1))?)?;
                    *v = ((&*v * c.beta2)? + (g.sqr()? * (1.0 - c.beta2))?)?;
                    let denom = ((&*v / bc2)?.sqrt()? + c.eps)?;
                    let delta = ((&*m / bc1)? / denom)?;
                    var.set(&(w - (delta * lr)?)?)?;
                }
            }
        }
        self.step += 1;
        Ok(())
    }
}

/// `g · scale` as clipping computes it (`g` itself without a scale).
fn scaled(g: &Tensor, scale: Option<f64>) -> Result<Tensor, TrainError> {
    Ok(match scale {
        Some(coef) => (g * coef)?,
        None => g.clone(),
    })
}

/// Runs `f` on the values of three contiguous f32 tensors.
fn with_three<R>(
    a: &Tensor,
    b: &Tensor,
    c: &Tensor,
    f: impl FnOnce(&[f32], &[f32], &[f32]) -> R,
) -> Option<R> {
    with_f32_slice(a, |a| {
        with_f32_slice(b, |b| with_f32_slice(c, |c| f(a, b, c)))
    })
    .flatten()
    .flatten()
}

/// Runs `f` on the values of two contiguous f32 tensors.
fn with_two<R>(a: &Tensor, b: &Tensor, f: impl FnOnce(&[f32], &[f32]) -> R) -> Option<R> {
    with_f32_slice(a, |a| with_f32_slice(b, |b| f(a, b))).flatten()
}

/// One AdamW step of an f32 weight on plain slices, each value computed with the
/// tensor formula's operations in their order (so bit for bit what it gives), holding
/// one new tensor at a time where the formula held about six: at 0.5B parameters the
/// embedding's temporaries alone were 3 GB. `false` (nothing done) for any other
/// dtype or layout, which the tensor formula then takes.
fn adamw_f32(
    var: &Var,
    g: &Tensor,
    m: &mut Tensor,
    v: &mut Tensor,
    scale: Option<f64>,
    (lr, bc1, bc2): (f64, f64, f64),
    c: &OptimizerConfig,
) -> Result<bool, TrainError> {
    let w = var.as_tensor();
    if with_three(w, g, m, |_, _, _| ()).is_none() || with_f32_slice(v, |_| ()).is_none() {
        return Ok(false);
    }
    let shape = w.shape().clone();
    let f = |x: f64| x as f32;
    let (b1, b2, one_b1, one_b2) = (f(c.beta1), f(c.beta2), f(1.0 - c.beta1), f(1.0 - c.beta2));
    let coef = scale.map(f);
    let grad = |g: f32| coef.map_or(g, |k| g * k);
    // m ← β1 m + (1 − β1) g, then v ← β2 v + (1 − β2) g², one new tensor at a time.
    let new_m = with_two(g, m, |g, m| {
        m.iter()
            .zip(g)
            .map(|(&m, &g)| m * b1 + grad(g) * one_b1)
            .collect::<Vec<f32>>()
    });
    *m = Tensor::from_vec(new_m.unwrap_or_default(), shape.clone(), &Device::Cpu)?;
    let new_v = with_two(g, v, |g, v| {
        v.iter()
            .zip(g)
            .map(|(&v, &g)| {
                let g = grad(g);
                v * b2 + (g * g) * one_b2
            })
            .collect::<Vec<f32>>()
    });
    *v = Tensor::from_vec(new_v.unwrap_or_default(), shape.clone(), &Device::Cpu)?;
    let (decay, inv_bc1, inv_bc2, eps, lr32) = (
        f(lr * c.weight_decay),
        f(1.0 / bc1),
        f(1.0 / bc2),
        f(c.eps),
        f(lr),
    );
    let new_w = with_three(w, m, v, |w, m, v| {
        w.iter()
            .zip(m)
            .zip(v)
            .map(|((&w, &m), &v)| {
                let w = w - w * decay;
                let denom = (v * inv_bc2).sqrt() + eps;
                let delta = (m * inv_bc1) / denom;
                w - delta * lr32
            })
            .collect::<Vec<f32>>()
    });
    var.set(&Tensor::from_vec(
        new_w.unwrap_or_default(),
        shape,
        &Device::Cpu,
    )?)?;
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The tensor formula (what f64 weights run), for the oracle below.
    fn formula(
        w: &Tensor,
        g: &Tensor,
        m: &Tensor,
        v: &Tensor,
        lr: f64,
        t: i32,
        c: &OptimizerConfig,
    ) -> [Vec<f32>; 3] {
        let (bc1, bc2) = (1.0 - c.beta1.powi(t), 1.0 - c.beta2.powi(t));
        let w = (w - (w * (lr * c.weight_decay)).unwrap()).unwrap();
        let m = ((m * c.beta1).unwrap() + (g * (1.0 - c.beta1)).unwrap()).unwrap();
        let v = ((v * c.beta2).unwrap() + (g.sqr().unwrap() * (1.0 - c.beta2)).unwrap()).unwrap();
        let denom = ((&v / bc2).unwrap().sqrt().unwrap() + c.eps).unwrap();
        let delta = ((&m / bc1).unwrap() / denom).unwrap();
        let w = (w - (delta * lr).unwrap()).unwrap();
        [w, m, v].map(|t| t.to_vec1::<f32>().unwrap())
    }

    #[test]
    fn the_fused_adamw_step_is_the_tensor_formula_bit_for_bit() {
        let c = OptimizerConfig::default();
        let n = 1000;
        let vals = |k: u32| -> Vec<f32> {
            (0..n as u32)
                .map(|i| {
                    (i.wrapping_mul(2_654_435_761).wrapping_add(k) % 2001) as f32 / 1000.0 - 1.0
                })
                .collect()
        };
        let dev = &Device::Cpu;
        let w = Var::from_tensor(&Tensor::from_vec(vals(1), n, dev).unwrap()).unwrap();
        let mut m =
            Tensor::from_vec(vals(2).iter().map(|x| x * 0.01).collect::<Vec<_>>(), n, dev).unwrap();
        let mut v = Tensor::from_vec(
            vals(3).iter().map(|x| x * x * 1e-4).collect::<Vec<_>>(),
            n,
            dev,
        )
        .unwrap();
        let g = Tensor::from_vec(vals(4), n, dev).unwrap();
        for scale in [None, Some(0.37)] {
            let gs = scaled(&g, scale).unwrap();
            let want = formula(w.as_tensor(), &gs, &m, &v, 3e-4, 5, &c);
            let (mut m2, mut v2) = (m.clone(), v.clone());
            assert!(adamw_f32(
                &w,
                &g,
                &mut m2,
                &mut v2,
                scale,
                (3e-4, 1.0 - c.beta1.powi(5), 1.0 - c.beta2.powi(5)),
                &c
            )
            .unwrap());
            let got = [w.as_tensor(), &m2, &v2].map(|t| t.to_vec1::<f32>().unwrap());
            assert_eq!(got, want, "scale {scale:?}");
            // The next round starts from the updated state.
            (m, v) = (m2, v2);
        }
    }
}
