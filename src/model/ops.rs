//! Row-wise kernels on plain f32 slices: RMSNorm, RoPE and SwiGLU.
//!
//! They work row by row in a fixed order, so a token's result never depends on which
//! other tokens share the batch.

use super::config::{ModelConfig, RopeStyle};
use super::kernels::exp_in_place;

/// In-place RMSNorm of each `width`-wide row of `x`, scaled by `weight`.
pub fn rms_norm(x: &mut [f32], weight: &[f32], eps: f64) {
    let width = weight.len();
    for row in x.chunks_exact_mut(width) {
        let scale = rms_scale(row, eps);
        for (v, w) in row.iter_mut().zip(weight) {
            *v = *v * scale * w;
        }
    }
}

/// RMSNorm of each `width`-wide row of `src` into `dst`: the same arithmetic as
/// [`rms_norm`].
pub fn rms_norm_into(src: &[f32], weight: &[f32], eps: f64, dst: &mut [f32]) {
    let width = weight.len();
    for (row, out) in src.chunks_exact(width).zip(dst.chunks_exact_mut(width)) {
        let scale = rms_scale(row, eps);
        for ((o, v), w) in out.iter_mut().zip(row).zip(weight) {
            *o = *v * scale * w;
        }
    }
}

fn rms_scale(row: &[f32], eps: f64) -> f32 {
    let sum_sq: f32 = row.iter().map(|v| v * v).sum();
    1.0 / ((sum_sq / row.len() as f32) + eps as f32).sqrt()
}

/// Precomputed RoPE inverse frequencies for one head width.
#[derive(Debug, Clone)]
pub struct Rope {
    inv_freq: Vec<f32>,
    style: RopeStyle,
}

impl Rope {
    /// The rotation `config` declares: its theta, scaling and pairing.
    pub fn new(config: &ModelConfig) -> Self {
        Rope {
            inv_freq: super::rope::inverse_frequencies(
                config.head_dim,
                config.rope_theta,
                &config.rope_scaling,
            ),
            style: config.rope_style,
        }
    }

    /// Rotates every head of one token's `[heads * head_dim]` row in place.
    pub fn apply(&self, row: &mut [f32], position: usize) {
        let angles = self.angles(position);
        self.rotate(row, &angles);
    }

    /// `(sin, cos)` of each frequency at `position`: the same for every head and every
    /// layer, so a forward computes them once per token (see [`Rope::rotate`]).
    pub fn angles(&self, position: usize) -> Vec<(f32, f32)> {
        self.inv_freq
            .iter()
            .map(|f| (position as f32 * f).sin_cos())
            .collect()
    }

    /// Rotates every head of one row by precomputed [`Rope::angles`].
    pub fn rotate(&self, row: &mut [f32], angles: &[(f32, f32)]) {
        self.each_pair(row, angles, |x0, x1, sin, cos| {
            (x0 * cos - x1 * sin, x0 * sin + x1 * cos)
        });
    }

    /// The backward of [`Rope::rotate`]: a row's gradient rotated by the opposite
    /// angles (a rotation's transpose is its inverse).
    pub fn rotate_back(&self, row: &mut [f32], angles: &[(f32, f32)]) {
        self.each_pair(row, angles, |d0, d1, sin, cos| {
            (d0 * cos + d1 * sin, d1 * cos - d0 * sin)
        });
    }

    /// Applies `f(x0, x1, sin, cos)` to every rotated pair of every head of `row`.
    #[inline(always)]
    fn each_pair(
        &self,
        row: &mut [f32],
        angles: &[(f32, f32)],
        f: impl Fn(f32, f32, f32, f32) -> (f32, f32),
    ) {
        let half = self.inv_freq.len();
        let head_dim = 2 * half;
        for head in row.chunks_exact_mut(head_dim) {
            for (i, &(sin, cos)) in angles.iter().enumerate() {
                let (a, b) = match self.style {
                    RopeStyle::Interleaved => (2 * i, 2 * i + 1),
                    RopeStyle::HalfSplit => (i, i + half),
                };
                (head[a], head[b]) = f(head[a], head[b], sin, cos);
            }
        }
    }
}

/// `silu(gate) * up`, written into `gate`: `g / (1 + exp(−g)) · u`, the `exp`s a
/// chunk at a time through the vector kernel (bit for bit `f32::exp`; one libm call
/// per element was 1.3% of a rollout).
pub fn swiglu(gate: &mut [f32], up: &[f32]) {
    const CHUNK: usize = 64;
    let mut e = [0f32; CHUNK];
    for (g, u) in gate.chunks_mut(CHUNK).zip(up.chunks(CHUNK)) {
        let e = &mut e[..g.len().min(u.len())];
        for (e, &g) in e.iter_mut().zip(g.iter()) {
            *e = -g;
        }
        exp_in_place(e);
        for ((g, &u), &e) in g.iter_mut().zip(u).zip(e.iter()) {
            *g = *g / (1.0 + e) * u;
        }
    }
}

/// [`swiglu`] into `out`, leaving `gate` as it is (a training forward keeps it for
/// the backward): the same arithmetic, so `out` is what `swiglu` writes bit for bit.
pub fn swiglu_into(gate: &[f32], up: &[f32], out: &mut [f32]) {
    out.copy_from_slice(gate);
    swiglu(out, up);
}
