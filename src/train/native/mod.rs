//! The trainer's own decoder: the engine's forward, run over a packed trie, and a
//! backward written by hand — the network exists once.
//!
//! Forward: the trie's edges are the batch's sequences and [`TreeKvStore`] hands each
//! its ancestors' keys and values, so [`Model::run_layer`] — the very code the engine
//! runs, on the same kernels and in the same order — computes every row, and the
//! head scores targets with the sampler's log-normaliser: on dense f32 weights a
//! token's log-probability here equals the rollout's bit for bit.
//!
//! Backward: per layer, from the top, the layer's forward is run again from its saved
//! input while recording what its backward reads (one layer's activations live at a
//! time: memory is the layers' inputs plus one layer, whatever the depth), then
//! [`block_backward`] (linear layers as two `gemm` products each, RMSNorm, SwiGLU,
//! RoPE row by row, tree attention's backward as tiled matrix products). Gradients land in plain f32 buffers
//! ([`Grads`]) read from and shaped like the [`Params`] they belong to.
//!
//! f32 only; the candle-autodiff decoder (`oracle/`, compiled for the tests only)
//! remains, in f32 and f64, as the oracle the tests hold this one to.

pub mod attention_backward;
pub mod grads;
pub mod head;
pub mod layer_backward;
pub mod matmul;
pub mod tree_store;

use std::sync::Arc;

use candle_core::{DType, Tensor};

use super::decoder::{Decoder, Scores};
use super::error::TrainError;
use super::pack::{check_batch, PackedBatch};
use super::params::Params;
use crate::model::attention::SeqSpan;
use crate::model::kernels::WeightFormat;
use crate::model::layer_forward::{LayerBuffers, LayerRecord};
use crate::model::ops::rms_norm;
use crate::model::{KvFormat, Model};

use grads::with_f32;
pub use grads::Grads;
use head::RowScore;
use layer_backward::{block_backward, rms_norm_backward, BlockInputs, BlockScratch};
use tree_store::{edge_spans, TreeKvStore};

/// The trainer's weights as the engine's model, beside the [`Params`] they came from.
pub struct NativeDecoder<'p> {
    params: &'p Params,
    /// The same values packed for our kernels: what the engine serves after a swap,
    /// and, when the caller hands it in, the very model the engine serves.
    model: Arc<Model>,
}

/// What a forward computed, and (when kept for a backward) what it saved.
#[derive(Debug)]
pub struct NativeForward {
    /// `log p` of each target under `logits / T`.
    pub logp: Vec<f64>,
    /// Each scored row's entropy.
    pub entropy: Vec<f64>,
    scores: Vec<RowScore>,
    /// The residual stream entering each layer (empty unless kept).
    layer_inputs: Vec<Vec<f32>>,
    /// The scored rows' final hidden state, before and after the final norm.
    x_scored: Vec<f32>,
    hs: Vec<f32>,
    spans: Vec<SeqSpan>,
    angles: Vec<Vec<(f32, f32)>>,
    temperature: f32,
}

/// Whether `model` serves `params`' values: the same shape, f32 throughout (keys and
/// values, every matrix), and equal values at samples of every weight (each norm
/// whole, the embedding's first and last rows, each matrix's first row).
fn serves(model: &Model, params: &Params) -> Result<bool, TrainError> {
    let c = model.config();
    if c != &params.config || model.kv_format != KvFormat::F32 {
        return Ok(false);
    }
    let hidden = c.hidden_size;
    let equal = |var: &candle_core::Var, ours: &[f32]| with_f32(var, |w| w.starts_with(ours));
    let emb = &model.embedding;
    let mut same = equal(&params.final_norm, &model.final_norm)?
        && equal(&params.embedding, &emb[..hidden])?
        && with_f32(&params.embedding, |w| {
            w[w.len() - hidden..] == emb[emb.len() - hidden..]
        })?;
    for (lp, l) in params.layers.iter().zip(&model.layers) {
        same = same && equal(&lp.attn_norm, &l.attn_norm)? && equal(&lp.ffn_norm, &l.ffn_norm)?;
        for (var, lin) in [
            (&lp.q, &l.q),
            (&lp.k, &l.k),
            (&lp.v, &l.v),
            (&lp.o, &l.o),
            (&lp.gate, &l.gate),
            (&lp.up, &l.up),
            (&lp.down, &l.down),
        ] {
            let Some(packed) = lin
                .packed_weights()
                .filter(|p| p.format() == WeightFormat::F32)
            else {
                return Ok(false);
            };
            let row: Vec<f32> = (0..lin.in_features())
                .map(|k| packed.weight(0, k))
                .collect();
            same = same && equal(var, &row)?;
        }
    }
    Ok(same)
}

impl<'p> NativeDecoder<'p> {
    /// A decoder over `params` (f32): their values packed once for the forward.
    pub fn new(params: &'p Params) -> Result<Self, TrainError> {
        if params.dtype() != DType::F32 {
            return Err(TrainError::BadBatch(format!(
                "the native trainer runs in f32, not {:?}",
                params.dtype()
            )));
        }
        Ok(NativeDecoder {
            params,
            model: Arc::new(params.to_model(WeightFormat::F32)?),
        })
    }

    /// A decoder over `params` that runs `served` — the model an engine serves, no
    /// second copy of the weights — when it holds exactly these weights (f32
    /// matrices, f32 keys and values, and equal values where `serves` samples
    /// them: an update changes every weight), else over a copy packed anew.
    pub fn sharing(params: &'p Params, served: Option<&Arc<Model>>) -> Result<Self, TrainError> {
        match served {
            Some(model) if params.dtype() == DType::F32 && serves(model, params)? => {
                Ok(NativeDecoder {
                    params,
                    model: model.clone(),
                })
            }
            _ => Self::new(params),
        }
    }

    /// The packed model the forward runs.
    pub fn model(&self) -> &Model {
        &self.model
    }

    /// Log-probabilities and entropies of `batch`'s targets under `logits /
    /// temperature`; with `for_backward`, also what [`Self::backward`] needs.
    pub fn forward(
        &self,
        batch: &PackedBatch,
        temperature: f64,
        for_backward: bool,
    ) -> Result<NativeForward, TrainError> {
        let c = self.model.config();
        check_batch(c, batch, temperature)?;
        let layout = &*batch.layout;
        let spans = edge_spans(layout);
        let angles: Vec<Vec<(f32, f32)>> = layout
            .positions()
            .iter()
            .map(|&p| self.model.rope.angles(p as usize))
            .collect();
        let (hidden, rows) = (c.hidden_size, batch.tokens.len());
        let mut x = Vec::with_capacity(rows * hidden);
        for &t in &batch.tokens {
            x.extend_from_slice(&self.model.embedding[t as usize * hidden..][..hidden]);
        }
        let mut store = TreeKvStore::new(layout, &spans, c.kv_dim());
        let mut bufs = LayerBuffers::new(c, rows);
        let mut layer_inputs = Vec::new();
        for l in 0..c.num_layers {
            if for_backward {
                layer_inputs.push(x.clone());
            }
            self.model
                .run_layer(l, &mut x, &mut bufs, &spans, &angles, &mut store, None)?;
        }
        drop(bufs);
        let mut x_scored = Vec::with_capacity(batch.score_rows.len() * hidden);
        for &r in &batch.score_rows {
            x_scored.extend_from_slice(&x[r as usize * hidden..][..hidden]);
        }
        let mut hs = x_scored.clone();
        rms_norm(&mut hs, &self.model.final_norm, c.rms_norm_eps);
        let temperature = temperature as f32;
        let scores = head::score(&self.model.lm_head, &hs, &batch.targets, temperature)?;
        Ok(NativeForward {
            logp: scores.iter().map(|s| s.logp).collect(),
            entropy: scores.iter().map(|s| s.entropy).collect(),
            scores,
            layer_inputs,
            x_scored: if for_backward { x_scored } else { Vec::new() },
            hs: if for_backward { hs } else { Vec::new() },
            spans,
            angles,
            temperature,
        })
    }

    /// Adds to `grads` the gradient of `Σ g_logp·logp + Σ g_entropy·H` over the
    /// forward's targets (`fwd` from [`Self::forward`] with `for_backward`).
    pub fn backward(
        &self,
        batch: &PackedBatch,
        mut fwd: NativeForward,
        g_logp: &[f64],
        g_entropy: &[f64],
        grads: &mut Grads,
    ) -> Result<(), TrainError> {
        let c = self.model.config();
        let m = batch.targets.len();
        if fwd.layer_inputs.len() != c.num_layers || g_logp.len() != m || g_entropy.len() != m {
            return Err(TrainError::BadBatch(format!(
                "a backward of {} targets given {} and {} gradients, after a forward that kept {} layers",
                m,
                g_logp.len(),
                g_entropy.len(),
                fwd.layer_inputs.len()
            )));
        }
        let mut dx = self.head_backward(batch, &fwd, g_logp, g_entropy, grads)?;
        self.layers_backward(batch, &mut fwd, &mut dx, grads)?;
        let emb = &mut grads.bufs[grads.embedding];
        add_rows(emb, &batch.tokens, &dx, c.hidden_size);
        Ok(())
    }

    /// The head's and the final norm's backward: adds their weights' gradients
    /// to `grads` and returns the gradient at the last layer's output, one
    /// `hidden` row per batch row (zero on the rows that score nothing).
    fn head_backward(
        &self,
        batch: &PackedBatch,
        fwd: &NativeForward,
        g_logp: &[f64],
        g_entropy: &[f64],
        grads: &mut Grads,
    ) -> Result<Vec<f32>, TrainError> {
        let c = self.model.config();
        let (hidden, rows, m) = (c.hidden_size, batch.tokens.len(), batch.targets.len());
        let mut dhs = vec![0f32; m * hidden];
        let head_slot = grads.head;
        with_f32(self.params.head(), |w| {
            head::backward(
                &self.model.lm_head,
                w,
                &fwd.hs,
                &batch.targets,
                &fwd.scores,
                g_logp,
                g_entropy,
                fwd.temperature,
                &mut dhs,
                &mut grads.bufs[head_slot],
            )
        })??;
        let mut dx = vec![0f32; rows * hidden];
        let mut dx_scored = vec![0f32; m * hidden];
        rms_norm_backward(
            &fwd.x_scored,
            &self.model.final_norm,
            c.rms_norm_eps,
            &dhs,
            &mut dx_scored,
            &mut grads.bufs[grads.final_norm],
        );
        drop(dhs);
        add_rows(&mut dx, &batch.score_rows, &dx_scored, hidden);
        Ok(dx)
    }

    /// The blocks' backward, top layer first: each layer's forward is run
    /// again from its saved input (consumed from `fwd.layer_inputs`) to record
    /// what [`block_backward`] reads, which then takes `dx` from the layer's
    /// output to its input and adds the layer's weight gradients to `grads`.
    fn layers_backward(
        &self,
        batch: &PackedBatch,
        fwd: &mut NativeForward,
        dx: &mut [f32],
        grads: &mut Grads,
    ) -> Result<(), TrainError> {
        let c = self.model.config();
        let rows = batch.tokens.len();
        let layout = &*batch.layout;
        let mut store = TreeKvStore::new(layout, &fwd.spans, c.kv_dim());
        let mut bufs = LayerBuffers::new(c, rows);
        let mut record = LayerRecord::default();
        let mut scratch = BlockScratch::default();
        for l in (0..c.num_layers).rev() {
            let x_in = fwd.layer_inputs.pop().expect("one input per layer");
            let mut x = x_in.clone();
            self.model.run_layer(
                l,
                &mut x,
                &mut bufs,
                &fwd.spans,
                &fwd.angles,
                &mut store,
                Some(&mut record),
            )?;
            drop(x);
            let layer = &self.model.layers[l];
            let inputs = BlockInputs {
                config: c,
                layout,
                rope: &self.model.rope,
                angles: &fwd.angles,
                x_in: &x_in,
                bufs: &bufs,
                record: &record,
                attn_norm: &layer.attn_norm,
                ffn_norm: &layer.ffn_norm,
            };
            let slots = grads.layers[l];
            block_backward(
                &inputs,
                &self.params.layers[l],
                &slots,
                dx,
                grads,
                &mut scratch,
            )?;
        }
        Ok(())
    }
}

/// Adds each `hidden`-wide row of `src` to row `rows[k]` of `dst`, in order
/// (a row named twice gets both, the first first): how a gradient over a
/// subset or a gather of rows lands back on the rows it came from.
fn add_rows(dst: &mut [f32], rows: &[u32], src: &[f32], hidden: usize) {
    for (&r, d) in rows.iter().zip(src.chunks_exact(hidden)) {
        for (a, b) in dst[r as usize * hidden..][..hidden].iter_mut().zip(d) {
            *a += b;
        }
    }
}

impl Decoder for NativeDecoder<'_> {
    type Saved = NativeForward;
    type Grads = Grads;

    fn forward(
        &self,
        batch: &PackedBatch,
        temperature: f64,
        for_backward: bool,
    ) -> Result<Scores<NativeForward>, TrainError> {
        let mut saved = NativeDecoder::forward(self, batch, temperature, for_backward)?;
        // The backward reads the rows' scores, not these copies of them.
        Ok(Scores {
            logp: std::mem::take(&mut saved.logp),
            entropy: std::mem::take(&mut saved.entropy),
            saved,
        })
    }

    fn zero_grads(&self) -> Result<Grads, TrainError> {
        Ok(Grads::zeros(self.params))
    }

    fn backward(
        &self,
        batch: &PackedBatch,
        saved: NativeForward,
        g_logp: &[f64],
        g_entropy: &[f64],
        grads: &mut Grads,
    ) -> Result<(), TrainError> {
        NativeDecoder::backward(self, batch, saved, g_logp, g_entropy, grads)
    }

    fn gradient_tensors(&self, grads: Grads) -> Result<Vec<Tensor>, TrainError> {
        grads.into_tensors()
    }
}
