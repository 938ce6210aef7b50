//! The supervised warm-start: the model learns the environment's step format from
//! the oracle's demonstrations ([`crate::rollout::demo`]), loss on model tokens only.
//!
//! Each SFT step is one update of the policy-gradient machinery with every loss token's
//! advantage 1, no KL and no entropy term, on-policy: the ratio is 1, so the clipped
//! surrogate's gradient is exactly `−∇ mean log p` — the negative log-likelihood's
//! gradient — and the update's tree packing, micro-batches, clipping and optimiser
//! serve SFT unchanged (a system prompt every demonstration shares is forwarded once
//! per micro-batch). Demonstrations are shuffled each epoch by a seeded stream.

use serde::{Deserialize, Serialize};

use super::error::LoopError;
use super::samples::train_sample;
use crate::engine::SeqRng;
use crate::env::{Environment, QaSample};
use crate::model::LoadedModel;
use crate::random::Uniform;
use crate::rollout::{demonstrations, Trajectory};
use crate::train::{
    LossConfig, Optimizer, OptimizerConfig, Params, TrainSample, Update, UpdateConfig,
};

/// How the warm-start runs.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SftConfig {
    /// Passes over the demonstrations (0: no training).
    pub epochs: usize,
    /// Demonstrations per optimiser step.
    pub batch_size: usize,
    /// Micro-batch rows and the grad-norm clip (the loss is fixed: NLL).
    pub micro_batch_tokens: usize,
    /// Global gradient-norm clip of each step (0: none).
    pub max_grad_norm: f64,
    /// Seeds the shuffling of each epoch.
    pub seed: u64,
}

impl Default for SftConfig {
    fn default() -> Self {
        SftConfig {
            epochs: 2,
            batch_size: 8,
            micro_batch_tokens: 4096,
            max_grad_norm: 1.0,
            seed: 0,
        }
    }
}

/// One SFT step's figures (`sft_log.jsonl`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SftStepLog {
    /// The epoch the step belongs to (0-based).
    pub epoch: usize,
    /// The optimiser's step count after this step (1-based, across epochs).
    pub step: u64,
    /// Mean negative log-likelihood of the batch's model tokens, before the step.
    pub nll: f64,
    /// Global gradient norm before clipping.
    pub grad_norm: f64,
    /// Model tokens (loss tokens) in the batch.
    pub tokens: usize,
    /// The learning rate of the step.
    pub lr: f64,
    /// Wall-clock seconds of the step's update.
    pub seconds: f64,
}

/// A demonstration as a training sample: every model token is a loss token with
/// advantage 1, observations masked out.
pub fn sft_sample(demo: &Trajectory) -> TrainSample {
    train_sample(demo, 1.0, None)
}

/// The update settings under which a policy-gradient step is an NLL step.
fn nll_update(cfg: &SftConfig) -> UpdateConfig {
    UpdateConfig {
        loss: LossConfig {
            kl_coef: 0.0,
            entropy_coef: 0.0,
            ..LossConfig::default()
        },
        max_grad_norm: cfg.max_grad_norm,
        packed: true,
        micro_batch_tokens: cfg.micro_batch_tokens,
        temperature: 1.0,
    }
}

/// `0..n` shuffled by `rng`.
fn shuffled(n: usize, rng: &mut SeqRng) -> Vec<usize> {
    let mut order: Vec<usize> = (0..n).collect();
    rng.shuffle(&mut order);
    order
}

/// Trains `params` on `samples` for `cfg.epochs` epochs; `on_step` sees each step.
pub fn run_sft(
    params: &Params,
    optimizer: &mut Optimizer,
    samples: &[TrainSample],
    cfg: &SftConfig,
    on_step: &mut dyn FnMut(&SftStepLog),
) -> Result<Vec<SftStepLog>, LoopError> {
    if samples.is_empty() {
        return Err(LoopError::Config(
            "no demonstrations to train on (the task's oracle covered no sample)".into(),
        ));
    }
    if cfg.batch_size == 0 {
        return Err(LoopError::Config(
            "the SFT batch size must be at least 1".into(),
        ));
    }
    let update_cfg = nll_update(cfg);
    let mut logs = Vec::new();
    for epoch in 0..cfg.epochs {
        let mut rng = SeqRng::from_parts(&[cfg.seed, epoch as u64, 0x5f7]);
        let order = shuffled(samples.len(), &mut rng);
        for batch in order.chunks(cfg.batch_size) {
            let picked: Vec<TrainSample> = batch.iter().map(|&i| samples[i].clone()).collect();
            let m = Update::new(params, &picked, &update_cfg).step(optimizer)?;
            let line = SftStepLog {
                epoch,
                step: optimizer.step,
                nll: m.nll,
                grad_norm: m.grad_norm,
                tokens: m.tokens,
                lr: m.lr,
                seconds: m.seconds,
            };
            on_step(&line);
            logs.push(line);
        }
    }
    Ok(logs)
}

/// What a warm-start did.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct WarmStart {
    /// Questions the oracle demonstrated (of those given).
    pub demonstrations: usize,
    /// The demonstrations' mean reward (1 where the oracle solves every question).
    pub demonstration_reward: f64,
    /// Model tokens trained on per epoch.
    pub model_tokens: usize,
    /// Every optimiser step's figures, in order (`sft_log.jsonl`).
    pub steps: Vec<SftStepLog>,
}

/// Demonstrates `samples` with `env`'s oracle and trains `params` on them with AdamW
/// at `lr` (no weight decay). The training is CPU work done in place: call it on a
/// multi-thread tokio runtime.
pub async fn warm_start(
    model: &LoadedModel,
    env: &dyn Environment,
    samples: &[QaSample],
    params: &Params,
    lr: f64,
    cfg: &SftConfig,
    on_step: &mut (dyn FnMut(&SftStepLog) + Send),
) -> Result<WarmStart, LoopError> {
    let demos = demonstrations(model, env, samples).await?;
    let demonstration_reward =
        demos.iter().map(|d| d.reward).sum::<f64>() / demos.len().max(1) as f64;
    let model_tokens = demos
        .iter()
        .map(|d| d.response_mask.iter().filter(|&&m| m == 1).count())
        .sum();
    let train: Vec<TrainSample> = demos.iter().map(sft_sample).collect();
    let mut optimizer = Optimizer::new(OptimizerConfig {
        lr,
        weight_decay: 0.0,
        ..OptimizerConfig::default()
    });
    let steps = tokio::task::block_in_place(|| {
        run_sft(params, &mut optimizer, &train, cfg, &mut |l| on_step(l))
    })?;
    Ok(WarmStart {
        demonstrations: demos.len(),
        demonstration_reward,
        model_tokens,
        steps,
    })
}
