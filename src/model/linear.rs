//! A linear layer over packed weights (our kernels) or candle's K-quant matrices.

use std::ops::Range;

use candle_core::quantized::QMatMul;
use candle_core::{DType, Device, Tensor};
use half::{bf16, f16};

use super::error::ModelError;
use super::kernels::{Epilogue, Int8Matrix, PackedMatrix, WeightFormat, PANEL};
use super::precision::Precision;
use super::team::{Member, SharedBuf};

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
    /// f32 / bf16 / f16 / Q4_0 / Q4_1 / Q8_0 through our batch-invariant kernels.
    Packed(PackedMatrix),
    /// Q4_0 / Q4_1 / Q8_0 with 8-bit activations (the fast precision mode).
    Int8(Int8Matrix),
    /// Other quantised formats (K-quants) through candle's kernel, which is also
    /// row-independent (it quantises and multiplies each row on its own).
    Candle(QMatMul),
}

impl Linear {
    /// A layer over a packed matrix, run by our batch-invariant kernels; no bias.
    pub fn packed(weight: PackedMatrix) -> Self {
        Linear {
            in_features: weight.in_features(),
            out_features: weight.out_features(),
            weight: LinearWeight::Packed(weight),
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

    /// Packs a dense `[out, in]` tensor, keeping bf16 and f16 as they are (half the
    /// memory a step reads) and widening any other dtype to f32.
    pub fn dense(weight: &Tensor) -> Result<Self, ModelError> {
        let (out, inp) = weight.dims2()?;
        let flat = weight.flatten_all()?;
        let packed = match weight.dtype() {
            DType::BF16 => PackedMatrix::from_bf16(out, inp, &flat.to_vec1::<bf16>()?),
            DType::F16 => PackedMatrix::from_f16(out, inp, &flat.to_vec1::<f16>()?),
            _ => PackedMatrix::from_f32(out, inp, &flat.to_dtype(DType::F32)?.to_vec1::<f32>()?),
        }?;
        Ok(Linear::packed(packed))
    }

    /// Adds a bias of `out_features` values.
    pub fn with_bias(mut self, bias: Vec<f32>) -> Self {
        self.bias = Some(bias);
        self
    }

    /// Input width: the columns of `W`.
    pub fn in_features(&self) -> usize {
        self.in_features
    }

    /// Output width: the rows of `W`.
    pub fn out_features(&self) -> usize {
        self.out_features
    }

    /// The output columns `member` writes in [`Self::forward_share`] (every row of
    /// them): its share of the panels on our kernels; `None` on candle's kernel, where
    /// member 0 writes every column. Two layers of the same width split alike.
    pub fn member_columns(&self, member: &Member) -> Option<Range<usize>> {
        let share = self.member_panels(member)?;
        let end = |p: usize| (p * PANEL).min(self.out_features);
        Some(end(share.start)..end(share.end))
    }

    /// The weight panels `member` computes on our kernels (the one place the split is
    /// decided: [`Self::forward_share`] runs it, [`Self::member_columns`] reports it);
    /// `None` on candle's kernel.
    fn member_panels(&self, member: &Member) -> Option<Range<usize>> {
        match &self.weight {
            LinearWeight::Packed(w) => Some(member.share(w.panels())),
            LinearWeight::Int8(w) => Some(member.share(w.panels())),
            LinearWeight::Candle(_) => None,
        }
    }

    /// The bias, if the layer has one.
    pub fn bias(&self) -> Option<&[f32]> {
        self.bias.as_deref()
    }

    /// The precision the layer is served at: fast when it holds 8-bit-activation
    /// codes, exact otherwise.
    pub fn precision(&self) -> Precision {
        match self.weight {
            LinearWeight::Int8(_) => Precision::Fast,
            LinearWeight::Packed(_) | LinearWeight::Candle(_) => Precision::Exact,
        }
    }

    /// The packed weights, unless the layer runs on candle's kernel.
    pub fn packed_weights(&self) -> Option<&PackedMatrix> {
        match &self.weight {
            LinearWeight::Packed(m) => Some(m),
            LinearWeight::Int8(_) | LinearWeight::Candle(_) => None,
        }
    }

    /// The weight as dense f32 `[out, in]`, row-major, dequantised with ggml's own
    /// formulas where the file is quantised: what the trainer starts from, and exactly
    /// the values the kernels multiply by.
    pub fn dense_weight(&self) -> Result<Vec<f32>, ModelError> {
        match &self.weight {
            LinearWeight::Packed(w) => Ok(w.to_dense()),
            LinearWeight::Int8(w) => Ok(w.to_dense()),
            LinearWeight::Candle(QMatMul::QTensor(q)) => Ok(q
                .dequantize(&Device::Cpu)?
                .flatten_all()?
                .to_vec1::<f32>()?),
            LinearWeight::Candle(QMatMul::Tensor(t) | QMatMul::TensorF16(t)) => {
                Ok(t.to_dtype(DType::F32)?.flatten_all()?.to_vec1::<f32>()?)
            }
        }
    }

    /// A copy of the layer with its weights held dense in `format` (f32 exactly as
    /// [`Self::dense_weight`]; bf16 rounded to nearest), bias kept. This is how the
    /// engine serves weights the trainer holds (dense) rather than the file's blocks.
    pub fn to_dense(&self, format: WeightFormat) -> Result<Linear, ModelError> {
        let w = self.dense_weight()?;
        let (out, inp) = (self.out_features, self.in_features);
        let packed = match format {
            WeightFormat::Bf16 => {
                let b: Vec<bf16> = w.iter().map(|&v| bf16::from_f32(v)).collect();
                PackedMatrix::from_bf16(out, inp, &b)?
            }
            WeightFormat::F16 => {
                let h: Vec<f16> = w.iter().map(|&v| f16::from_f32(v)).collect();
                PackedMatrix::from_f16(out, inp, &h)?
            }
            _ => PackedMatrix::from_f32(out, inp, &w)?,
        };
        let dense = Linear::packed(packed);
        Ok(match &self.bias {
            Some(b) => dense.with_bias(b.clone()),
            None => dense,
        })
    }

    /// Whether the layer is already served at `precision` ([`Self::at_precision`]
    /// would only copy it).
    pub fn serves_at(&self, precision: Precision) -> bool {
        match (&self.weight, precision) {
            (LinearWeight::Packed(m), Precision::Fast) => !m.format().is_quantized(),
            (LinearWeight::Int8(_), Precision::Exact) => false,
            _ => true,
        }
    }

    /// The layer served at `precision`: for [`Precision::Fast`], a Q4_0 / Q4_1 / Q8_0
    /// layer relaid out for 8-bit activations; any other layer (and every layer for
    /// [`Precision::Exact`]) as it is, exact.
    pub fn at_precision(&self, precision: Precision) -> Result<Linear, ModelError> {
        let weight = match (&self.weight, precision) {
            (LinearWeight::Packed(m), Precision::Fast) if m.format().is_quantized() => {
                LinearWeight::Int8(Int8Matrix::from_packed(m)?)
            }
            (LinearWeight::Int8(m), Precision::Fast) => LinearWeight::Int8(m.clone()),
            (LinearWeight::Int8(m), Precision::Exact) => {
                // Back to exact: the codes give the original values exactly.
                let dense =
                    PackedMatrix::from_f32(m.out_features(), m.in_features(), &m.to_dense())?;
                LinearWeight::Packed(dense)
            }
            (LinearWeight::Packed(m), _) => LinearWeight::Packed(m.clone()),
            (LinearWeight::Candle(m), _) => LinearWeight::Candle(m.clone()),
        };
        Ok(Linear {
            weight,
            bias: self.bias.clone(),
            in_features: self.in_features,
            out_features: self.out_features,
        })
    }

    /// Applies the layer to `rows` rows of `x`, returning `[rows, out]` (threads from
    /// rayon's pool).
    pub fn forward(&self, x: &[f32], rows: usize) -> Result<Vec<f32>, ModelError> {
        let mut y = match &self.weight {
            LinearWeight::Packed(w) => w.matmul(x, rows),
            LinearWeight::Int8(w) => w.matmul(x, rows),
            LinearWeight::Candle(w) => candle_forward(w, x, rows, self.in_features)?,
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

    /// This member's share of `y = x · Wᵀ (+ b)` into `out` (`[rows, out_features]`):
    /// stored, or added to what `out` holds (a residual). Members together cover every
    /// output once; each writes only its own columns, so `out` may be read by all
    /// after the next barrier. Candle-kernel layers are computed whole by member 0.
    pub fn forward_share(
        &self,
        member: &Member,
        x: &[f32],
        rows: usize,
        out: &SharedBuf,
        epilogue: Epilogue,
    ) -> Result<(), ModelError> {
        let width = self.out_features;
        // `Some` for both of our kernels' arms below.
        let panels = self.member_panels(member).unwrap_or_default();
        match &self.weight {
            LinearWeight::Packed(w) => {
                // SAFETY: members' panel shares are disjoint, so are their columns.
                let sink =
                    unsafe { out.sink(width, width, epilogue) }.with_bias(self.bias.as_deref());
                w.gemm_panels(x, rows, panels, &sink);
            }
            LinearWeight::Int8(w) => {
                // SAFETY: as above.
                let sink =
                    unsafe { out.sink(width, width, epilogue) }.with_bias(self.bias.as_deref());
                w.gemm_panels(x, rows, panels, &sink);
            }
            LinearWeight::Candle(w) => {
                if member.index() != 0 {
                    return Ok(());
                }
                let y = candle_forward(w, x, rows, self.in_features)?;
                // SAFETY: only member 0 writes, and nobody reads before the barrier.
                let dst = unsafe { out.get_mut(0..rows * width) };
                for (d, s) in dst.chunks_exact_mut(width).zip(y.chunks_exact(width)) {
                    for (o, (d, s)) in d.iter_mut().zip(s).enumerate() {
                        let v = s + self.bias.as_ref().map_or(0.0, |b| b[o]);
                        match epilogue {
                            Epilogue::Store => *d = v,
                            Epilogue::Accumulate => *d += v,
                        }
                    }
                }
            }
        }
        Ok(())
    }
}

fn candle_forward(w: &QMatMul, x: &[f32], rows: usize, inp: usize) -> Result<Vec<f32>, ModelError> {
    let t = Tensor::from_slice(x, (rows, inp), &Device::Cpu)?;
    Ok(t.apply(w)?.flatten_all()?.to_vec1::<f32>()?)
}
