//! A linear layer over quantised (GGUF) or dense (safetensors) weights.

use candle_core::quantized::QMatMul;
use candle_core::{Device, Tensor};

use super::error::ModelError;
use super::quant::QuantMatrix;

/// `y = x · Wᵀ + b` for `x: [rows, in]`, `W: [out, in]`, on plain f32 slices.
#[derive(Debug)]
pub struct Linear {
    weight: LinearWeight,
    bias: Option<Vec<f32>>,
    in_features: usize,
    out_features: usize,
}

#[derive(Debug)]
enum LinearWeight {
    /// Q4_0 / Q4_1 / Q8_0 through our batched, batch-invariant kernel.
    Quant(QuantMatrix),
    /// Other quantised formats (K-quants) through candle's kernel, which is also
    /// row-independent (it quantises and multiplies each row on its own).
    Candle(QMatMul),
    /// Dense f32 `[out, in]`.
    Dense(Tensor),
}

impl Linear {
    pub fn quant(weight: QuantMatrix) -> Self {
        Linear {
            in_features: weight.in_features(),
            out_features: weight.out_features(),
            weight: LinearWeight::Quant(weight),
            bias: None,
        }
    }

    /// Wraps a candle quantised `[out, in]` matrix.
    pub fn candle(weight: QMatMul, out_features: usize, in_features: usize) -> Self {
        Linear {
            weight: LinearWeight::Candle(weight),
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

    /// Adds a bias of `out_features` values.
    pub fn with_bias(mut self, bias: Vec<f32>) -> Self {
        self.bias = Some(bias);
        self
    }

    pub fn in_features(&self) -> usize {
        self.in_features
    }

    pub fn out_features(&self) -> usize {
        self.out_features
    }

    /// The bias, if the layer has one.
    pub fn bias(&self) -> Option<&[f32]> {
        self.bias.as_deref()
    }

    /// The weight as dense f32 `[out, in]`, row-major, dequantised with ggml's own
    /// formulas where the file is quantised: what the trainer starts from.
    pub fn dense_weight(&self) -> Result<Vec<f32>, ModelError> {
        match &self.weight {
            LinearWeight::Quant(w) => {
                let mut out = vec![0f32; self.out_features * self.in_features];
                for (o, row) in out.chunks_exact_mut(self.in_features).enumerate() {
                    w.dequantize_row(o, row);
                }
                Ok(out)
            }
            LinearWeight::Candle(QMatMul::QTensor(q)) => Ok(q
                .dequantize(&Device::Cpu)?
                .flatten_all()?
                .to_vec1::<f32>()?),
            LinearWeight::Candle(QMatMul::Tensor(t) | QMatMul::TensorF16(t))
            | LinearWeight::Dense(t) => Ok(t
                .to_dtype(candle_core::DType::F32)?
                .flatten_all()?
                .to_vec1::<f32>()?),
        }
    }

    /// Applies the layer to `rows` rows of `x`, returning `[rows, out]`.
    pub fn forward(&self, x: &[f32], rows: usize) -> Result<Vec<f32>, ModelError> {
        let mut y = match &self.weight {
            LinearWeight::Quant(w) => w.matmul(x, rows),
            LinearWeight::Candle(w) => {
                let t = Tensor::from_slice(x, (rows, self.in_features), &Device::Cpu)?;
                t.apply(w)?.flatten_all()?.to_vec1::<f32>()?
            }
            LinearWeight::Dense(w) => {
                let t = Tensor::from_slice(x, (rows, self.in_features), &Device::Cpu)?;
                t.matmul(&w.t()?)?.flatten_all()?.to_vec1::<f32>()?
            }
        };
        if let Some(b) = &self.bias {
            for row in y.chunks_exact_mut(self.out_features) {
                for (v, bb) in row.iter_mut().zip(b) {
                    *v += bb;
                }
            }
        }
        Ok(y)
    }
}
