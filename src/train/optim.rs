//! Optimisers over [`Params`]: plain SGD (the oracle: each weight moves by exactly
//! `−lr × gradient`) and AdamW as PyTorch computes it, with global grad-norm clipping
//! and a constant or linear warm-up learning rate. The state (step, moments) is saved
//! and restored with a checkpoint.
//!
//! AdamW, per weight: `w ← w − lr·λ·w`; `m ← β1 m + (1−β1) g`; `v ← β2 v + (1−β2) g²`;
//! `w ← w − lr · (m / (1−β1^t)) / (sqrt(v / (1−β2^t)) + ε)` (torch.optim.AdamW).
//! Clipping as `torch.nn.utils.clip_grad_norm_`: gradients scale by
//! `min(1, max_norm / (‖g‖ + 1e-6))`.

use candle_core::Tensor;
use serde::{Deserialize, Serialize};

use super::error::TrainError;
use super::params::Params;

/// Which update rule.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OptimizerKind {
    Sgd,
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
    pub kind: OptimizerKind,
    pub lr: f64,
    pub beta1: f64,
    pub beta2: f64,
    pub eps: f64,
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
    pub config: OptimizerConfig,
    /// Steps taken so far.
    pub step: u64,
    /// First and second moments, in [`Params::named`] order (AdamW only).
    pub moments: Vec<(Tensor, Tensor)>,
}

/// Each gradient's squared L2 norm (summed in f64).
pub fn squared_norms(grads: &[Tensor]) -> Result<Vec<f64>, TrainError> {
    grads
        .iter()
        .map(|g| {
            Ok(g.to_dtype(candle_core::DType::F64)?
                .sqr()?
                .sum_all()?
                .to_scalar::<f64>()?)
        })
        .collect()
}

/// Scales `grads` whose global norm is `norm` so it is at most `max_norm`, as PyTorch
/// does (`max_norm <= 0` leaves them unchanged).
pub fn clip_to(grads: &mut [Tensor], norm: f64, max_norm: f64) -> Result<(), TrainError> {
    if max_norm > 0.0 {
        let coef = max_norm / (norm + 1e-6);
        if coef < 1.0 {
            for g in grads.iter_mut() {
                *g = (&*g * coef)?;
            }
        }
    }
    Ok(())
}

/// Clips `grads` to a global norm of at most `max_norm`; returns the norm before.
pub fn clip_grad_norm(grads: &mut [Tensor], max_norm: f64) -> Result<f64, TrainError> {
    let norm = squared_norms(grads)?.iter().sum::<f64>().sqrt();
    clip_to(grads, norm, max_norm)?;
    Ok(norm)
}

impl Optimizer {
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
