//! Weight matrices repacked once, at load, into panels of 16 output rows.
//!
//! The kernels compute `y[r][o] = Σ_k x[r][k] · w[o][k]` with the outputs of a panel in
//! the 16 lanes of a vector: for each `k` one weight vector (16 outputs' weights at
//! that `k`) is multiplied by one broadcast activation and accumulated. So a panel
//! stores, for every `k`, its 16 weights side by side:
//!
//! - **f32**: `[panel][k][16]` floats.
//! - **bf16 / f16**: `[panel][k][16]` halves, widened to f32 exactly when read.
//! - **Q4_0 / Q4_1** (32-weight ggml blocks): per panel and block, 16 scales `d`, 16
//!   offsets `m` (Q4_1), and 16 byte-vectors, one per pair of `k`: byte `l` of pair `t`
//!   holds output `l`'s quant for `k = 32b + 2t` in its low nibble and for `k + 1` in
//!   its high nibble.
//! - **Q8_0**: per panel and block, 16 scales and 32 byte-vectors (signed quants).
//!
//! Every format is read as exactly the f32 value ggml's dequantisation gives
//! (`(q − 8)·d`, `q·d + m`, `q·d`, the widened half), so the kernels compute the same
//! numbers on a quantised matrix as on its dequantised copy ([`PackedMatrix::to_dense`]).
//! Rows past `out` in the last panel are zero weights and are never written out.

use half::{bf16, f16};

/// Outputs per panel: one AVX-512 vector of f32, two AVX2 vectors.
pub const PANEL: usize = 16;
/// Weights per ggml quantisation block.
pub const BLOCK: usize = 32;

/// How a matrix's weights are stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WeightFormat {
    /// 32-bit floats.
    F32,
    /// bfloat16, widened to f32 exactly when read.
    Bf16,
    /// IEEE half precision, widened to f32 exactly when read.
    F16,
    /// ggml Q4_0: `w = (q − 8) · d`.
    Q4_0,
    /// ggml Q4_1: `w = q · d + m`.
    Q4_1,
    /// ggml Q8_0: `w = q · d`, signed q.
    Q8_0,
}

impl WeightFormat {
    /// Whether the format is block-quantised (its `in` must be a multiple of 32).
    pub fn is_quantized(self) -> bool {
        matches!(
            self,
            WeightFormat::Q4_0 | WeightFormat::Q4_1 | WeightFormat::Q8_0
        )
    }

    /// Bytes per weight as stored (scales included), the memory a decode step reads.
    pub fn bytes_per_weight(self) -> f64 {
        match self {
            WeightFormat::F32 => 4.0,
            WeightFormat::Bf16 | WeightFormat::F16 => 2.0,
            WeightFormat::Q4_0 => 0.5 + 4.0 / 32.0,
            WeightFormat::Q4_1 => 0.5 + 8.0 / 32.0,
            WeightFormat::Q8_0 => 1.0 + 4.0 / 32.0,
        }
    }
}

/// Why a matrix could not be packed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PackError {
    #[error("a {format:?} matrix needs an input width that is a multiple of 32, not {inp}")]
    /// A block format's input width is not a multiple of [`BLOCK`].
    RaggedBlocks {
        /// The block format.
        format: WeightFormat,
        /// The input width given.
        inp: usize,
    },
    /// The ggml block bytes given do not match the matrix's shape.
    #[error("{format:?} [{out}, {inp}] needs {expected} bytes of ggml blocks, got {got}")]
    WrongByteCount {
        /// The block format.
        format: WeightFormat,
        /// Output features (rows).
        out: usize,
        /// Input features (columns).
        inp: usize,
        /// Bytes the shape needs.
        expected: usize,
        /// Bytes given.
        got: usize,
    },
    /// The dense values given do not number `out × inp`.
    #[error("a [{out}, {inp}] matrix needs {expected} values, got {got}")]
    WrongValueCount {
        /// Output features (rows).
        out: usize,
        /// Input features (columns).
        inp: usize,
        /// `out × inp`.
        expected: usize,
        /// Values given.
        got: usize,
    },
    /// A dense format where a ggml block format (Q4_0, Q4_1, Q8_0) is needed.
    #[error("{0:?} is not a ggml block format")]
    NotBlockFormat(WeightFormat),
}

/// A `[out, in]` weight matrix in panels of [`PANEL`] outputs (see the module docs).
#[derive(Debug, Clone)]
pub struct PackedMatrix {
    pub(super) format: WeightFormat,
    pub(super) out: usize,
    pub(super) inp: usize,
    pub(super) panels: usize,
    /// f32 weights, or the quant formats' scales `d`.
    pub(super) f32s: Vec<f32>,
    /// Q4_1's offsets `m` (same indexing as the scales).
    pub(super) offsets: Vec<f32>,
    /// bf16 / f16 bits.
    pub(super) halves: Vec<u16>,
    /// Quant bytes.
    pub(super) bytes: Vec<u8>,
}

impl PackedMatrix {
    fn empty(format: WeightFormat, out: usize, inp: usize) -> Self {
        PackedMatrix {
            format,
            out,
            inp,
            panels: out.div_ceil(PANEL),
            f32s: Vec::new(),
            offsets: Vec::new(),
            halves: Vec::new(),
            bytes: Vec::new(),
        }
    }

    /// Packs a row-major dense f32 `[out, in]` matrix.
    pub fn from_f32(out: usize, inp: usize, w: &[f32]) -> Result<Self, PackError> {
        check_values(out, inp, w.len())?;
        let mut m = Self::empty(WeightFormat::F32, out, inp);
        m.f32s = pack_dense(out, inp, w, 0.0);
        Ok(m)
    }

    /// Packs row-major bf16 bits (kept as bf16: half the memory a step reads).
    pub fn from_bf16(out: usize, inp: usize, w: &[bf16]) -> Result<Self, PackError> {
        check_values(out, inp, w.len())?;
        let bits: Vec<u16> = w.iter().map(|v| v.to_bits()).collect();
        let mut m = Self::empty(WeightFormat::Bf16, out, inp);
        m.halves = pack_dense(out, inp, &bits, 0);
        Ok(m)
    }

    /// Packs row-major f16 bits (kept as f16).
    pub fn from_f16(out: usize, inp: usize, w: &[f16]) -> Result<Self, PackError> {
        check_values(out, inp, w.len())?;
        let bits: Vec<u16> = w.iter().map(|v| v.to_bits()).collect();
        let mut m = Self::empty(WeightFormat::F16, out, inp);
        m.halves = pack_dense(out, inp, &bits, 0);
        Ok(m)
    }

    /// Repacks raw ggml block bytes (row-major `[out, in]`) of a quantised format.
    pub fn from_ggml(
        format: WeightFormat,
        out: usize,
        inp: usize,
        data: &[u8],
    ) -> Result<Self, PackError> {
        let block_bytes = match format {
            WeightFormat::Q4_0 => 2 + 16,
            WeightFormat::Q4_1 => 4 + 16,
            WeightFormat::Q8_0 => 2 + 32,
            _ => return Err(PackError::NotBlockFormat(format)),
        };
        if !inp.is_multiple_of(BLOCK) {
            return Err(PackError::RaggedBlocks { format, inp });
        }
        let blocks = inp / BLOCK;
        let expected = out * blocks * block_bytes;
        if data.len() != expected {
            return Err(PackError::WrongByteCount {
                format,
                out,
                inp,
                expected,
                got: data.len(),
            });
        }
        let mut m = Self::empty(format, out, inp);
        let slots = m.panels * blocks * PANEL;
        m.f32s = vec![0.0; slots];
        if format == WeightFormat::Q4_1 {
            m.offsets = vec![0.0; slots];
        }
        let vectors = if format == WeightFormat::Q8_0 { 32 } else { 16 };
        // Padding outputs keep quant 0, which Q4_0 reads as (0 − 8) · 0 = 0.
        m.bytes = vec![0; slots * vectors];
        let half = |b: &[u8]| f16::from_bits(u16::from_le_bytes([b[0], b[1]])).to_f32();
        for o in 0..out {
            let (p, lane) = (o / PANEL, o % PANEL);
            for b in 0..blocks {
                let blk = &data[(o * blocks + b) * block_bytes..][..block_bytes];
                let slot = (p * blocks + b) * PANEL;
                m.f32s[slot + lane] = half(&blk[0..2]);
                let quants = match format {
                    WeightFormat::Q4_1 => {
                        m.offsets[slot + lane] = half(&blk[2..4]);
                        &blk[4..]
                    }
                    _ => &blk[2..],
                };
                let base = slot * vectors;
                if format == WeightFormat::Q8_0 {
                    for (j, &q) in quants.iter().enumerate() {
                        m.bytes[base + j * PANEL + lane] = q;
                    }
                } else {
                    // ggml: byte j holds weight j (low nibble) and weight j + 16 (high).
                    let nibble = |k: usize| {
                        if k < 16 {
                            quants[k] & 0x0F
                        } else {
                            quants[k - 16] >> 4
                        }
                    };
                    for t in 0..16 {
                        m.bytes[base + t * PANEL + lane] = nibble(2 * t) | (nibble(2 * t + 1) << 4);
                    }
                }
            }
        }
        Ok(m)
    }

    /// How the weights are stored.
    pub fn format(&self) -> WeightFormat {
        self.format
    }

    /// Output features: the matrix's rows.
    pub fn out_features(&self) -> usize {
        self.out
    }

    /// Input features: the matrix's columns.
    pub fn in_features(&self) -> usize {
        self.inp
    }

    /// Number of [`PANEL`]-wide output panels.
    pub fn panels(&self) -> usize {
        self.panels
    }

    /// Bytes of weights (and scales) a full pass over the matrix reads.
    pub fn stored_bytes(&self) -> usize {
        self.f32s.len() * 4 + self.offsets.len() * 4 + self.halves.len() * 2 + self.bytes.len()
    }

    /// Quantisation blocks per panel row (`in / 32`).
    pub(super) fn blocks(&self) -> usize {
        self.inp / BLOCK
    }

    /// The f32 value of weight `(o, k)`, exactly as every kernel reads it.
    pub fn weight(&self, o: usize, k: usize) -> f32 {
        let (p, lane) = (o / PANEL, o % PANEL);
        match self.format {
            WeightFormat::F32 => self.f32s[(p * self.inp + k) * PANEL + lane],
            WeightFormat::Bf16 => {
                bf16::from_bits(self.halves[(p * self.inp + k) * PANEL + lane]).to_f32()
            }
            WeightFormat::F16 => {
                f16::from_bits(self.halves[(p * self.inp + k) * PANEL + lane]).to_f32()
            }
            WeightFormat::Q4_0 | WeightFormat::Q4_1 => {
                let (b, j) = (k / BLOCK, k % BLOCK);
                let slot = (p * self.blocks() + b) * PANEL;
                let byte = self.bytes[(slot * 16) + (j / 2) * PANEL + lane];
                let q = if j % 2 == 0 { byte & 0x0F } else { byte >> 4 };
                let d = self.f32s[slot + lane];
                if self.format == WeightFormat::Q4_0 {
                    (q as i32 - 8) as f32 * d
                } else {
                    q as f32 * d + self.offsets[slot + lane]
                }
            }
            WeightFormat::Q8_0 => {
                let (b, j) = (k / BLOCK, k % BLOCK);
                let slot = (p * self.blocks() + b) * PANEL;
                let q = self.bytes[slot * 32 + j * PANEL + lane] as i8;
                q as f32 * self.f32s[slot + lane]
            }
        }
    }

    /// A block format's unsigned code for weight `(o, k)`: the Q4 nibble, or the Q8_0
    /// byte plus 128 (see `int8` for how codes, scales and offsets give the weight).
    pub(super) fn block_code(&self, o: usize, k: usize) -> u8 {
        let (p, lane, b, j) = (o / PANEL, o % PANEL, k / BLOCK, k % BLOCK);
        let slot = (p * self.blocks() + b) * PANEL;
        match self.format {
            WeightFormat::Q8_0 => {
                (self.bytes[slot * 32 + j * PANEL + lane] as i8 as i16 + 128) as u8
            }
            _ => {
                let byte = self.bytes[(slot * 16) + (j / 2) * PANEL + lane];
                if j % 2 == 0 {
                    byte & 0x0F
                } else {
                    byte >> 4
                }
            }
        }
    }

    /// A block format's scale `d` for output `o`, block `b`.
    pub(super) fn block_scale(&self, o: usize, b: usize) -> f32 {
        self.f32s[(o / PANEL * self.blocks() + b) * PANEL + o % PANEL]
    }

    /// Q4_1's stored offset `m` for output `o`, block `b` (0 for the other formats).
    pub(super) fn block_offset(&self, o: usize, b: usize) -> f32 {
        if self.offsets.is_empty() {
            0.0
        } else {
            self.offsets[(o / PANEL * self.blocks() + b) * PANEL + o % PANEL]
        }
    }

    /// Output row `o`'s weights as f32, exactly as the kernels read them.
    pub fn dequantize_row(&self, o: usize, dst: &mut [f32]) {
        for (k, v) in dst.iter_mut().enumerate().take(self.inp) {
            *v = self.weight(o, k);
        }
    }

    /// The whole matrix as row-major f32 `[out, in]`.
    pub fn to_dense(&self) -> Vec<f32> {
        let mut w = vec![0f32; self.out * self.inp];
        for (o, row) in w.chunks_exact_mut(self.inp.max(1)).enumerate() {
            self.dequantize_row(o, row);
        }
        w
    }
}

fn check_values(out: usize, inp: usize, got: usize) -> Result<(), PackError> {
    if got != out * inp {
        return Err(PackError::WrongValueCount {
            out,
            inp,
            expected: out * inp,
            got,
        });
    }
    Ok(())
}

/// `[out, in]` row-major into `[panel][k][16]`, padding the last panel with `zero`.
fn pack_dense<T: Copy>(out: usize, inp: usize, w: &[T], zero: T) -> Vec<T> {
    let panels = out.div_ceil(PANEL);
    let mut packed = vec![zero; panels * inp * PANEL];
    for o in 0..out {
        let (p, lane) = (o / PANEL, o % PANEL);
        for k in 0..inp {
            packed[(p * inp + k) * PANEL + lane] = w[o * inp + k];
        }
    }
    packed
}
