//! One whole update as a caller outside the training loop runs it (`treegrpo update`,
//! the Python package's `treegrpo.update`): the model's weights as f32 parameters, the
//! optimiser (restored from the model's checkpoint folder when it holds one of the same
//! kind), one update on the trajectories, and the new HF checkpoint written.

use std::path::Path;

use candle_core::DType;

use crate::model::LoadedModel;

use super::checkpoint::{load_optimizer, save_checkpoint, CheckpointExtras};
use super::error::TrainError;
use super::input::TrainingData;
use super::optim::{Optimizer, OptimizerConfig};
use super::params::Params;
use super::update::{Update, UpdateConfig, UpdateMetrics, UpdateProgress};

/// What [`update_checkpoint`] did.
#[derive(Debug, Clone)]
pub struct UpdateReport {
    /// The update's loss, gradient norm and other figures (see [`UpdateMetrics`]).
    pub metrics: UpdateMetrics,
    /// The optimiser's step count after the update (1 for a fresh optimiser).
    pub step: u64,
}

/// Updates `model` (loaded from `model_path`) on `data` and writes the checkpoint to
/// `out` (replaced only once whole). `update.temperature` is taken from the data.
/// The loaded weights are dropped once copied into the trainer's (at 0.5B parameters
/// they are 2 GB the update has no use for).
pub fn update_checkpoint(
    model: LoadedModel,
    model_path: &Path,
    data: &TrainingData,
    optimizer: OptimizerConfig,
    update: UpdateConfig,
    out: &Path,
    progress: &mut dyn FnMut(UpdateProgress),
) -> Result<UpdateReport, TrainError> {
    let LoadedModel {
        model: weights,
        tokenizer,
        chat_template,
        ..
    } = model;
    let params = Params::from_model(&weights, DType::F32)?;
    drop(weights);
    // A checkpoint written by an earlier update carries its optimiser state; a
    // different optimiser kind starts afresh.
    let restored = if model_path.is_dir() {
        load_optimizer(model_path, &params)?
    } else {
        None
    };
    let mut opt = match restored {
        Some(mut o) if o.config.kind == optimizer.kind => {
            o.config = optimizer;
            o
        }
        _ => Optimizer::new(optimizer),
    };
    let cfg = UpdateConfig {
        temperature: data.temperature,
        ..update
    };
    let metrics = Update::new(&params, &data.samples, &cfg)
        .reporting(progress)
        .step(&mut opt)?;
    save_checkpoint(
        out,
        &params,
        CheckpointExtras {
            loop_state: None,
            tokenizer: &tokenizer,
            chat_template: chat_template.as_ref(),
            optimizer: Some(&opt),
        },
    )?;
    Ok(UpdateReport {
        metrics,
        step: opt.step,
    })
}
