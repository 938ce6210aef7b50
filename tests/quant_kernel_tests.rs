//! Our quantised matmul kernel against from-scratch references.
//!
//! - Dequantisation of each block format equals candle's own `dequantize` exactly.
//! - The matmul equals an f64 dot product of the dequantised weights with the
//!   activations (relative error 1e-5: f32 accumulation of 576-1536 terms).
//! - Batch invariance: a row's outputs are bit-identical alone and inside batches of
//!   any size and content, the property the engine's reproducibility rests on.

use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::{Device, Tensor};
use treegrpo::model::quant::QuantMatrix;

/// Small deterministic generator for test data.
struct Lcg(u64);
impl Lcg {
    fn next(&mut self) -> f32 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((self.0 >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }
    fn vec(&mut self, n: usize) -> Vec<f32> {
        (0..n).map(|_| self.next()).collect()
    }
}

fn quantized(dtype: GgmlDType, out: usize, inp: usize, seed: u64) -> (QTensor, QuantMatrix) {
    let w = Lcg(seed).vec(out * inp);
    let t = Tensor::from_vec(w, (out, inp), &Device::Cpu).unwrap();
    let q = QTensor::quantize(&t, dtype).unwrap();
    let m = QuantMatrix::from_qtensor(&q)
        .unwrap()
        .expect("format supported");
    (q, m)
}

const FORMATS: [GgmlDType; 3] = [GgmlDType::Q4_0, GgmlDType::Q4_1, GgmlDType::Q8_0];

#[test]
fn dequantisation_equals_candle_exactly() {
    for dtype in FORMATS {
        let (q, m) = quantized(dtype, 24, 96, 1);
        let reference = q
            .dequantize(&Device::Cpu)
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1::<f32>()
            .unwrap();
        let mut row = vec![0f32; 96];
        for o in 0..24 {
            m.dequantize_row(o, &mut row);
            assert_eq!(
                &row[..],
                &reference[o * 96..(o + 1) * 96],
                "{dtype:?} row {o}"
            );
        }
    }
}

#[test]
fn matmul_equals_f64_reference() {
    for dtype in FORMATS {
        for (out, inp, rows) in [(1, 32, 1), (17, 64, 3), (40, 576, 9), (33, 1536, 20)] {
            let (_, m) = quantized(dtype, out, inp, 7);
            let x = Lcg(99).vec(rows * inp);
            let y = m.matmul(&x, rows);
            let mut w = vec![0f32; inp];
            for o in 0..out {
                m.dequantize_row(o, &mut w);
                for r in 0..rows {
                    let exact: f64 = (0..inp).map(|i| w[i] as f64 * x[r * inp + i] as f64).sum();
                    let scale: f64 = (0..inp)
                        .map(|i| (w[i] as f64 * x[r * inp + i] as f64).abs())
                        .sum();
                    let got = y[r * out + o] as f64;
                    assert!(
                        (got - exact).abs() <= 1e-5 * scale.max(1.0),
                        "{dtype:?} {out}x{inp} row {r} out {o}: {got} vs {exact}"
                    );
                }
            }
        }
    }
}

#[test]
fn a_row_is_bit_identical_alone_and_in_any_batch() {
    for dtype in FORMATS {
        let (out, inp) = (48, 576);
        let (_, m) = quantized(dtype, out, inp, 3);
        let probe = Lcg(5).vec(inp);
        let alone = m.matmul(&probe, 1);
        let mut rng = Lcg(11);
        for (batch, at) in [(2, 0), (2, 1), (8, 5), (9, 8), (33, 17), (64, 63)] {
            let mut x = rng.vec(batch * inp);
            x[at * inp..(at + 1) * inp].copy_from_slice(&probe);
            let y = m.matmul(&x, batch);
            assert_eq!(
                &y[at * out..(at + 1) * out],
                &alone[..],
                "{dtype:?} batch {batch} row {at}"
            );
        }
    }
}
