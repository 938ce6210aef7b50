//! The fast precision mode's matmul: 8-bit activations against the file's block
//! quants, integer dot products per block (AVX-512 VNNI where the CPU has it), as
//! llama.cpp computes. Not the exact path: every activation is rounded to one of 255
//! levels per block of 32, so logits move (docs/numerics-and-precision.md gives the
//! measured drift). Still deterministic and batch-invariant: each block's dot product
//! is an exact integer, and the float steps after it run in one fixed order per output.
//!
//! Every supported format is read as `w = d · u + m` with an unsigned code `u` per
//! weight and `(d, m)` per output and block:
//!
//! - Q4_1: `u = q` (0..15), `m` as stored;
//! - Q4_0: `u = q` (0..15), `m = −8·d`;
//! - Q8_0: `u = q + 128` (0..255), `m = −128·d`.
//!
//! An activation block is `x ≈ dx · xq` with `xq` in −127..=127 and `dx = max|x| / 127`
//! (rounded to nearest, ties to even). Then a block contributes
//! `Σ w·x ≈ (d·dx)·Σ u·xq + m·(dx·Σ xq)`: one integer sum of 32 products and two fmas,
//! `acc = fma(Σ u·xq, d·dx, acc)` then `acc = fma(m, dx·Σ xq, acc)`, blocks in order.
//! The scalar and VNNI variants do exactly these operations, so they agree bit for bit.
//!
//! Layout ([`Int8Matrix`]): per panel of 16 outputs and block, the codes arranged so
//! that one 32-bit lane holds one output's codes for four consecutive `k` (what
//! `vpdpbusd` multiplies against four broadcast activation bytes). Q4 codes stay 4-bit:
//! 64 bytes hold 8 `k` of 16 outputs, low nibbles `k..k+4`, high nibbles `k+4..k+8`.
//! Scales and offsets stay f16 (as in the file), so a step reads as many bytes as
//! ggml's own blocks.

use half::f16;

use super::packed::{PackError, PackedMatrix, WeightFormat, BLOCK, PANEL};

/// A block-quantised matrix laid out for 8-bit activations (see the module docs).
#[derive(Debug, Clone)]
pub struct Int8Matrix {
    pub(super) source: WeightFormat,
    pub(super) out: usize,
    pub(super) inp: usize,
    pub(super) panels: usize,
    pub(super) blocks: usize,
    /// Bytes of codes per (panel, block): 256 for Q4 (nibbles), 512 for Q8_0.
    pub(super) block_bytes: usize,
    pub(super) codes: Vec<u8>,
    /// `d` as f16 bits, `[panel][block][16]`.
    pub(super) scales: Vec<u16>,
    /// Q4_1's `m` as f16 bits (same indexing); empty for the other formats.
    pub(super) offsets: Vec<u16>,
    /// Q4_0: 8, Q8_0: 128 (`m = −offset_code · d`); Q4_1: 0 (its `m` is stored).
    pub(super) offset_code: f32,
}

impl Int8Matrix {
    /// Relays out a Q4_0, Q4_1 or Q8_0 matrix (other formats have no integer codes).
    pub fn from_packed(m: &PackedMatrix) -> Result<Self, PackError> {
        let (nibbles, offset_code) = match m.format() {
            WeightFormat::Q4_0 => (true, 8.0),
            WeightFormat::Q4_1 => (true, 0.0),
            WeightFormat::Q8_0 => (false, 128.0),
            other => return Err(PackError::NotBlockFormat(other)),
        };
        let (out, inp, panels) = (m.out_features(), m.in_features(), m.panels());
        let blocks = inp / BLOCK;
        let block_bytes = if nibbles { 256 } else { 512 };
        let slots = panels * blocks * PANEL;
        let mut codes = vec![0u8; panels * blocks * block_bytes];
        let mut scales = vec![0u16; slots];
        let mut offsets = if m.format() == WeightFormat::Q4_1 {
            vec![0u16; slots]
        } else {
            Vec::new()
        };
        for o in 0..out {
            let (p, l) = (o / PANEL, o % PANEL);
            for b in 0..blocks {
                let slot = (p * blocks + b) * PANEL + l;
                // The scales are f16 values in the file: the round trip is exact.
                scales[slot] = f16::from_f32(m.block_scale(o, b)).to_bits();
                if !offsets.is_empty() {
                    offsets[slot] = f16::from_f32(m.block_offset(o, b)).to_bits();
                }
                let base = (p * blocks + b) * block_bytes;
                let code = |j: usize| m.block_code(o, b * BLOCK + j);
                if nibbles {
                    for c in 0..4 {
                        for t in 0..4 {
                            codes[base + 64 * c + 4 * l + t] =
                                code(8 * c + t) | (code(8 * c + 4 + t) << 4);
                        }
                    }
                } else {
                    for g in 0..8 {
                        for t in 0..4 {
                            codes[base + 64 * g + 4 * l + t] = code(4 * g + t);
                        }
                    }
                }
            }
        }
        Ok(Int8Matrix {
            source: m.format(),
            out,
            inp,
            panels,
            blocks,
            block_bytes,
            codes,
            scales,
            offsets,
            offset_code,
        })
    }

    /// The format the codes came from.
    pub fn source_format(&self) -> WeightFormat {
        self.source
    }

    /// Output features: the matrix's rows.
    pub fn out_features(&self) -> usize {
        self.out
    }

    /// Input features: the matrix's columns (a multiple of 32).
    pub fn in_features(&self) -> usize {
        self.inp
    }

    /// Number of [`PANEL`]-wide output panels.
    pub fn panels(&self) -> usize {
        self.panels
    }

    /// Bytes of codes, scales and offsets a full pass reads.
    pub fn stored_bytes(&self) -> usize {
        self.codes.len() + 2 * (self.scales.len() + self.offsets.len())
    }

    /// Output `o`'s code for `k`.
    pub(super) fn code(&self, o: usize, k: usize) -> u8 {
        let (p, l, b, j) = (o / PANEL, o % PANEL, k / BLOCK, k % BLOCK);
        let base = (p * self.blocks + b) * self.block_bytes;
        if self.block_bytes == 256 {
            let (c, r) = (j / 8, j % 8);
            let byte = self.codes[base + 64 * c + 4 * l + r % 4];
            if r < 4 {
                byte & 0x0F
            } else {
                byte >> 4
            }
        } else {
            self.codes[base + 64 * (j / 4) + 4 * l + j % 4]
        }
    }

    /// `(d, m)` of output lane `l` of panel `p`, block `b`.
    #[inline]
    pub(super) fn scale_offset(&self, p: usize, b: usize, l: usize) -> (f32, f32) {
        let slot = (p * self.blocks + b) * PANEL + l;
        let d = f16::from_bits(self.scales[slot]).to_f32();
        let m = if self.offsets.is_empty() {
            d * -self.offset_code
        } else {
            f16::from_bits(self.offsets[slot]).to_f32()
        };
        (d, m)
    }

    /// The whole matrix as row-major f32 `[out, in]`: `d·u + m`, exactly the values of
    /// the matrix it was made from.
    pub fn to_dense(&self) -> Vec<f32> {
        let mut w = vec![0f32; self.out * self.inp];
        for o in 0..self.out {
            let (p, l) = (o / PANEL, o % PANEL);
            for k in 0..self.inp {
                let (d, m) = self.scale_offset(p, k / BLOCK, l);
                w[o * self.inp + k] = self.code(o, k) as f32 * d + m;
            }
        }
        w
    }
}

/// `rows` rows of activations as 8-bit blocks (see the module docs).
#[derive(Debug, Default)]
pub(super) struct QuantizedRows {
    /// `[rows, in]` quants.
    pub(super) q: Vec<i8>,
    /// `dx` per row and block, `[rows, blocks]`.
    pub(super) dx: Vec<f32>,
    /// `dx · Σ xq` per row and block.
    pub(super) sx: Vec<f32>,
    pub(super) inp: usize,
    pub(super) blocks: usize,
}

impl QuantizedRows {
    /// Sizes the buffers for `rows` rows of `inp` values.
    pub(super) fn resize(&mut self, rows: usize, inp: usize) {
        let blocks = inp / BLOCK;
        self.inp = inp;
        self.blocks = blocks;
        self.q.resize(rows * inp, 0);
        self.dx.resize(rows * blocks, 0.0);
        self.sx.resize(rows * blocks, 0.0);
    }

    /// The scalar quantisation (the VNNI variant has a vector twin giving the same
    /// bytes: `int8_vnni::quantize`).
    pub(super) fn quantize(&mut self, x: &[f32], rows: usize, inp: usize) {
        self.resize(rows, inp);
        for (i, (src, dst)) in x[..rows * inp]
            .chunks_exact(BLOCK)
            .zip(self.q.chunks_exact_mut(BLOCK))
            .enumerate()
        {
            let amax = src.iter().fold(0f32, |a, v| a.max(v.abs()));
            let d = amax / 127.0;
            let id = if d > 0.0 { 1.0 / d } else { 0.0 };
            let mut sum = 0i32;
            for (q, &v) in dst.iter_mut().zip(src) {
                let r = (v * id).round_ties_even().clamp(-127.0, 127.0) as i8;
                *q = r;
                sum += r as i32;
            }
            self.dx[i] = d;
            self.sx[i] = d * sum as f32;
        }
    }
}
