//! One transformer block's forward over a flattened batch: the code both the engine's
//! forward ([`Model::forward_into`]) and the trainer's (`train::native`) run, so the
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
use super::forward::Model;
use super::kernels::Epilogue;
use super::kv_store::KvStore;
use super::ops::{rms_norm_into, swiglu, swiglu_into};
use super::team::{self, Member, SharedBuf};

/// The per-layer work buffers of a forward over `rows` tokens, reused layer after
/// layer. After [`Model::run_layer`] they hold that layer's values: `h` the second
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

impl Model {
    /// Layer `l` over the rows of `x` (`[rows, hidden]`, the residual stream, updated
    /// in place), its keys and values written to `kv` for `spans`. `angles[r]` are row
    /// `r`'s RoPE angles. With `record`, also keeps what a backward needs.
    #[allow(clippy::too_many_arguments)]
    pub fn run_layer(
        &self,
        l: usize,
        x: &mut [f32],
        bufs: &mut LayerBuffers,
        spans: &[SeqSpan],
        angles: &[Vec<(f32, f32)>],
        kv: &mut dyn KvStore,
        mut record: Option<&mut LayerRecord>,
    ) -> Result<(), ModelError> {
        let cfg = &self.config;
        let layer = &self.layers[l];
        let (hidden, q_dim, kv_dim, ff) = (
            cfg.hidden_size,
            cfg.q_dim(),
            cfg.kv_dim(),
            cfg.intermediate_size,
        );
        let rows = x.len() / hidden;
        let eps = cfg.rms_norm_eps;
        let shape = AttentionShape {
            num_heads: cfg.num_heads,
            num_kv_heads: cfg.num_kv_heads,
            head_dim: cfg.head_dim,
        };
        let team = team::global();
        let failure = Failure::default();
        let LayerBuffers {
            h,
            q,
            k,
            v,
            attn,
            g,
            u,
        } = bufs;
        {
            let (xs, hs) = (SharedBuf::new(x), SharedBuf::new(h));
            let (qs, ks, vs) = (SharedBuf::new(q), SharedBuf::new(k), SharedBuf::new(v));
            team.run(|m| {
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
                        self.rope
                            .rotate(qs.get_mut(r * q_dim..(r + 1) * q_dim), &angles[r]);
                        let key = ks.get_mut(r * kv_dim..(r + 1) * kv_dim);
                        self.rope.rotate(key, &angles[r]);
                        // Every store then holds the same values (`kv_format`).
                        self.kv_format.round(key);
                        self.kv_format
                            .round(vs.get_mut(r * kv_dim..(r + 1) * kv_dim));
                    }
                }
            });
        }
        failure.take()?;
        if let Some(rec) = record.as_deref_mut() {
            rec.h1.clear();
            rec.h1.extend_from_slice(h);
            rec.x_mid.resize(rows * hidden, 0.0);
            rec.act.resize(rows * ff, 0.0);
        }
        for span in spans {
            for i in 0..span.len {
                let r = span.row + i;
                kv.store(
                    l,
                    span.slot,
                    span.start + i,
                    &k[r * kv_dim..][..kv_dim],
                    &v[r * kv_dim..][..kv_dim],
                )?;
            }
        }
        let plan = AttentionPlan::new(&*kv, l, spans, shape);
        attn.fill(0.0);
        {
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
            team.run(|m| {
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
                let glu = |span: std::ops::Range<usize>| unsafe {
                    match &act {
                        Some(act) => swiglu_into(
                            gs.get(span.clone()),
                            us.get(span.clone()),
                            act.get_mut(span),
                        ),
                        None => swiglu(gs.get_mut(span.clone()), us.get(span)),
                    }
                };
                match (layer.gate.member_columns(m), layer.up.member_columns(m)) {
                    // This member wrote these columns of both, every row: SwiGLU them
                    // without waiting for the others. (Gate and up are as wide, so
                    // every member takes this arm or none does.)
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
        }
        failure.take()
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
