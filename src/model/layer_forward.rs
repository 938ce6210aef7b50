//! One transformer block's forward over a flattened batch: the code both the engine's
//! forward (`Model::forward_into`) and the trainer's (`train::native`) run, so the
//! trainer's log-probabilities are the engine's bit for bit on the same weights.
//!
//! A layer is two runs of the process's [`team`] (norm → Q/K/V → RoPE;
//! then attention → O + residual → norm → gate/up → SwiGLU → down + residual), with
//! the KV writes on the calling thread between them. With a [`LayerRecord`] the same
//! run also keeps what a backward needs and the buffers would overwrite: the first
//! norm's output, the residual after attention, and SwiGLU's output beside its
//! untouched gate (the arithmetic of every value is unchanged).

use std::sync::Mutex;

use super::attention::{AttentionPlan, AttentionShape, SeqSpan};
use super::config::ModelConfig;
use super::error::ModelError;
use super::kernels::Epilogue;
use super::kv_format::KvFormat;
use super::kv_store::KvStore;
use super::linear::Linear;
use super::ops::{rms_norm_into, swiglu, swiglu_into, Rope};
use super::team::{self, Member, SharedBuf};

/// One transformer block's weights.
#[derive(Debug)]
pub struct Layer {
    /// RMSNorm weight before attention, `[hidden]`.
    pub attn_norm: Vec<f32>,
    /// Query projection, `hidden → heads × head_dim` (with its bias on Qwen2).
    pub q: Linear,
    /// Key projection, `hidden → kv_heads × head_dim` (with its bias on Qwen2).
    pub k: Linear,
    /// Value projection, `hidden → kv_heads × head_dim` (with its bias on Qwen2).
    pub v: Linear,
    /// Attention output projection, `heads × head_dim → hidden`.
    pub o: Linear,
    /// RMSNorm weight before the feed-forward block, `[hidden]`.
    pub ffn_norm: Vec<f32>,
    /// SwiGLU gate projection, `hidden → intermediate`.
    pub gate: Linear,
    /// SwiGLU up projection, `hidden → intermediate`.
    pub up: Linear,
    /// Feed-forward output projection, `intermediate → hidden`.
    pub down: Linear,
}

/// The per-layer work buffers of a forward over `rows` tokens, reused layer after
/// layer. After [`Block::run`] they hold that layer's values: `h` the second
/// norm's output, `q`/`k` after RoPE, `v`, `attn` (attention's output), `g` the
/// gate projection (SwiGLU's output instead when not recording), `u` the up one.
#[derive(Debug)]
pub struct LayerBuffers {
    /// `[rows, hidden_size]`: the second RMSNorm's output (the MLP's input).
    pub h: Vec<f32>,
    /// `[rows, num_heads × head_dim]`: queries after RoPE.
    pub q: Vec<f32>,
    /// `[rows, kv_dim]`: keys after RoPE.
    pub k: Vec<f32>,
    /// `[rows, kv_dim]`: values.
    pub v: Vec<f32>,
    /// `[rows, num_heads × head_dim]`: attention's output, before the O projection.
    pub attn: Vec<f32>,
    /// `[rows, intermediate_size]`: the gate projection (SwiGLU's output when not
    /// recording).
    pub g: Vec<f32>,
    /// `[rows, intermediate_size]`: the up projection.
    pub u: Vec<f32>,
}

impl LayerBuffers {
    /// Zeroed buffers for `rows` tokens of a model shaped as `cfg`.
    pub fn new(cfg: &ModelConfig, rows: usize) -> Self {
        let (hidden, q_dim, kv_dim, ff) = (
            cfg.hidden_size,
            cfg.q_dim(),
            cfg.kv_dim(),
            cfg.intermediate_size,
        );
        LayerBuffers {
            h: vec![0f32; rows * hidden],
            q: vec![0f32; rows * q_dim],
            k: vec![0f32; rows * kv_dim],
            v: vec![0f32; rows * kv_dim],
            attn: vec![0f32; rows * q_dim],
            g: vec![0f32; rows * ff],
            u: vec![0f32; rows * ff],
        }
    }
}

/// What a recording layer run keeps beside [`LayerBuffers`]: the values the buffers
/// would overwrite before the run ends.
#[derive(Debug, Default)]
pub struct LayerRecord {
    /// The attention norm's output (`[rows, hidden]`).
    pub h1: Vec<f32>,
    /// The residual stream after attention's projection (`[rows, hidden]`).
    pub x_mid: Vec<f32>,
    /// SwiGLU's output, the down projection's input (`[rows, ff]`); the gate stays
    /// in [`LayerBuffers::g`].
    pub act: Vec<f32>,
}

/// One block's weights with what its forward reads from the model around it.
pub(crate) struct Block<'a> {
    /// The model's dimensions and norm epsilon.
    pub config: &'a ModelConfig,
    /// The block's weights.
    pub layer: &'a Layer,
    /// Its index: where its keys and values go in the KV store.
    pub index: usize,
    /// The model's rotary embedding.
    pub rope: &'a Rope,
    /// What keys and values are rounded to before they are stored.
    pub kv_format: KvFormat,
}

impl Block<'_> {
    /// The block over the rows of `x` (`[rows, hidden]`, the residual stream, updated
    /// in place), its keys and values written to `kv` for `spans`. `angles[r]` are row
    /// `r`'s RoPE angles. With `record`, also keeps what a backward needs.
    pub fn run(
        &self,
        x: &mut [f32],
        bufs: &mut LayerBuffers,
        spans: &[SeqSpan],
        angles: &[Vec<(f32, f32)>],
        kv: &mut dyn KvStore,
        mut record: Option<&mut LayerRecord>,
    ) -> Result<(), ModelError> {
        self.project_qkv(x, bufs, angles)?;
        if let Some(rec) = record.as_deref_mut() {
            let (rows, ff) = (
                x.len() / self.config.hidden_size,
                self.config.intermediate_size,
            );
            rec.h1.clear();
            rec.h1.extend_from_slice(&bufs.h);
            rec.x_mid.resize(rows * self.config.hidden_size, 0.0);
            rec.act.resize(rows * ff, 0.0);
        }
        self.store_kv(bufs, spans, kv)?;
        self.attend_and_mlp(x, bufs, spans, &*kv, record)
    }

    /// The first team run: the attention norm into `h`, Q/K/V from it, RoPE on the
    /// queries and keys, and the keys and values rounded to the stored format.
    fn project_qkv(
        &self,
        x: &mut [f32],
        bufs: &mut LayerBuffers,
        angles: &[Vec<(f32, f32)>],
    ) -> Result<(), ModelError> {
        let (layer, rope, kv_format) = (self.layer, self.rope, self.kv_format);
        let (q_dim, kv_dim) = (self.config.q_dim(), self.config.kv_dim());
        let rows = x.len() / self.config.hidden_size;
        let eps = self.config.rms_norm_eps;
        let failure = Failure::default();
        let (xs, hs) = (SharedBuf::new(x), SharedBuf::new(&mut bufs.h));
        let (qs, ks, vs) = (
            SharedBuf::new(&mut bufs.q),
            SharedBuf::new(&mut bufs.k),
            SharedBuf::new(&mut bufs.v),
        );
        team::global().run(|m| {
            // SAFETY (every `get`/`get_mut` below): a member writes only its own
            // rows (`mine`) or, in a projection, its own columns, and reads what
            // others wrote only after the barrier that follows.
            let mine = unsafe { norm_share(m, &xs, &hs, &layer.attn_norm, eps) };
            m.barrier();
            let h_all = unsafe { hs.all() };
            failure.note(layer.q.forward_share(m, h_all, rows, &qs, Epilogue::Store));
            failure.note(layer.k.forward_share(m, h_all, rows, &ks, Epilogue::Store));
            failure.note(layer.v.forward_share(m, h_all, rows, &vs, Epilogue::Store));
            m.barrier();
            for r in mine {
                unsafe {
                    rope.rotate(qs.get_mut(r * q_dim..(r + 1) * q_dim), &angles[r]);
                    let key = ks.get_mut(r * kv_dim..(r + 1) * kv_dim);
                    rope.rotate(key, &angles[r]);
                    // Every store then holds the same values (`kv_format`).
                    kv_format.round(key);
                    kv_format.round(vs.get_mut(r * kv_dim..(r + 1) * kv_dim));
                }
            }
        });
        failure.take()
    }

    /// Each span's keys and values into the store, on the calling thread.
    fn store_kv(
        &self,
        bufs: &LayerBuffers,
        spans: &[SeqSpan],
        kv: &mut dyn KvStore,
    ) -> Result<(), ModelError> {
        let kv_dim = self.config.kv_dim();
        for span in spans {
            for i in 0..span.len {
                let r = span.row + i;
                kv.store(
                    self.index,
                    span.slot,
                    span.start + i,
                    &bufs.k[r * kv_dim..][..kv_dim],
                    &bufs.v[r * kv_dim..][..kv_dim],
                )?;
            }
        }
        Ok(())
    }

    /// The second team run: attention over the store, O + residual, the FFN norm,
    /// gate/up, SwiGLU and down + residual. With `record`, the residual after
    /// attention and SwiGLU's output are kept.
    fn attend_and_mlp(
        &self,
        x: &mut [f32],
        bufs: &mut LayerBuffers,
        spans: &[SeqSpan],
        kv: &dyn KvStore,
        record: Option<&mut LayerRecord>,
    ) -> Result<(), ModelError> {
        let cfg = self.config;
        let layer = self.layer;
        let (hidden, ff) = (cfg.hidden_size, cfg.intermediate_size);
        let rows = x.len() / hidden;
        let eps = cfg.rms_norm_eps;
        let shape = AttentionShape {
            num_heads: cfg.num_heads,
            num_kv_heads: cfg.num_kv_heads,
            head_dim: cfg.head_dim,
        };
        let plan = AttentionPlan::new(kv, self.index, spans, shape);
        let failure = Failure::default();
        let LayerBuffers {
            h, q, attn, g, u, ..
        } = bufs;
        attn.fill(0.0);
        let (xs, hs) = (SharedBuf::new(x), SharedBuf::new(h));
        let attn_s = SharedBuf::new(attn);
        let (gs, us) = (SharedBuf::new(g), SharedBuf::new(u));
        // Recording: the residual after attention and SwiGLU's output go here.
        let (x_mid, act) = match record {
            Some(rec) => (
                Some(SharedBuf::new(&mut rec.x_mid)),
                Some(SharedBuf::new(&mut rec.act)),
            ),
            None => (None, None),
        };
        let q = &*q;
        team::global().run(|m| {
            // SAFETY: as in the first run: own items (disjoint output ranges),
            // rows or columns only, others' results read after a barrier.
            for item in plan.share(m.index(), m.size()) {
                plan.attend_item(q, item, unsafe { attn_s.get_mut(plan.item_output(item)) });
            }
            m.barrier();
            let attn_all = unsafe { attn_s.all() };
            failure.note(
                layer
                    .o
                    .forward_share(m, attn_all, rows, &xs, Epilogue::Accumulate),
            );
            m.barrier();
            if let Some(x_mid) = &x_mid {
                // The same rows `norm_share` takes next: final after the barrier.
                let mine = m.share(rows);
                let span = mine.start * hidden..mine.end * hidden;
                unsafe { x_mid.get_mut(span.clone()).copy_from_slice(xs.get(span)) };
            }
            unsafe { norm_share(m, &xs, &hs, &layer.ffn_norm, eps) };
            m.barrier();
            let h_all = unsafe { hs.all() };
            failure.note(
                layer
                    .gate
                    .forward_share(m, h_all, rows, &gs, Epilogue::Store),
            );
            failure.note(layer.up.forward_share(m, h_all, rows, &us, Epilogue::Store));
            // SAFETY: gate and up are final in this member's columns (or after
            // the barrier inside); each member SwiGLUs its own share.
            unsafe { swiglu_share(m, layer, (rows, ff), &gs, &us, act.as_ref()) };
            m.barrier();
            let down_in = match &act {
                Some(act) => unsafe { act.all() },
                None => unsafe { gs.all() },
            };
            failure.note(
                layer
                    .down
                    .forward_share(m, down_in, rows, &xs, Epilogue::Accumulate),
            );
        });
        failure.take()
    }
}

/// SwiGLU over this member's share of the `[rows, ff]` gate (into `act` when recording, else in
/// place) once the gate and up projections are written.
///
/// # Safety
/// Every member of the run calls it at once, right after its gate and up
/// projections; nobody reads `gate` (or `act`) until the next barrier.
unsafe fn swiglu_share(
    m: &Member,
    layer: &Layer,
    (rows, ff): (usize, usize),
    gate: &SharedBuf,
    up: &SharedBuf,
    act: Option<&SharedBuf>,
) {
    let glu = |span: std::ops::Range<usize>| match act {
        Some(act) => swiglu_into(
            gate.get(span.clone()),
            up.get(span.clone()),
            act.get_mut(span),
        ),
        None => swiglu(gate.get_mut(span.clone()), up.get(span)),
    };
    match (layer.gate.member_columns(m), layer.up.member_columns(m)) {
        // This member wrote these columns of both, every row: SwiGLU them without
        // waiting for the others. (Gate and up are as wide, so every member takes
        // this arm or none does.)
        (Some(cols), Some(up_cols)) if cols == up_cols => {
            for r in 0..rows {
                glu(r * ff + cols.start..r * ff + cols.end);
            }
        }
        _ => {
            m.barrier();
            glu(m.share(rows * ff));
        }
    }
}

/// This member's share of the rows of `x` (`[rows, weight.len()]`), RMS-normalised
/// into the same rows of `h`; returns the rows it took.
///
/// # Safety
/// Every member of the run calls it at once (disjoint shares), and nobody reads those
/// rows of `h` or writes those of `x` until the next barrier.
unsafe fn norm_share(
    m: &Member,
    x: &SharedBuf,
    h: &SharedBuf,
    weight: &[f32],
    eps: f64,
) -> std::ops::Range<usize> {
    let width = weight.len();
    let mine = m.share(x.len() / width);
    let span = mine.start * width..mine.end * width;
    rms_norm_into(x.get(span.clone()), weight, eps, h.get_mut(span));
    mine
}

/// The first error any member of a run hit (only candle-kernel layers can fail).
#[derive(Default)]
pub(crate) struct Failure(Mutex<Option<ModelError>>);

impl Failure {
    pub(crate) fn note(&self, result: Result<(), ModelError>) {
        if let Err(e) = result {
            let mut slot = self.0.lock().unwrap_or_else(|p| p.into_inner());
            slot.get_or_insert(e);
        }
    }

    pub(crate) fn take(&self) -> Result<(), ModelError> {
        match self.0.lock().unwrap_or_else(|p| p.into_inner()).take() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }
}
