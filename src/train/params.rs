//! [`Params`]: the trainable weights of a decoder, one candle [`Var`] each, named as in
//! an HF checkpoint (`model.layers.3.self_attn.q_proj.weight`, …).
//!
//! They start from a loaded [`Model`]: quantised GGUF weights are dequantised to the
//! dtype asked for (f32 for training, f64 for the finite-difference oracle), dense
//! safetensors weights are taken as they are. The RoPE pairing stays the model's
//! ([`RopeStyle`](crate::model::RopeStyle)): a llama GGUF keeps its permuted Q/K
//! rows and interleaved rotation, and a checkpoint un-permutes them when it is
//! written (see `checkpoint`).
//! With tied embeddings the output projection *is* the embedding `Var`, so its
//! gradient is the sum of both uses.

use candle_core::{DType, Device, Tensor, Var};

use super::error::TrainError;
use crate::model::{Model, ModelConfig};

/// One transformer block's trainable weights (`[out, in]` matrices, vectors).
#[derive(Debug)]
pub struct LayerParams {
    /// RMSNorm gain applied before attention (`input_layernorm`), `[hidden]`.
    pub attn_norm: Var,
    /// Query projection `[num_heads * head_dim, hidden]`; for a llama GGUF its rows keep
    /// the GGUF's RoPE permutation (see the module doc).
    pub q: Var,
    /// Key projection `[num_kv_heads * head_dim, hidden]`, permuted like `q`.
    pub k: Var,
    /// Value projection `[num_kv_heads * head_dim, hidden]`.
    pub v: Var,
    /// q/k/v biases (qwen2), all three or none.
    pub qkv_bias: Option<[Var; 3]>,
    /// Attention output projection `[hidden, num_heads * head_dim]`.
    pub o: Var,
    /// RMSNorm gain applied before the MLP (`post_attention_layernorm`), `[hidden]`.
    pub ffn_norm: Var,
    /// SwiGLU gate projection `[intermediate, hidden]` (passed through SiLU).
    pub gate: Var,
    /// SwiGLU up projection `[intermediate, hidden]` (multiplied by the gated branch).
    pub up: Var,
    /// MLP output projection `[hidden, intermediate]`.
    pub down: Var,
}

/// Every trainable weight of the decoder.
#[derive(Debug)]
pub struct Params {
    /// The shape of the decoder these weights belong to (sizes, RoPE, norm epsilon).
    pub config: ModelConfig,
    /// Token embedding table `[vocab, hidden]`; also the output projection when
    /// `lm_head` is `None`.
    pub embedding: Var,
    /// The transformer blocks, first to last (`config.num_layers` of them).
    pub layers: Vec<LayerParams>,
    /// RMSNorm gain applied after the last block (`model.norm`), `[hidden]`.
    pub final_norm: Var,
    /// The output projection; `None` when tied to the embedding.
    pub lm_head: Option<Var>,
}

fn var(data: Vec<f32>, shape: &[usize], dtype: DType) -> Result<Var, TrainError> {
    let t = Tensor::from_vec(data, shape, &Device::Cpu)?.to_dtype(dtype)?;
    Ok(Var::from_tensor(&t)?)
}

impl Params {
    /// Trainable f32 copies of `model`'s weights: the master weights every update of
    /// the product trains (f64 copies, [`Self::from_model`], are the tests' oracle).
    pub fn trainable(model: &Model) -> Result<Self, TrainError> {
        Self::from_model(model, DType::F32)
    }

    /// Calls `f` with each weight's name and values as f32, in [`Self::named`] order,
    /// one tensor at a time (a hash over the weights, a comparison).
    pub fn for_each_f32(&self, mut f: impl FnMut(&str, &[f32])) -> Result<(), TrainError> {
        for (name, var) in self.named() {
            let values = var
                .as_tensor()
                .to_dtype(DType::F32)?
                .flatten_all()?
                .to_vec1::<f32>()?;
            f(&name, &values);
        }
        Ok(())
    }

    /// Trainable copies of `model`'s weights in `dtype` (F32 or F64).
    pub fn from_model(model: &Model, dtype: DType) -> Result<Self, TrainError> {
        let c = model.config().clone();
        let (h, q, kv, ff) = (c.hidden_size, c.q_dim(), c.kv_dim(), c.intermediate_size);
        let matrix = |lin: &crate::model::linear::Linear, out: usize, inp: usize| {
            var(lin.dense_weight()?, &[out, inp], dtype)
        };
        let mut layers = Vec::with_capacity(c.num_layers);
        for l in &model.layers {
            let qkv_bias = match (l.q.bias(), l.k.bias(), l.v.bias()) {
                (Some(bq), Some(bk), Some(bv)) => Some([
                    var(bq.to_vec(), &[q], dtype)?,
                    var(bk.to_vec(), &[kv], dtype)?,
                    var(bv.to_vec(), &[kv], dtype)?,
                ]),
                _ => None,
            };
            layers.push(LayerParams {
                attn_norm: var(l.attn_norm.clone(), &[h], dtype)?,
                q: matrix(&l.q, q, h)?,
                k: matrix(&l.k, kv, h)?,
                v: matrix(&l.v, kv, h)?,
                qkv_bias,
                o: matrix(&l.o, h, q)?,
                ffn_norm: var(l.ffn_norm.clone(), &[h], dtype)?,
                gate: matrix(&l.gate, ff, h)?,
                up: matrix(&l.up, ff, h)?,
                down: matrix(&l.down, h, ff)?,
            });
        }
        let embedding = var(model.embedding.clone(), &[c.vocab_size, h], dtype)?;
        let lm_head = if c.tie_word_embeddings {
            None
        } else {
            Some(matrix(&model.lm_head, c.vocab_size, h)?)
        };
        Ok(Params {
            final_norm: var(model.final_norm.clone(), &[h], dtype)?,
            config: c,
            embedding,
            layers,
            lm_head,
        })
    }

    /// The output projection `[vocab, hidden]` (the embedding when tied).
    pub fn head(&self) -> &Var {
        self.lm_head.as_ref().unwrap_or(&self.embedding)
    }

    /// Every trainable weight with its HF name, in a fixed order.
    pub fn named(&self) -> Vec<(String, &Var)> {
        let mut out = vec![("model.embed_tokens.weight".to_string(), &self.embedding)];
        for (i, l) in self.layers.iter().enumerate() {
            let p = format!("model.layers.{i}");
            out.push((format!("{p}.input_layernorm.weight"), &l.attn_norm));
            out.push((format!("{p}.self_attn.q_proj.weight"), &l.q));
            out.push((format!("{p}.self_attn.k_proj.weight"), &l.k));
            out.push((format!("{p}.self_attn.v_proj.weight"), &l.v));
            if let Some([bq, bk, bv]) = &l.qkv_bias {
                out.push((format!("{p}.self_attn.q_proj.bias"), bq));
                out.push((format!("{p}.self_attn.k_proj.bias"), bk));
                out.push((format!("{p}.self_attn.v_proj.bias"), bv));
            }
            out.push((format!("{p}.self_attn.o_proj.weight"), &l.o));
            out.push((format!("{p}.post_attention_layernorm.weight"), &l.ffn_norm));
            out.push((format!("{p}.mlp.gate_proj.weight"), &l.gate));
            out.push((format!("{p}.mlp.up_proj.weight"), &l.up));
            out.push((format!("{p}.mlp.down_proj.weight"), &l.down));
        }
        out.push(("model.norm.weight".to_string(), &self.final_norm));
        if let Some(head) = &self.lm_head {
            out.push(("lm_head.weight".to_string(), head));
        }
        out
    }

    /// Number of trainable scalars.
    pub fn count(&self) -> usize {
        self.named().iter().map(|(_, v)| v.elem_count()).sum()
    }

    /// The dtype every weight is held in (F32 for training, F64 for the oracle).
    pub fn dtype(&self) -> DType {
        self.embedding.dtype()
    }
}
