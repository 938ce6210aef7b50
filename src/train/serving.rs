//! The trainer's weights as a model the engine serves: after every update the closed
//! loop builds one and swaps it into the engine (`Engine::load_weights`).
//!
//! Matrices are served dense in the format asked for (f32: exactly the trainer's
//! values; bf16: rounded to nearest, half the bytes a decode step reads); norms and the
//! embedding stay f32. The RoPE pairing stays the source's, as in [`Params`], so the
//! served model computes what the trainer's decoder computes up to summation order
//! (`tests/train_loop_tests.rs` holds them within the update's 1e-4-nat tolerance).
//! Requantising to the file's 4-bit blocks is not offered: one update moves weights far
//! less than a quantisation step, so a requantised policy would barely change.

use std::collections::HashMap;
use std::path::Path;

use candle_core::{DType, Tensor};

use super::error::TrainError;
use super::params::Params;
use crate::model::kernels::WeightFormat;

/// The formats the engine may serve the trainer's weights in, by the name every way
/// in spells them: `f32` (exactly the trainer's values) or `bf16` (rounded: half the
/// bytes a decode step reads).
pub fn served_format(name: &str) -> Result<WeightFormat, String> {
    match name {
        "f32" => Ok(WeightFormat::F32),
        "bf16" => Ok(WeightFormat::Bf16),
        other => Err(format!(
            "serve_format must be \"f32\" or \"bf16\", not {other:?}"
        )),
    }
}
use crate::model::Model;

/// The name errors about served trainer weights carry (they have no file).
const LABEL: &str = "<trainer weights>";

impl Params {
    /// The current weights as a servable model, matrices held in `format` (F32, Bf16
    /// or F16).
    pub fn to_model(&self, format: WeightFormat) -> Result<Model, TrainError> {
        let matrix_dtype = match format {
            WeightFormat::F32 => DType::F32,
            WeightFormat::Bf16 => DType::BF16,
            WeightFormat::F16 => DType::F16,
            other => return Err(TrainError::UnservableFormat(other)),
        };
        let mut tensors: HashMap<String, Tensor> = HashMap::new();
        for (name, var) in self.named() {
            let t: &Tensor = var.as_tensor();
            // The embedding is a lookup table (and the tied head): kept f32.
            let dtype = if t.rank() == 2 && name != "model.embed_tokens.weight" {
                matrix_dtype
            } else {
                DType::F32
            };
            tensors.insert(name, t.to_dtype(dtype)?);
        }
        Ok(Model::from_hf_tensors(
            self.config.clone(),
            tensors,
            Path::new(LABEL),
        )?)
    }
}
