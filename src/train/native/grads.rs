//! The trainer's weights as plain f32 slices (read in place from their candle
//! `Var`s, never copied) and the gradients as plain f32 buffers, one per weight in
//! [`Params::named`] order, accumulated micro-batch after micro-batch.

use candle_core::{CpuStorage, Device, Storage, Tensor, Var};

use super::super::error::TrainError;
use super::super::params::Params;

/// Runs `f` on `var`'s values (f32, contiguous) where they lie.
pub fn with_f32<R>(var: &Var, f: impl FnOnce(&[f32]) -> R) -> Result<R, TrainError> {
    let (storage, layout) = var.as_tensor().storage_and_layout();
    match (&*storage, layout.contiguous_offsets()) {
        (Storage::Cpu(CpuStorage::F32(v)), Some((a, b))) => Ok(f(&v[a..b])),
        _ => Err(TrainError::BadBatch(format!(
            "the native trainer runs on contiguous f32 weights, not {:?}",
            var.dtype()
        ))),
    }
}

/// Where each weight's gradient sits in [`Grads::bufs`] ([`Params::named`] order).
#[derive(Debug, Clone, Copy)]
pub struct LayerSlots {
    /// Slot of [`LayerParams::attn_norm`](crate::train::params::LayerParams::attn_norm)'s gradient.
    pub attn_norm: usize,
    /// Slot of the query projection's gradient.
    pub q: usize,
    /// Slot of the key projection's gradient.
    pub k: usize,
    /// Slot of the value projection's gradient.
    pub v: usize,
    /// q, k, v biases (qwen2).
    pub bias: Option<[usize; 3]>,
    /// Slot of the attention output projection's gradient.
    pub o: usize,
    /// Slot of the MLP's RMSNorm gain's gradient.
    pub ffn_norm: usize,
    /// Slot of the SwiGLU gate projection's gradient.
    pub gate: usize,
    /// Slot of the SwiGLU up projection's gradient.
    pub up: usize,
    /// Slot of the MLP down projection's gradient.
    pub down: usize,
}

/// One gradient buffer per weight, zero to start.
#[derive(Debug)]
pub struct Grads {
    /// One buffer per weight, in [`Params::named`] order, each as long as its
    /// weight's element count (row-major, the weight's own shape).
    pub bufs: Vec<Vec<f32>>,
    /// Each block's slots into `bufs`, first block first.
    pub layers: Vec<LayerSlots>,
    /// Slot of the token embedding's gradient (always 0: it is named first).
    pub embedding: usize,
    /// Slot of the final RMSNorm gain's gradient.
    pub final_norm: usize,
    /// The output projection's: the embedding's slot when tied.
    pub head: usize,
    shapes: Vec<Vec<usize>>,
}

impl Grads {
    /// Zeroed buffers shaped like every weight of `params`, with their slots.
    pub fn zeros(params: &Params) -> Self {
        let named = params.named();
        let bufs = named
            .iter()
            .map(|(_, v)| vec![0f32; v.elem_count()])
            .collect();
        let shapes = named.iter().map(|(_, v)| v.dims().to_vec()).collect();
        let mut at = 1;
        let mut layers = Vec::with_capacity(params.layers.len());
        for l in &params.layers {
            let mut next = || {
                at += 1;
                at - 1
            };
            let (attn_norm, q, k, v) = (next(), next(), next(), next());
            let bias = l.qkv_bias.as_ref().map(|_| [next(), next(), next()]);
            let (o, ffn_norm, gate, up, down) = (next(), next(), next(), next(), next());
            layers.push(LayerSlots {
                attn_norm,
                q,
                k,
                v,
                bias,
                o,
                ffn_norm,
                gate,
                up,
                down,
            });
        }
        let final_norm = at;
        let head = if params.lm_head.is_some() { at + 1 } else { 0 };
        Grads {
            bufs,
            layers,
            embedding: 0,
            final_norm,
            head,
            shapes,
        }
    }

    /// The buffers as tensors in [`Params::named`] order (moved, not copied).
    pub fn into_tensors(self) -> Result<Vec<Tensor>, TrainError> {
        self.bufs
            .into_iter()
            .zip(self.shapes)
            .map(|(b, s)| Ok(Tensor::from_vec(b, s, &Device::Cpu)?))
            .collect()
    }
}
