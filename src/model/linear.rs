//! A linear layer over either quantised (GGUF) or dense (safetensors) weights.

use candle_core::quantized::QMatMul;
use candle_core::Tensor;

use super::error::ModelError;

/// `y = x · Wᵀ + b` for `x: [rows, in]`, `W: [out, in]`.
///
/// Quantised weights go through candle's quantised matmul, which quantises each input
/// row on its own and walks the weights per row: a row's result never depends on the
/// other rows of the batch, which the engine's batch invariance relies on.
#[derive(Debug)]
pub struct Linear {
    weight: LinearWeight,
    bias: Option<Tensor>,
    in_features: usize,
    out_features: usize,
}

#[derive(Debug)]
enum LinearWeight {
    Quantized(QMatMul),
    Dense(Tensor),
}

impl Linear {
    /// Wraps a quantised `[out, in]` matrix.
    pub fn quantized(weight: QMatMul, out_features: usize, in_features: usize) -> Self {
        Linear {
            weight: LinearWeight::Quantized(weight),
            bias: None,
            in_features,
            out_features,
        }
    }

    /// Wraps a dense f32 `[out, in]` matrix.
    pub fn dense(weight: Tensor) -> Result<Self, ModelError> {
        let (out_features, in_features) = weight.dims2()?;
        Ok(Linear {
            weight: LinearWeight::Dense(weight),
            bias: None,
            in_features,
            out_features,
        })
    }

    /// Adds a bias vector of `out_features` values.
    pub fn with_bias(mut self, bias: Tensor) -> Self {
        self.bias = Some(bias);
        self
    }

    pub fn in_features(&self) -> usize {
        self.in_features
    }

    pub fn out_features(&self) -> usize {
        self.out_features
    }

    /// Applies the layer to `x: [rows, in]`, returning `[rows, out]`.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor, ModelError> {
        let y = match &self.weight {
            LinearWeight::Quantized(w) => x.apply(w)?,
            LinearWeight::Dense(w) => x.matmul(&w.t()?)?,
        };
        Ok(match &self.bias {
            Some(b) => y.broadcast_add(b)?,
            None => y,
        })
    }
}
